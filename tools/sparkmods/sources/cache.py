"""The on-disk cache: where it lives and how entries are written (atomically, never half)."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Optional

_SHA256 = re.compile(r"[0-9a-f]{64}")


def cache_root() -> Path:
    """$SPARKMODS_CACHE_DIR, else $XDG_CACHE_HOME/sparkmods, else ~/.cache/sparkmods (read at call time)."""
    explicit = os.environ.get("SPARKMODS_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "sparkmods"


def digest(text: str) -> str:
    """A file-name-safe key for any string (URLs, member paths)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def is_sha256(text: str) -> bool:
    """Exactly 64 lowercase hex digits: the only form a server-given hash may take as a cache name."""
    return bool(_SHA256.fullmatch(text))


def write_atomic(path: Path, data: bytes) -> None:
    """Write via a temp file in the same folder + rename, so readers never see a partial entry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_bytes(path: Path) -> Optional[bytes]:
    """The entry's bytes, or None when it is not cached."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
