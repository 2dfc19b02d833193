"""Durable filesystem steps, each one counted so a test can stop the runtime at any of them.

A crash-safe apply needs every new file's bytes on disk before the rename that publishes it,
and the folder fsynced after the rename, or a power cut can publish an empty file. Every
step that changes the disk goes through `step()`, which is also the fault-injection hook:

  SPARKMODS_FAULT_AFTER=N    stop the process right before its (N+1)-th step (counting from 0)
  SPARKMODS_FAULT_SIGNAL=S   KILL (default: os._exit(137), what SIGKILL does to a process),
                             INT or TERM (the process sends itself that signal, which the
                             runtime then handles as it handles Ctrl-C or `docker stop`)

Temp files have fixed names (`.NAME.sparkmods-tmp` beside NAME) so the journal can list them
before they exist and a later run can remove every one of them.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import signal
import stat
from pathlib import Path
from typing import Callable, List, Optional

from .engine import TMP_SUFFIX

__all__ = ["TMP_SUFFIX", "FAULT_AFTER", "FAULT_SIGNAL", "arm", "arm_from_env", "on_step", "step", "temp_path",
           "digest", "read_regular", "write_file", "stage", "publish", "remove", "remove_tree", "fsync_dir",
           "make_dirs", "stray_temps", "umask", "umasked"]

FAULT_AFTER = "SPARKMODS_FAULT_AFTER"
FAULT_SIGNAL = "SPARKMODS_FAULT_SIGNAL"
_SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM}

_count = 0
_limit: Optional[int] = None
_kind = "KILL"
_hooks: List[Callable[[], None]] = []


def arm(limit: Optional[int], kind: str = "KILL") -> None:
    """Fault after `limit` more steps (None disarms); kind is KILL, INT or TERM."""
    global _count, _limit, _kind
    if kind not in ("KILL",) + tuple(_SIGNALS):
        raise ValueError(f"{FAULT_SIGNAL}={kind!r}: use KILL, INT or TERM")
    _count, _limit, _kind = 0, limit, kind


def arm_from_env() -> None:
    """Arm the hook from SPARKMODS_FAULT_AFTER / SPARKMODS_FAULT_SIGNAL (tests and ci/bench only)."""
    value = os.environ.get(FAULT_AFTER)
    if value:
        arm(int(value), os.environ.get(FAULT_SIGNAL, "KILL").upper())


def on_step(hook: Callable[[], None]) -> None:
    """Run hook at every step (interrupts.py polls for pending signals there)."""
    _hooks.append(hook)


def step() -> None:
    """Called right before every change to the disk."""
    global _count, _limit
    if _limit is not None and _count >= _limit:
        _limit = None
        if _kind == "KILL":
            os._exit(137)
        os.kill(os.getpid(), _SIGNALS[_kind])
    _count += 1
    for hook in _hooks:
        hook()


def temp_path(path: Path) -> Path:
    """The one temp name used for `path` (hidden, same folder, so the rename is atomic)."""
    return path.with_name(f".{path.name}{TMP_SUFFIX}")


def digest(path: Path) -> Optional[str]:
    """sha256 of a regular file's bytes; None when nothing (or no regular file) is there."""
    data = read_regular(path)
    return None if data is None else hashlib.sha256(data).hexdigest()


def read_regular(path: Path) -> Optional[bytes]:
    """The bytes of a regular file (symlinks followed); None when absent or not a regular file."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        return path.read_bytes()
    except FileNotFoundError:
        return None


def umask() -> int:
    """The process umask, read without changing it where Linux shows it (/proc/self/status)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # older kernels: the only way to read it is to set it (single-threaded here)
    os.umask(mask)
    return mask


def umasked(mode: int) -> int:
    """The permission bits a new copy gets: mode filtered by the umask, no setuid/setgid/sticky.

    What `cp` gives a new file: an installed template must be readable by whoever runs vLLM
    when the umask allows it, and never more open than the umask allows.
    """
    return mode & 0o777 & ~umask()


def _named(exc: OSError, path: Path) -> OSError:
    """The same error, naming the file (a full disk must say which write failed)."""
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


def fsync_dir(path: Path) -> None:
    """Make renames and removals inside `path` durable."""
    step()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EROFS):  # some filesystems cannot sync a folder
            raise _named(exc, path) from None
    finally:
        os.close(fd)


def make_dirs(path: Path) -> None:
    """mkdir -p, with each new folder made durable in its parent."""
    if path.is_dir():
        return
    make_dirs(path.parent)
    step()
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise _named(exc, path) from None
    fsync_dir(path.parent)


def stage(path: Path, data: bytes, mode: int) -> Path:
    """Write data, fsynced, to path's temp name; returns it. Nothing is published yet."""
    make_dirs(path.parent)
    tmp = temp_path(path)
    step()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        try:
            os.unlink(tmp)  # a half-written temp (full disk) would only hold on to the space
        except OSError:
            pass
        raise _named(exc, path) from None
    return tmp


def publish(tmp: Path, path: Path) -> None:
    """Rename a staged temp over path and make that durable."""
    step()
    try:
        os.replace(tmp, path)
    except OSError as exc:
        raise _named(exc, path) from None
    fsync_dir(path.parent)


def write_file(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace path with data atomically and durably (temp, fsync, rename, fsync folder)."""
    publish(stage(path, data, mode), path)


def remove(path: Path) -> None:
    """Remove a file if it is there, durably."""
    if not os.path.lexists(path):
        return
    step()
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _named(exc, path) from None
    fsync_dir(path.parent)


def remove_tree(path: Path) -> None:
    """Remove a folder and everything in it, durably."""
    if not os.path.lexists(path):
        return
    step()
    try:
        shutil.rmtree(path)
    except OSError as exc:
        raise _named(exc, Path(exc.filename or path)) from None
    fsync_dir(path.parent)


def stray_temps(folder: Path, recursive: bool = False) -> List[Path]:
    """Temp files of ours (`.*.sparkmods-tmp`, any run, any runtime version) in folder."""
    if not folder.is_dir():
        return []
    pattern = f".*{TMP_SUFFIX}"
    return sorted(folder.rglob(pattern) if recursive else folder.glob(pattern))
