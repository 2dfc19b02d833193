"""Read a loose unified diff named on the command line (check-patch, rebase-patch).

inputfile.read_text_file does the reading: a FIFO is refused without being opened, a binary,
non-UTF-8 or oversized file is one line naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, List

from sparkmods.errors import SparkmodsError
from sparkmods.gitdiff import Change, parse_git_diff, reverse_change
from sparkmods.inputfile import read_text_file
from sparkmods.runtime.udiff import FilePatch, PatchParseError, parse_patch, reverse

MAX_PATCH_BYTES = 64 * 1024 * 1024  # the largest real mod patch is a few hundred KB


def read_patch_file(path: Path, strip: int = 1, reversed_: bool = False) -> List[FilePatch]:
    """The file's patches (-p N as GNU patch strips; reversed_: as `patch -R` / `git apply -R`
    apply it, each diff undone, in the file's order); an unreadable, non-regular, binary or
    malformed file is one line naming it."""
    patches = _parsed(path, strip, parse_patch)
    return [reverse(fp) for fp in patches] if reversed_ else patches


def read_diff_file(path: Path, strip: int = 1, reversed_: bool = False) -> List[Change]:
    """The file's changes, git's extended headers included (renames, copies, modes, binary
    changes, index lines: what `git apply --binary` reads, gitdiff.py); otherwise as
    read_patch_file."""
    changes = _parsed(path, strip, parse_git_diff)
    return [reverse_change(c) for c in changes] if reversed_ else changes


def _parsed(path: Path, strip: int, parse: Callable[..., list]) -> list:
    """parse(the file's text, strip=strip); every problem one line naming the file."""
    if strip < 0:
        raise SparkmodsError(f"{path}: -p {strip}: the strip level is a count of path components (0 or more)")
    text = read_text_file(path, MAX_PATCH_BYTES, "want a unified diff")
    try:
        return parse(text, strip=strip)
    except PatchParseError as exc:
        raise SparkmodsError(f"{path}: {exc}") from None
