"""The runtime's changes to the disk, each one a counted step so a test can stop it at any of them.

A file is never written in place: its bytes go to a temp name beside it, and one rename puts
them there, so any reader, and any run killed at any instant, finds either the old file or the
new one. Every step that changes the disk goes through `step()`, which is also the
fault-injection hook:

  SPARKMODS_FAULT_AFTER=N    stop the process right before its (N+1)-th step (counting from 0)
  SPARKMODS_FAULT_SIGNAL=S   KILL (default: os._exit(137), what SIGKILL does to a process),
                             INT or TERM (the process sends itself that signal, which the
                             runtime then handles as it handles Ctrl-C or `docker stop`)

Temp files have fixed names (`.NAME.sparkmods-tmp` beside NAME) so the journal can list them
before they exist and a later run can remove every one of them.

Nothing is fsynced: the order of the writes (journal, copies, staged bytes, renames, journal
removed) is what survives a killed process, and every later run verifies by sha256 what it
relies on, so a power cut before writeback ends in a refusal, never in wrong bytes.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
from hashlib import sha256
from typing import Callable, List, Optional, Union

StrPath = Union[str, "os.PathLike[str]"]  # host callers pass pathlib paths; the runtime uses str
TMP_SUFFIX = ".sparkmods-tmp"  # names the runtime's temp files end with
# The state folder in site-packages, its journal and its lock (journal.py, lock.py, stamp.py).
STATE_DIR, JOURNAL_NAME, LOCK_NAME = ".sparkmods", ".journal.json", ".lock"

__all__ = ["TMP_SUFFIX", "FAULT_AFTER", "FAULT_SIGNAL", "arm", "arm_from_env", "on_step", "step", "temp_path",
           "digest", "read_regular", "write_file", "stage", "publish", "remove", "remove_tree", "make_dirs",
           "stray_temps", "umask", "umasked"]

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


def temp_path(path: StrPath) -> str:
    """The one temp name used for `path` (hidden, same folder, so the rename is atomic)."""
    folder, name = os.path.split(os.fspath(path))
    return os.path.join(folder, f".{name}{TMP_SUFFIX}")


def digest(path: StrPath) -> Optional[str]:
    """sha256 of a regular file's bytes; None when nothing (or no regular file) is there."""
    data = read_regular(path)
    return None if data is None else sha256(data).hexdigest()


def read_regular(path: StrPath) -> Optional[bytes]:
    """The bytes of a regular file (symlinks followed); None when absent or not a regular file."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as fh:
            return fh.read()
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


def _named(exc: OSError, path: StrPath) -> OSError:
    """The same error, naming the file (a full disk must say which write failed)."""
    return OSError(exc.errno, exc.strerror or str(exc), os.fspath(path))


def make_dirs(path: StrPath) -> None:
    """mkdir -p, one step per folder it creates; 0755 at most, whatever the umask (the state
    folder must not be writable by others: lock.trust)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return
    make_dirs(os.path.dirname(path))
    step()
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
    except OSError as exc:
        raise _named(exc, path) from None


def stage(path: StrPath, data: bytes, mode: int) -> str:
    """Write data to path's temp name; returns it. Nothing is published yet."""
    make_dirs(os.path.dirname(os.fspath(path)))
    tmp = temp_path(path)
    step()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    except OSError as exc:
        try:
            os.unlink(tmp)  # a half-written temp (full disk) would only hold on to the space
        except OSError:
            pass
        raise _named(exc, path) from None
    return tmp


def publish(tmp: StrPath, path: StrPath) -> None:
    """Rename a staged temp over path."""
    step()
    try:
        os.replace(tmp, path)
    except OSError as exc:
        raise _named(exc, path) from None


def write_file(path: StrPath, data: bytes, mode: int = 0o644) -> None:
    """Replace path with data atomically (temp, then rename)."""
    publish(stage(path, data, mode), path)


def remove(path: StrPath) -> None:
    """Remove a file if it is there."""
    if not os.path.lexists(path):
        return
    step()
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _named(exc, path) from None


def remove_tree(path: StrPath) -> None:
    """Remove a folder and everything in it."""
    if not os.path.lexists(path):
        return
    step()
    try:
        shutil.rmtree(path)
    except OSError as exc:
        raise _named(exc, exc.filename or path) from None


def stray_temps(folder: StrPath, recursive: bool = False) -> List[str]:
    """Temp files of ours (`.*.sparkmods-tmp`, any run, any runtime version) in folder."""
    if not os.path.isdir(folder):
        return []
    if recursive:  # symlinked folders are not entered
        found = [os.path.join(top, name) for top, _, names in os.walk(folder) for name in names]
    else:
        found = [os.path.join(folder, name) for name in os.listdir(folder)]
    return sorted(p for p in found if _is_temp(os.path.basename(p)) and not os.path.isdir(p))


def _is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(TMP_SUFFIX)
