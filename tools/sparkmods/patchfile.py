"""Read a loose unified diff named on the command line (check-patch, rebase-patch).

inputfile.read_text_file does the reading: a FIFO is refused without being opened, a binary,
non-UTF-8 or oversized file is one line naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

from sparkmods.errors import SparkmodsError
from sparkmods.inputfile import read_text_file
from sparkmods.runtime.udiff import FilePatch, PatchParseError, parse_patch

MAX_PATCH_BYTES = 64 * 1024 * 1024  # the largest real mod patch is a few hundred KB


def read_patch_file(path: Path, strip: int = 1) -> List[FilePatch]:
    """The file's patches; an unreadable, non-regular, binary or malformed file is one line naming it."""
    text = read_text_file(path, MAX_PATCH_BYTES, "want a unified diff")
    try:
        return parse_patch(text, strip=strip)
    except PatchParseError as exc:
        raise SparkmodsError(f"{path}: {exc}") from None
