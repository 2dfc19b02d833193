"""Check slots: at most CHECK_SLOTS threads of the process run checks at once, and a thread
that waits for the network meanwhile lends its slot out.

The checks are CPU-bound under one GIL, so more checking threads add only switching; the
other sources in flight (batch.SOURCE_JOBS; the figures: ci/bench/results/host-constants-any-cpu.md)
fetch what their checks will read instead, and each check finishes sooner, so the next sources
start fetching sooner. A check that reads a member no hint brought (sources/siblings.py) waits a round trip for it, once per
module of an import chain; holding its slot meanwhile would idle the CPU while sources that
are fetched and ready wait for one.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

CHECK_SLOTS = 3
_slots = threading.BoundedSemaphore(CHECK_SLOTS)
_held = threading.local()


@contextlib.contextmanager
def checking() -> Iterator[None]:
    """Hold a slot for the block (waiting for one first)."""
    with _slots:
        _held.slot = True
        try:
            yield
        finally:
            _held.slot = False


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Around a wait for the network: the calling thread's slot, when it holds one, is free
    for another check meanwhile, and taken back (waiting for it) after."""
    if not getattr(_held, "slot", False):
        yield
        return
    _slots.release()
    try:
        yield
    finally:
        _slots.acquire()
