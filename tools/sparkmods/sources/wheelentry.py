"""One remote wheel's folder in the cache, and the rule that ties it to what was actually read.

Range reads never see the whole wheel, so the index's sha256 cannot be checked against the
bytes; a server could serve another wheel under a hash, and a cache keyed by that hash alone
would hand those bytes to every later run. The rule:

- The folder is named by the index's sha256, which must be exactly 64 lowercase hex digits
  (the name comes from a server: `../..` or `/etc` must never become a path), or, when the
  index gives none, by a digest of the URL. Entries live under `wheels-v2/`; the older
  `wheels/` folders recorded nothing to check and are never read.
- Before anything else is cached, `identity.json` records what the first read saw: the
  wheel's size, where its central directory starts, the sha256 of the bytes from there to
  the end of the file, and the URL.
- Every later use compares against that record: an index that lists another size, a server
  whose Content-Range total differs, a central directory fetched again whose digest differs,
  a cached central directory that does not match the record, or a verified full download
  that does not match, is a conflict. The folder then gets `conflict.txt` and is refused
  from then on, offline too, until it is deleted: a poisoned entry is never used.
- Members are not kept here but in the member store (memberstore.py), by the sha256 the
  wheel's own RECORD lists for them (or under a key scoped to this entry and its recorded
  central directory), and are read back only when they also match that central directory.
- An entry recorded from one server answers for another (the same sha256 on another index)
  only once that server's own central directory was fetched and matched the record, one
  request (remote.py; `checked-*` records the servers that passed); offline it is refused
  until a run online has checked that server.
- What this cannot see: an answer served wholly from the cache makes no request, so with an
  index that lists no sizes (PEP 503 HTML) a server that lied on the first read is caught
  only once a member must be fetched. PEP 691 indexes (PyPI) list sizes: checked every run.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Tuple

from sparkmods.errors import SparkmodsError
from sparkmods.sources.cache import cache_root, digest, is_sha256, read_bytes, write_atomic

_HEADER = struct.Struct("<QQ")  # central.bin: (offset, wheel size), then the bytes from offset to the end


@dataclass(frozen=True)
class Identity:
    """What the first read of a wheel saw; every later read must see the same."""

    size: int
    central_offset: int
    central_sha256: str  # of bytes [central_offset, size): central directory and end records
    url: str

    @staticmethod
    def of(data: bytes, offset: int, size: int, central_offset: int, url: str) -> "Identity":
        """The identity of a wheel whose bytes [offset, size) are data."""
        return Identity(size, central_offset, hashlib.sha256(data[central_offset - offset:]).hexdigest(), url)


class WheelEntry:
    """The cache folder of one wheel: identity, central directory, whole download."""

    def __init__(self, label: str, url: str, sha256: Optional[str]) -> None:
        if sha256 is not None and not is_sha256(sha256):
            raise SparkmodsError(f"{label}: sha256 {sha256[:80]!r} for {url} is not 64 lowercase hex digits; "
                                 f"refusing it as a cache name")
        self.label = label
        self._name = sha256 or "url-" + digest(url)
        self._dir: Optional[Path] = None
        self.identity: Optional[Identity] = None

    @property
    def dir(self) -> Path:
        """<cache>/wheels-v2/<name>, resolved on first use: a range over a nightly index opens
        thousands of sources, most of which a run never reads."""
        if self._dir is None:
            self._dir = cache_root() / "wheels-v2" / self._name
        return self._dir

    # -- the binding ------------------------------------------------------------------
    def open(self, index_size: Optional[int]) -> None:
        """Load the record, refusing an entry marked conflicting or one the index contradicts."""
        mark = read_bytes(self.dir / "conflict.txt")
        if mark is not None:
            raise self._refused(mark.decode("utf-8", errors="replace").strip()[:300])
        raw = read_bytes(self.dir / "identity.json")
        if raw is None:
            return
        try:
            self.identity = Identity(**json.loads(raw))
        except (ValueError, TypeError, RecursionError):
            raise self.conflict("identity.json is unreadable") from None
        if index_size is not None and index_size != self.identity.size:
            raise self.conflict(f"the index lists {index_size} bytes, an earlier read from "
                                f"{self.identity.url} got {self.identity.size}")

    def bind(self, seen: Identity, what: str) -> None:
        """Record seen as the identity, or check it against the one recorded."""
        if self.identity is None:
            write_atomic(self.dir / "identity.json", json.dumps(asdict(seen)).encode("utf-8"))
            self.identity = seen
            return
        if (seen.size, seen.central_offset, seen.central_sha256) != \
                (self.identity.size, self.identity.central_offset, self.identity.central_sha256):
            sizes = f" ({seen.size} vs {self.identity.size} bytes)" if seen.size != self.identity.size else ""
            raise self.conflict(f"{what} from {seen.url} differs from the one an earlier read from "
                                f"{self.identity.url} got{sizes}")

    def check_size(self, size: int, url: str) -> None:
        """A server's Content-Range total must be the recorded size."""
        if self.identity is not None and size != self.identity.size:
            raise self.conflict(f"{url} now has {size} bytes, an earlier read from {self.identity.url} "
                                f"got {self.identity.size}")

    def conflict(self, reason: str) -> SparkmodsError:
        """Mark the entry as never to be used again and return the error that says why."""
        write_atomic(self.dir / "conflict.txt", (reason + "\n").encode("utf-8"))
        return self._refused(reason)

    def _refused(self, reason: str) -> SparkmodsError:
        return SparkmodsError(f"{self.label}: refusing the cache entry {self.dir}: {reason} (one of the two "
                              f"servers sent other bytes under this name); delete that folder to read it afresh")

    def vouch(self, url: str) -> None:
        """Record that url served the recorded central directory (checked by the caller)."""
        write_atomic(self.dir / f"checked-{digest(url)}", (url + "\n").encode("utf-8"))

    def vouched(self, url: str) -> bool:
        """Whether url is the server that recorded the entry or one checked against it since."""
        return self.identity is not None and (url == self.identity.url or
                                              read_bytes(self.dir / f"checked-{digest(url)}") is not None)

    # -- the cached parts -------------------------------------------------------------
    @property
    def trusted(self) -> bool:
        """Cached parts are used only under a recorded identity."""
        return self.identity is not None

    def load_central(self) -> Optional[Tuple[int, bytes]]:
        """(offset, bytes to the end of the wheel) as cached, checked against the identity."""
        ident = self.identity
        if ident is None:  # not trusted
            return None
        cached = read_bytes(self.dir / "central.bin")
        if cached is None:
            return None
        offset, size = _HEADER.unpack_from(cached) if len(cached) >= _HEADER.size else (-1, -1)
        data = cached[_HEADER.size:]
        if not (size == ident.size and 0 <= offset <= ident.central_offset and offset + len(data) == size
                and Identity.of(data, offset, size, ident.central_offset, ident.url) == ident):
            raise self.conflict("central.bin does not match identity.json")
        return offset, data

    def store_central(self, offset: int, size: int, data: bytes) -> None:
        write_atomic(self.dir / "central.bin", _HEADER.pack(offset, size) + data)

    @property
    def whole(self) -> Path:
        """A full download, verified against the index sha256 when there was one."""
        return self.dir / "wheel.whl"
