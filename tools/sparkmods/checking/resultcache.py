"""Check results kept on disk and reused: a row is a pure function of its inputs, so the same
inputs need not be checked twice.

A row (one mod or loose patch on one vLLM) depends on exactly:
  subject  the mod's fingerprint (checking/fingerprints.py) or the patch file's bytes;
  source   what the vLLM's bytes are: a wheel's index sha256 together with the digest of the
           central directory the cache entry recorded (wheelentry.Identity: what was really
           read, CRC-32 of every member included), or a git tree's object id;
  checker  the drift-check fingerprint the matrix records (fingerprints.checker_fingerprint);
  code     the host code that makes the rest of the decision (runtime/, batch.py, the patch
           reader; fingerprints.code_fingerprint), which a mod's own runtime copy covers only once `sparkmods sync` ran;
  python   the interpreter's minor version (what `ast` accepts decides `syntax` findings).
Sources whose bytes have no such name (dir:, wheel:PATH, image:) are always checked.

Entries live in one folder, <cache>/results-v2/, one JSON file per key, written atomically
(no subfolders: a cold check writes an entry per mod and release, and a folder costs more to
create than a file); a file that is unreadable, names another key, or does not decode to a well-formed result is a miss.
The folder is bounded: past MAX_ENTRIES the least recently used entries go.
`--no-cache` (ResultCache(reuse=False)) checks every row again and stores the fresh results.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from sparkmods.checking.fingerprints import checker_fingerprint, code_fingerprint
from sparkmods.checking.rows import result_from_dict
from sparkmods.errors import SparkmodsError
from sparkmods.runtime.modcheck import ModResult
from sparkmods.sources.cache import cache_root, read_bytes, write_atomic

SCHEMA = 1
MAX_ENTRIES = 20_000  # a few KB each; a matrix run stores one per mod and release


@dataclass
class Counts:
    """What one command's rows came from: reused, checked and stored, or not cacheable."""

    reused: int = 0
    checked: int = 0
    uncacheable: int = 0

    def to_dict(self) -> dict:
        return {"reused": self.reused, "checked": self.checked, "not_cacheable": self.uncacheable}


class ResultCache:
    """The results folder, as one command uses it (reuse=False: store, never read)."""

    def __init__(self, reuse: bool = True, root: Optional[Path] = None) -> None:
        self.reuse = reuse
        self._root = root
        self.counts = Counts()
        self._lock = threading.Lock()
        self._pruned = False

    @property
    def root(self) -> Path:
        """<cache>/results-v2, the cache folder read when used (tests and users set it late)."""
        return (self._root or cache_root()) / "results-v2"

    def key(self, subject: str, source: Any) -> Optional[dict]:
        """Everything the row is a function of, or None when the source's bytes have no name."""
        named = getattr(source, "content_key", None)  # duck-typed sources without it: never stored
        content = named() if named is not None else None
        if content is None:
            return None
        return {"schema": SCHEMA, "subject": subject, "source": content, "vllm": source.version,
                "checker": checker_fingerprint(), "code": code_fingerprint(), "python": "{}.{}".format(*sys.version_info[:2])}

    def _path(self, key: dict) -> Path:
        name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
        return self.root / f"{name}.json"

    def get(self, subject: str, source: Any, mod: str) -> Optional[ModResult]:
        """The stored result of `mod` on source, or None (then the caller checks and put()s)."""
        if not self.reuse:
            return None
        key = self.key(subject, source)
        if key is None:
            return None
        path = self._path(key)
        found = _decode(read_bytes(path), key, mod, source.version)
        if found is not None:
            self._count(reused=1)
            try:
                os.utime(path)  # recently used: the last to be pruned
            except OSError:
                pass
        return found

    def put(self, subject: str, source: Any, result: ModResult) -> None:
        """Store a freshly checked result (under the key its source has now that it was read)."""
        key = self.key(subject, source)
        if key is None:
            self._count(uncacheable=1)
            return
        self._count(checked=1)
        entry = {"key": key, "result": result.to_dict()}
        try:
            write_atomic(self._path(key), json.dumps(entry, sort_keys=True).encode("utf-8"))
        except (OSError, SparkmodsError):
            return  # a read-only or full cache slows later runs down, it is no error
        self._prune_once()

    def _count(self, **delta: int) -> None:
        with self._lock:
            for name, n in delta.items():
                setattr(self.counts, name, getattr(self.counts, name) + n)

    def _prune_once(self) -> None:
        """After this command's first write: drop the least recently used entries past the bound."""
        with self._lock:
            if self._pruned:
                return
            self._pruned = True
        entries = []
        for entry in os.scandir(self.root):
            try:
                entries.append((entry.stat().st_mtime, entry.path))
            except OSError:
                continue
        for _, path in sorted(entries)[:max(0, len(entries) - MAX_ENTRIES)]:
            Path(path).unlink(missing_ok=True)


def _decode(raw: Optional[bytes], key: dict, mod: str, version: str) -> Optional[ModResult]:
    """The result a stored entry holds, or None for anything but a well-formed entry of key."""
    if raw is None:
        return None
    try:
        entry = json.loads(raw)
        if not isinstance(entry, dict) or entry.get("key") != key:
            return None
        result = result_from_dict(entry["result"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if result.mod != mod or result.version != version or result.to_dict() != entry["result"]:
        return None
    return result


_active = ResultCache()


def start(reuse: bool) -> ResultCache:
    """A fresh cache (zeroed counts) for one command; check, the matrix and launch use it."""
    global _active
    _active = ResultCache(reuse=reuse)
    return _active


def active() -> ResultCache:
    """The cache the current command started (by default one that reuses results)."""
    return _active
