"""What a check row is a function of, as hashes: the result cache keys rows by them and the
matrix records them beside its cells, so either reuses a row only while they are unchanged."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

_HERE = Path(__file__).resolve().parent.parent  # sparkmods/
# Host code that can change a row's status beyond the mod's own files (whose runtime copy is
# part of the mod's content hash): a change here must re-check every matrix cell.
_DRIFT_CODE = ("checking/drift.py", "checking/driftmemo.py", "checking/linediff.py", "pyindex/defscan.py",
               "pyindex/resolve.py")
# Host code besides the drift checks that decides a row, and the form a stored row is read back in.
_DECIDING = ("checking/batch.py", "checking/fingerprints.py", "checking/resultcache.py", "checking/rows.py",
             "patchfile.py", "pyindex/safeparse.py")


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
def checker_hash() -> str:
    """sha256 over the drift-check sources, recorded in the matrix beside each mod's hash."""
    return _files_hash([_HERE / rel for rel in _DRIFT_CODE])


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """sha256 over the host runtime and the other deciding modules (read once per process)."""
    return _files_hash(sorted((_HERE / "runtime").glob("*.py")) + sorted(_HERE / rel for rel in _DECIDING))


def _files_hash(paths: "list[Path]") -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.relative_to(_HERE).as_posix().encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()
