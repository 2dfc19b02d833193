"""Process-wide fetch statistics, so `sparkmods check --json` can show what the network cost."""

from __future__ import annotations

import threading
from typing import Dict


class FetchStats:
    """Thread-safe counters for every source fetch (network requests, bytes, cache hits)."""

    _FIELDS = ("requests", "bytes", "cache_hits", "full_downloads")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._counts: Dict[str, int] = dict.fromkeys(self._FIELDS, 0)
            self._seconds = 0.0

    def add(self, *, requests: int = 0, nbytes: int = 0, cache_hits: int = 0,
            full_downloads: int = 0, seconds: float = 0.0) -> None:
        with self._lock:
            self._counts["requests"] += requests
            self._counts["bytes"] += nbytes
            self._counts["cache_hits"] += cache_hits
            self._counts["full_downloads"] += full_downloads
            self._seconds += seconds

    def snapshot(self) -> dict:
        """requests, bytes (response bodies), cache_hits, full_downloads, seconds (summed request time)."""
        with self._lock:
            out: dict = dict(self._counts)
            out["seconds"] = round(self._seconds, 3)
            return out


stats = FetchStats()
