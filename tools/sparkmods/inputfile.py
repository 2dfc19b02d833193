"""Read a small input file named by the user (a patch, a recipe) without ever blocking on it.

The path is stat()ed before it is opened: opening a FIFO blocks until a writer appears (a
hang, not an error), and a directory, a device or a huge file is no input either. The open
itself is O_NONBLOCK and checked again with fstat, so a file swapped for a FIFO in between
cannot block us. Only a regular file of at most `limit` bytes, UTF-8 without NUL bytes, is
returned as text; everything else is one SparkmodsError line naming the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sparkmods.errors import SparkmodsError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _check_regular(path: Path, info: os.stat_result, limit: int, want: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise SparkmodsError(f"{path}: {file_kind(info.st_mode)}, not a regular file ({want})")
    if info.st_size > limit:
        raise SparkmodsError(f"{path}: {info.st_size} bytes, more than the {limit} allowed ({want})")


def read_text_file(path: Path, limit: int, want: str) -> str:
    """The file's text; `want` says what the file should be, e.g. "want a unified diff"."""
    try:
        _check_regular(path, os.stat(path), limit, want)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with open(fd, "rb") as fh:
            _check_regular(path, os.fstat(fd), limit, want)
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise SparkmodsError(f"{path}: {exc.strerror}") from None
    if len(raw) > limit:  # grew after the stat
        raise SparkmodsError(f"{path}: more than the {limit} bytes allowed ({want})")
    nul = raw.find(b"\0")
    if nul >= 0:
        raise SparkmodsError(f"{path}: a binary file (NUL byte at offset {nul}; {want})")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SparkmodsError(f"{path}: not UTF-8 text (byte {exc.start}; {want})") from None
