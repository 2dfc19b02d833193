"""Check results kept on disk and reused: a row is a pure function of its inputs, so the same
inputs need not be checked twice.

A row (one mod or loose patch on one vLLM) depends on exactly:
  subject  the mod's content hash (every file of its folder) or the patch file's bytes;
  source   what the vLLM's bytes are: a wheel's index sha256 together with the digest of the
           central directory the cache entry recorded (wheelentry.Identity: what was really
           read, CRC-32 of every member included), or a git tree's object id;
  checker  the drift-check fingerprint the matrix records (check.checker_hash);
  code     the host code that makes the rest of the decision (runtime/, check.py, the patch
           reader), which a mod's own runtime copy covers only once `sparkmods sync` ran;
  python   the interpreter's minor version (what `ast` accepts decides `syntax` findings).
Sources whose bytes have no such name (dir:, wheel:PATH, image:) are always checked.

Entries live in one folder, <cache>/results-v2/, one JSON file per key, written atomically
(results-v1 spread them over 256 subfolders, and a cold check, one entry per mod and release,
created a folder for most of them: on ext4 a folder costs more to create than a file); a file
that is unreadable, names another key, or does not decode to a well-formed result is a miss.
The folder is bounded: past MAX_ENTRIES the least recently used entries go.
`--no-cache` (ResultCache(reuse=False)) checks every row again and stores the fresh results.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from sparkmods.errors import SparkmodsError
from sparkmods.runtime.engine import FileResult, HunkResult, NearMatch
from sparkmods.runtime.modcheck import ModResult
from sparkmods.sources.cache import cache_root, read_bytes, write_atomic

SCHEMA = 1
MAX_ENTRIES = 20_000  # a few KB each: 23 releases x 5 mods is 115
_HERE = Path(__file__).resolve().parent
# Host code besides the drift checks (check.checker_hash) that decides a row.
_DECIDING = ("check.py", "patchfile.py", "pyparse.py", "resultcache.py")


def mod_hash(mod_dir: Path) -> str:
    """sha256 over the sorted relative paths and bytes of every file in the mod."""
    digest = hashlib.sha256()
    for path in sorted(p for p in mod_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(mod_dir).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def patch_hash(name: str, strip: int, data: bytes) -> str:
    """The subject hash of a loose patch: its name (the row's `mod`), -p and bytes."""
    return hashlib.sha256(f"patch\0{name}\0{strip}\0".encode() + data).hexdigest()


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """sha256 over the host runtime and the other deciding modules (read once per process)."""
    digest = hashlib.sha256()
    files = sorted((_HERE / "runtime").glob("*.py")) + [_HERE / rel for rel in _DECIDING]
    for path in files:
        digest.update(path.relative_to(_HERE).as_posix().encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


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
        from sparkmods.check import checker_hash

        named = getattr(source, "content_key", None)  # duck-typed sources without it: never stored
        content = named() if named is not None else None
        if content is None:
            return None
        return {"schema": SCHEMA, "subject": subject, "source": content, "vllm": source.version,
                "checker": checker_hash(), "code": code_hash(), "python": "{}.{}".format(*sys.version_info[:2])}

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
        result = _result(entry["result"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if result.mod != mod or result.version != version or result.to_dict() != entry["result"]:
        return None
    return result


def _typed(value: Any, kind: Any) -> Any:
    """value when it is of kind (bool is never an int here), else TypeError."""
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise TypeError(f"{value!r} is not {kind}")
    return value


def _opt(value: Any, kind: Any) -> Any:
    return None if value is None else _typed(value, kind)


def _listed(value: Any, item: Callable[[Any], Any]) -> List[Any]:
    return [item(v) for v in _typed(value, list)]


def _near(d: Dict[str, Any]) -> NearMatch:
    return NearMatch(_typed(d["line"], int), _typed(d["matching"], int), _typed(d["total"], int),
                     _listed(d["differing"], lambda x: (_typed(x["line"], int), _typed(x["expected"], str),
                                                        _typed(x["found"], str))))


def _hunk(d: Dict[str, Any]) -> HunkResult:
    near = d.get("near")
    return HunkResult(_typed(d["hunk"], int), _typed(d["outcome"], str), _typed(d["stated_line"], int),
                      _opt(d["line"], int), _typed(d["offset"], int), _typed(d.get("reason", ""), str),
                      _near(_typed(near, dict)) if near is not None else None)


def _file(d: Dict[str, Any]) -> FileResult:
    return FileResult(_typed(d["path"], str), _typed(d["status"], str), _listed(d["hunks"], _hunk),
                      _typed(d.get("reason", ""), str))


def _result(d: Dict[str, Any]) -> ModResult:
    """A ModResult from its to_dict() form (the bytes before/after a patch are not kept)."""
    _typed(d, dict)
    return ModResult(_typed(d["mod"], str), _typed(d["vllm"], str), _typed(d["status"], str),
                     _opt(d["variant"], str), _typed(d.get("reason", ""), str), _listed(d["files"], _file),
                     _typed(d.get("chosen_by", ""), str))


_active = ResultCache()


def start(reuse: bool) -> ResultCache:
    """A fresh cache (zeroed counts) for one command; check, the matrix and launch use it."""
    global _active
    _active = ResultCache(reuse=reuse)
    return _active


def active() -> ResultCache:
    """The cache the current command started (by default one that reuses results)."""
    return _active
