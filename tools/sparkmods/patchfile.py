"""Read a loose unified diff named on the command line (check-patch, rebase-patch).

The path is stat()ed before it is opened: opening a FIFO blocks until a writer appears (a
hang, not an error), and a device or a huge file is no patch either. Only a regular file of
at most MAX_PATCH_BYTES, UTF-8 and without NUL bytes, reaches the parser.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import List

from sparkmods.errors import SparkmodsError
from sparkmods.runtime.udiff import FilePatch, PatchParseError, parse_patch

MAX_PATCH_BYTES = 64 * 1024 * 1024  # the largest real mod patch is a few hundred KB

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _check_regular(path: Path, info: os.stat_result, want: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise SparkmodsError(f"{path}: {_kind(info.st_mode)}, not a regular file ({want})")
    if info.st_size > MAX_PATCH_BYTES:
        raise SparkmodsError(f"{path}: {info.st_size} bytes, more than the {MAX_PATCH_BYTES} a patch "
                             f"may have ({want})")


def read_patch_file(path: Path, strip: int = 1) -> List[FilePatch]:
    """The file's patches; an unreadable, non-regular, binary or malformed file is one line naming it."""
    want = "want a unified diff"
    try:
        _check_regular(path, os.stat(path), want)
        # O_NONBLOCK and fstat: a file swapped for a FIFO after the stat still cannot block us.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with open(fd, "rb") as fh:
            _check_regular(path, os.fstat(fd), want)
            raw = fh.read(MAX_PATCH_BYTES + 1)
    except OSError as exc:
        raise SparkmodsError(f"{path}: {exc.strerror}") from None
    nul = raw.find(b"\0")
    if nul >= 0:
        raise SparkmodsError(f"{path}: a binary file (NUL byte at offset {nul}; {want})")
    try:
        return parse_patch(raw.decode("utf-8"), strip=strip)
    except UnicodeDecodeError as exc:
        raise SparkmodsError(f"{path}: not UTF-8 text (byte {exc.start}; {want})") from None
    except PatchParseError as exc:
        raise SparkmodsError(f"{path}: {exc}") from None
