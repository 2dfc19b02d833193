"""The collector pause (gcpause.py) ends without a collection of what the batch left."""

from __future__ import annotations

import gc

from sparkmods.pyindex import gcpause


def test_the_first_allocations_after_a_pause_collect_nothing():
    """What a batch left (parsed trees) is not traversed as young objects right after it."""
    assert gc.isenabled()
    collections = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    try:
        with gcpause.paused():
            kept = [[i] for i in range(50_000)]  # tracked containers, far past the young threshold
            gc.callbacks.append(seen)  # before the pause ends: its own exit allocates too
        fresh = [[i] for i in range(100)]  # fewer than the young generation's threshold
    finally:
        gc.callbacks.remove(seen)
    assert gc.isenabled() and collections == []
    assert len(kept) + len(fresh) == 50_100
