"""One lock per vLLM tree, so overlapping run.sh / `sparkmods apply` runs take turns.

Without it a revert and an apply started together both succeed and the tree ends unpatched
although the apply said "already applied". The lock is an flock on
`<site-packages>/.sparkmods/.lock`: the kernel drops it when its holder dies, so a killed run
never leaves it held. A waiting run says so once and gives up after a bounded time.

Before the lock is taken, the state folder is checked (`trust`): what it holds (a journal,
saved originals, state.json) decides what is written into vLLM, so state another user could
have written is never read. The runtime creates it with modes no umask widens (fsops).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from . import fsops
from .fsops import LOCK_NAME, StrPath

__all__ = ["LOCK_NAME", "LOCK_TIMEOUT", "DEFAULT_TIMEOUT_S", "LockTimeout", "ReadOnlyTree", "UntrustedState",
           "tree_lock", "timeout_s", "trust"]

LOCK_TIMEOUT = "SPARKMODS_LOCK_TIMEOUT"
DEFAULT_TIMEOUT_S = 120.0
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


class LockTimeout(RuntimeError):
    """Another run held the tree's lock for longer than we wait."""


class ReadOnlyTree(RuntimeError):
    """The state folder cannot be created or written (a read-only vLLM)."""


class UntrustedState(RuntimeError):
    """Something in the state folder could have been written by another user."""


def trust(state_root: StrPath) -> None:
    """Refuse (UntrustedState, one line) a state folder holding a symbolic link, anything
    writable by its group or by others, or anything owned by someone other than this user,
    root, or the owner of the folder it is in (site-packages: who installed vLLM)."""
    root = os.fspath(state_root)
    try:
        owners = {0, os.getuid(), os.stat(os.path.dirname(root)).st_uid}
        _trusted(root, os.lstat(root), owners)
    except FileNotFoundError:
        return
    for top, folders, files in os.walk(root):
        for name in folders + files:
            path = os.path.join(top, name)
            try:
                _trusted(root, os.lstat(path), owners, path)
            except FileNotFoundError:
                continue


def _trusted(root: str, st: os.stat_result, owners: "set[int]", path: Optional[str] = None) -> None:
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        why = "a symbolic link"
    elif st.st_uid not in owners:
        why = f"owned by uid {st.st_uid}, neither this user, root nor the owner of {os.path.dirname(root)}"
    elif mode & 0o022:
        why = f"writable by {'all users' if mode & 0o002 else 'its group'} (mode {stat.S_IMODE(mode):04o})"
    else:
        return
    raise UntrustedState(
        f"{path or root} is {why}: another user could have planted a journal or saved files in {root}, so "
        f"nothing is read from it and nothing was changed; if you trust it, make it yours and not writable "
        f"by others (chown -R {os.getuid()} {root}; chmod -R go-w {root}), else reinstall vLLM and delete it")


def timeout_s() -> float:
    """$SPARKMODS_LOCK_TIMEOUT seconds (default 120); an unreadable value is an input error."""
    raw = os.environ.get(LOCK_TIMEOUT, "")
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"{LOCK_TIMEOUT}={raw!r}: give the seconds to wait for another run, e.g. 120")
    return value


@contextmanager
def tree_lock(state_root: StrPath, say: Callable[[str], None], required: bool = True) -> Iterator[None]:
    """Hold the tree's lock for the body; waits up to timeout_s() for another holder.

    On a read-only tree the lock cannot be created: ReadOnlyTree, or, when not `required`
    (a dry run, which nobody else can disturb there either), the body runs unlocked.
    """
    path = os.path.join(state_root, LOCK_NAME)
    trust(state_root)
    fd = _open(state_root, path, required)
    if fd is None:
        yield
        return
    try:
        _acquire(fd, path, timeout_s(), say)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _open(state_root: StrPath, path: str, required: bool) -> Optional[int]:
    """The lock file's descriptor; None on a read-only tree when the lock is not required."""
    try:
        fsops.make_dirs(state_root)
        return os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as exc:
        if exc.errno not in _READ_ONLY:
            raise
        if required:
            raise ReadOnlyTree(f"{exc.filename or path}: {exc.strerror}") from None
        return None


def _acquire(fd: int, path: str, limit: float, say: Callable[[str], None]) -> None:
    deadline = time.monotonic() + limit
    delay = 0.02
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
        if time.monotonic() >= deadline:
            raise LockTimeout(
                f"another sparkmods run has held {path} for over {limit:g} s; nothing was changed "
                f"(wait for it, or raise {LOCK_TIMEOUT})")
        if not told:
            say(f"waiting for another sparkmods run on this vLLM (lock {path}, up to {limit:g} s)")
            told = True
        time.sleep(delay)
        delay = min(delay * 2, 0.25)
