"""Write a whole file atomically with the mode it ought to have: the one place the host tools
replace a file (launch scripts, matrix outputs, rebased patches, mod.toml, cache entries,
downloaded wheels, checkpoint indexes and their backups).

The bytes go to a temp file beside the target, which is then renamed over it, so a reader
(or a kill) never sees half a file. The temp file is created with open(2)'s mode, which the
kernel narrows by the umask, instead of tempfile.mkstemp's 0600: a file that replaces
another keeps the mode it had (a 0644 mod.toml stays 0644), a new one gets what the umask
gives, as `>` in a shell would. `check_target` refuses, before any work, an output path
that could never be written (a folder, a missing parent) or should not be renamed over (a
device, a FIFO), and every failure is one line naming the path (SparkmodsError), never a
traceback. `replacing` is the same step for content written piece by piece (a download, a
copy); `durable` adds the fsyncs a file other programs read after a power cut needs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Union

from sparkmods.errors import SparkmodsError
from sparkmods.inputfile import file_kind

_NEW_FILE, _NEW_EXECUTABLE = 0o666, 0o777
_TRIES = 100


def check_target(path: Path, flag: str) -> None:
    """Refuse an output path no write could ever succeed at, or should not (`flag` names the
    option): a folder, a missing folder, or what is no regular file (a device, a FIFO, a
    link to one such as /dev/stdout), which a rename would replace rather than write to."""
    if path.is_dir():
        raise SparkmodsError(f"{flag} {path}: a folder; name the file to write")
    folder = path.expanduser().absolute().parent
    if not folder.is_dir():
        raise SparkmodsError(f"{flag} {path}: folder {folder} does not exist")
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # nothing there (or a dangling link, which the rename replaces)
    if not stat.S_ISREG(mode):
        raise SparkmodsError(f"{flag} {path}: {file_kind(mode)}, not a regular file; name a file to write "
                             "(without -o the output goes to standard output)")


def temp_name(path: Path) -> Path:
    """A fresh hidden name beside path (same folder, so the rename is atomic): `.NAME.<12 hex>.tmp`,
    the form checkpoint/fileops.remove_stale_temps finds after a killed run."""
    return path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")


def _open_temp(path: Path, mode: int) -> "tuple[int, Path]":
    """(fd, name) of a new temp file beside path, created O_EXCL with `mode` less the umask."""
    for _ in range(_TRIES):
        tmp = temp_name(path)
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temp name beside {path}")


def _kept_mode(path: Path, executable: bool) -> Optional[int]:
    """The permission bits of the regular file being replaced (with x wherever it has r when
    the new content must run; set-id bits are not carried over), or None when there is none."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    mode = info.st_mode & 0o777
    return mode | (mode & 0o444) >> 2 if executable else mode


def write_atomic(path: Path, data: Union[bytes, str], *, mode: Optional[int] = None,
                 executable: bool = False) -> None:
    """Replace path with data (str is written as UTF-8). `mode` forces an exact mode (what
    git tracks, a private cache entry); without it the file keeps the mode of the one it
    replaces, or a new one follows the umask (executable: as a new script would)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        there = os.lstat(path).st_mode
    except OSError:
        there = None
    if there is not None and not (stat.S_ISREG(there) or stat.S_ISLNK(there) or stat.S_ISDIR(there)):
        raise SparkmodsError(f"{path}: {file_kind(there)}, not a regular file; not replacing it")
    try:
        with replacing(path, mode=mode, executable=executable) as fh:
            fh.write(raw)
    except OSError as exc:
        why = "a folder" if path.is_dir() else exc.strerror or str(exc)
        raise SparkmodsError(f"{path}: cannot write it ({why})") from None


@contextlib.contextmanager
def replacing(path: Path, *, mode: Optional[int] = None, executable: bool = False,
              durable: bool = False) -> Iterator[BinaryIO]:
    """A new file beside path, open for writing (its name: the handle's `name`), renamed over
    path when the block ends, removed when it raises. Modes as write_atomic's; durable: the
    file and then its folder are fsynced, so a power cut leaves the old file or the new one."""
    kept = _kept_mode(path, executable) if mode is None else mode
    fd, tmp = _open_temp(path, _NEW_EXECUTABLE if executable else _NEW_FILE)
    try:
        with open(tmp, "wb", opener=lambda _name, _flags: fd) as fh:  # fh.name: the temp path
            if kept is not None:
                os.fchmod(fh.fileno(), kept)
            yield fh
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
        if durable:
            _fsync_folder(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EROFS):  # a folder some filesystems cannot sync
            raise
    finally:
        os.close(fd)


def write_into(path: Path, data: Union[bytes, str], *, mode: Optional[int] = None) -> None:
    """write_atomic, creating the folders path needs first (a new variant's patches/<label>/,
    a cache entry's folder)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SparkmodsError(f"{path.parent}: cannot create the folder ({exc.strerror})") from None
    write_atomic(path, data, mode=mode)
