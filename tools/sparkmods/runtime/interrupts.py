"""SIGINT and SIGTERM during a change to vLLM: noticed only between steps, handled as a failure.

Why not a Python signal handler: a handler raises at any bytecode, also inside the code that
rolls back, and SIGTERM (what `docker stop` sends) kills the process by default wherever it
is. Instead, while vLLM's files are being changed the two signals are blocked; every disk
step (fsops.step) polls for one pending and raises `Interrupted` there, so the failure path
(roll back, originals kept until the rollback is complete) always starts at a step boundary.
While `shielded()` code runs (a rollback, a recovery) nothing is raised; a signal that came
meanwhile is delivered once the tree is consistent again. Outside those sections `handled()`
turns both signals into the same exception (SIGTERM would otherwise end the run silently).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

from . import fsops

__all__ = ["Interrupted", "handled", "deferred", "shielded", "poll", "exit_code"]

_NAMES = {int(signal.SIGINT): "SIGINT", int(signal.SIGTERM): "SIGTERM"}
_SIGNALS = set(_NAMES)
_CAN_BLOCK = hasattr(signal, "pthread_sigmask") and hasattr(signal, "sigtimedwait")
_state = {"blocked": 0, "shield": 0}


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived while vLLM was being changed (BaseException: like Ctrl-C)."""

    def __init__(self, signum: int, during_change: bool) -> None:
        super().__init__(_NAMES[signum])
        self.signum = signum
        self.during_change = during_change  # raised at a disk step of a change (else: between changes)
        self.completed = False  # set when the change was past rolling back and was finished


def exit_code(signum: int) -> int:
    """The shell's convention: 128 + signal number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + signum


def poll() -> None:
    """Raise Interrupted if SIGINT or SIGTERM is pending (and we are not shielded)."""
    if not _state["blocked"] or _state["shield"]:
        return
    pending = signal.sigpending() & _SIGNALS
    if pending:
        signum = min(pending)
        signal.sigtimedwait({signum}, 0)  # consume it: it is handled here, not again later
        raise Interrupted(signum, during_change=True)


def _in_main_thread() -> bool:
    """Whether this is the main thread, the one Python runs signal handlers in."""
    return threading.current_thread() is threading.main_thread()


def _raise(signum: int, frame: object) -> None:
    raise Interrupted(signum, during_change=False)


@contextmanager
def handled() -> Iterator[None]:
    """SIGINT and SIGTERM raise Interrupted (in the main thread; elsewhere nothing changes)."""
    previous = {signum: signal.signal(signum, _raise) for signum in _SIGNALS} if _in_main_thread() else {}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def deferred() -> Iterator[None]:
    """Block SIGINT/SIGTERM in the body; they surface through poll() at disk steps."""
    if not (_CAN_BLOCK and _in_main_thread()):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    _state["blocked"] += 1
    try:
        yield
    finally:
        _state["blocked"] -= 1
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextmanager
def shielded() -> Iterator[None]:
    """No Interrupted inside: for the code that makes the tree consistent again."""
    _state["shield"] += 1
    try:
        yield
    finally:
        _state["shield"] -= 1


fsops.on_step(poll)
