"""The on-disk cache: where it lives and how entries are written (atomically, never half)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Optional, Set

from sparkmods import outputfile
from sparkmods.errors import SparkmodsError

_SHA256 = re.compile(r"[0-9a-f]{64}")


CACHE_ENV = "SPARKMODS_CACHE_DIR"
_checked: Set[str] = set()  # roots already seen to be folders (or absent): stat once per root


def cache_root() -> Path:
    """$SPARKMODS_CACHE_DIR, else $XDG_CACHE_HOME/sparkmods, else ~/.cache/sparkmods (read at
    call time); something other than a folder there is one line, not a traceback later."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        root = Path(explicit).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "sparkmods"
    if str(root) not in _checked:
        there = root
        while not os.path.lexists(there) and there != there.parent:
            there = there.parent  # the nearest part that exists must be a folder
        if not there.is_dir():
            where = f"{CACHE_ENV}={explicit}" if explicit else f"the cache folder {root}"
            blocker = "" if there == root else f" ({there} is a file)"
            raise SparkmodsError(f"{where}: not a folder{blocker}; set {CACHE_ENV} to a folder "
                                 "(it is created if missing)")
        _checked.add(str(root))
    return root


def digest(text: str) -> str:
    """A file-name-safe key for any string (URLs, member paths)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def is_sha256(text: str) -> bool:
    """Exactly 64 lowercase hex digits: the only form a server-given hash may take as a cache name."""
    return bool(_SHA256.fullmatch(text))


def write_atomic(path: Path, data: bytes) -> None:
    """Write a cache entry whole (outputfile.write_into), readable by this user only."""
    outputfile.write_into(path, data, mode=0o600)


def read_bytes(path: Path) -> Optional[bytes]:
    """The entry's bytes, or None when it is not cached."""
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
