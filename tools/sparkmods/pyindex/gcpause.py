"""The cyclic garbage collector paused while a batch of checks runs.

A check parses vLLM modules into ASTs and keeps them in the parse cache (resolve.py):
hundreds of thousands of tracked objects per release. safeparse pauses the collector while a tree
is built, but the new nodes still enter the youngest generation, so the next collections
traverse every one of them on their way to the oldest, and each full collection walks every
tree the cache holds. None of that frees anything: a tree has no reference cycles, and
refcounting frees it when the cache drops it (the figures: ci/bench/results/host-constants-any-cpu.md).

Pauses nest across threads (the matrix and the community judge check from pools): the
collector runs again when the last batch ends, and only if it was running when the first began.
It resumes without a collection: every object the batch left (the parse cache's trees among
them) is moved to the oldest generation first (gc.freeze, then gc.unfreeze), because otherwise
the first allocation after the pause traverses all of them as young objects (right after a
check's rows are done, freeing nothing). What became cyclic garbage meanwhile is collected by
the next full collection.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

_LOCK = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection inside the block (refcounting still frees everything acyclic)."""
    global _depth, _was_enabled
    with _LOCK:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _LOCK:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.freeze()  # resets the young generation's count ...
                gc.unfreeze()  # ... and hands everything to the oldest one
                gc.enable()
