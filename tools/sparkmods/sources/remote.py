"""A wheel on a package index, read member by member over HTTP range requests.

Nothing is downloaded whole: the tail of the file (end of central directory, zip64 records,
central directory) comes first, then exactly the byte spans of the members asked for,
coalesced and fetched in parallel. Each member is CRC-checked (zipread.py), then kept in the
member store (memberstore.py), where any wheel whose RECORD lists the same sha256 finds it;
the central directory is cached under the wheel's sha256. A second run reads nothing
from the network and `offline=True` works. A server that ignores Range gets one full
download instead, verified against the index sha256 and kept in the cache.

The cache entry is tied to what was read, not only to the hash the index claims: see
wheelentry.py for the rule (size and central-directory digest recorded on the first read,
checked on every later one; a contradiction marks the entry and it is never used again).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from sparkmods.checking import cpuslots
from sparkmods.errors import SparkmodsError
from sparkmods.outputfile import replacing
from sparkmods.runtime.pep440 import InvalidVersion, Version
from sparkmods.sources import memberstore
from sparkmods.sources.base import VllmSource, check_member
from sparkmods.sources.cache import cache_root
from sparkmods.sources.fetchstats import stats
from sparkmods.sources.rangefile import RangeFile
from sparkmods.sources.siblings import Siblings
from sparkmods.sources.wheelentry import Identity, WheelEntry
from sparkmods.sources.zipread import Readable, ZipMembers, central_directory

if TYPE_CHECKING:
    from concurrent.futures import Future

    from sparkmods.sources import http

log = logging.getLogger("sparkmods.sources")

# The measurements behind the three values below: ci/bench/results/host-constants-any-cpu.md.
# The first request reads this much of the file's end: the end records and, in the same
# request, the whole central directory of a vLLM wheel.
TAIL_BYTES = 1 << 20
# Members closer than this share one request: a request costs a round trip, a byte costs CPU
# (every TLS record needs the GIL a checking thread holds). The members a check reads lie in a
# few clusters, and the ones a sibling's hint adds (siblings.py) fill the gaps between them.
COALESCE_GAP = 2 << 20
# The members asked for (not the hinted ones) also bring the members around them, this far on
# each side (see ZipMembers.widened): the modules an import chain reaches next lie near each
# other, which saves rounds where no hint knows the chain yet.
READ_AHEAD = 256 << 10
_CHUNK = 1 << 20


def commit_of(version: str) -> Optional[str]:
    """The git commit a dev version names (`+g50cd5674b`), else None."""
    try:
        return Version(version).commit
    except InvalidVersion:
        return None


def _submit(fn: Callable, *args: object) -> "Future[object]":
    """http.pool().submit, with the HTTP layer imported only when a fetch is submitted."""
    from sparkmods.sources import http

    return http.pool().submit(fn, *args)


class RemoteWheel(VllmSource):
    """One wheel file on an index: `url`, its sha256 and size when the index gives them;
    `siblings`: what it shares with the other wheels of its target (siblings.py)."""

    def __init__(self, label: str, version: str, url: str, *, filename: str,
                 sha256: Optional[str] = None, size: Optional[int] = None, offline: bool = False,
                 siblings: Optional[Siblings] = None) -> None:
        super().__init__(label, version, commit_of(version), sha256)
        self.url = url
        self.filename = filename
        self.size = size
        self.offline = offline
        self._siblings = siblings if siblings is not None else Siblings()
        self._place = self._siblings.join()
        self._entry = WheelEntry(label, url, sha256)
        self._opened = False
        self._central_checked = False  # the cached central directory compared with the server's
        self._central_failed: Optional[SparkmodsError] = None  # why fetching it failed, once
        self._members: Dict[str, bytes] = {}
        self._hashes: Optional[Dict[str, str]] = None  # path -> its sha256 field in this wheel's RECORD
        self._record: Optional[Tuple[Optional[str]]] = None  # (the RECORD's path, if it has one)
        self._zip: Optional[ZipMembers] = None
        self._file: Optional[Readable] = None
        self._lock = threading.RLock()

    # -- public interface -------------------------------------------------------------
    def read(self, path: str) -> Optional[bytes]:
        check_member(self.label, path)
        self.prefetch([path])
        return self._members.get(path)

    def list_files(self) -> List[str]:
        return self.layout().names()

    def content_key(self) -> Optional[str]:
        """The index sha256 with the digest of the central directory this cache entry recorded
        (what was actually read, every member's CRC-32 included); None before the first read
        or without an index sha256."""
        with self._lock:
            self._open_entry()
            ident = self._entry.identity
        if self.sha256 is None or ident is None:
            return None
        return f"wheel:{self.sha256}:{ident.central_sha256}"

    def release(self) -> None:
        self._siblings.done(self._place)
        with self._lock:
            self._members.clear()
            self._hashes = None
            self._record = None
            self._zip = None
            self._file = None

    def warm(self) -> None:
        """Fetch and cache the central directory now unless the cache has it, holding nothing:
        a check fetches the next wheels' directories while it works on others, so their reads
        start from the cache, a round trip shorter. A server that ignores Range is left to the
        first read, which downloads the wheel."""
        from sparkmods.sources.http import RangeIgnored

        with self._lock:
            self._open_entry()
            if self.offline or self._zip is not None or self._entry.trusted or self._entry.whole.is_file():
                return
            try:
                self._fetch_central()
            except RangeIgnored as exc:
                exc.stream.close()

    def prefetch(self, paths: Iterable[str]) -> None:
        with self._lock:
            self._open_entry()
            asked = [check_member(self.label, p) for p in dict.fromkeys(paths)]
            self._siblings.note_asked(self._place, asked)
            wanted = [p for p in asked if p not in self._members]
            if not wanted:
                return
            layout = self.layout()
            missing = [p for p in wanted if p in layout and not self._from_store(p)]
            if not missing:
                return
            fetch, others = self._claim(missing)
            hinted: List[str] = []
            with cpuslots.waiting():
                try:
                    if fetch:  # a round trip anyway: what the nearest siblings were asked for comes with it
                        hinted, _ = self._claim([p for p in self._siblings.hints(self._place) if p in layout and
                                                 p not in missing and p not in self._members and not self._from_store(p)])
                        self._with_fallback(lambda: self._fetch_members(fetch, hinted))
                finally:
                    memberstore.settle(self._key(p) for p in [*fetch, *hinted])
                for event in others:
                    event.wait()
            left = [p for p in missing if p not in self._members and not self._from_store(p)]
            if left:  # another wheel's fetch of these failed: ours says why
                self._with_fallback(lambda: self._fetch_members(left))

    def _claim(self, paths: List[str]) -> "tuple[List[str], List[threading.Event]]":
        """(the paths whose bytes this wheel now fetches, the fetches of other wheels to wait
        for): see memberstore.claim."""
        keys = {self._key(p): p for p in paths}
        mine, theirs = memberstore.claim(keys)
        return [keys[key] for key in mine], theirs

    def _key(self, path: str) -> memberstore.Key:
        """Where the member store keeps path's bytes for this wheel: under the sha256 this
        wheel's RECORD lists for it, else under a key no other wheel reaches."""
        layout = self.layout()
        field = self._record_hashes().get(path) if path != self._record_path() else None
        sha256 = memberstore.sha256_hex(field) if field is not None else None
        if sha256 is not None:
            return memberstore.shared(sha256)
        ident = self._entry.identity
        scope = f"{self._entry.dir.name}:{ident.central_sha256 if ident else self.url}"
        cid = layout.content_id(path)
        assert cid is not None, path  # asked only for members of the layout
        return memberstore.scoped(scope, cid)

    def _record_path(self) -> Optional[str]:
        if self._record is None:
            self._record = (memberstore.record_name(self.layout().names()),)
        return self._record[0]

    def _record_hashes(self) -> Dict[str, str]:
        """This wheel's RECORD as path -> sha256 field (read once, like any member; empty without one)."""
        if self._hashes is None:
            name = self._record_path()
            if name is not None and name not in self._members and not self._from_store(name):
                self._with_fallback(lambda: self._fetch_members([name]))  # no hints: not for other wheels
            self._hashes = memberstore.record_hashes(self._members[name]) if name is not None else {}
        return self._hashes

    def _fetch_members(self, paths: List[str], hinted: Sequence[str] = ()) -> None:
        """Fetch the members' byte spans in one parallel batch (the asked ones read ahead,
        hinted ones as they are), then decompress, CRC-check and store them."""
        layout = self.layout()
        if isinstance(self._file, RangeFile):
            spans = [layout.widened(s, READ_AHEAD) for s in layout.spans(paths) if self._file.missing(*s)]
            spans += [s for s in layout.spans(hinted) if self._file.missing(*s)]
            if spans:
                self._need_network(f"{len(paths)} file(s) such as {paths[0]} are")
                self._check_cached_central()
                self._file.ensure(spans, COALESCE_GAP)
        for path in [*paths, *hinted]:
            data = layout.read(path)
            assert data is not None, path  # asked only for members of the layout
            memberstore.save(self._key(path), data)
            self._members[path] = data

    def layout(self) -> ZipMembers:
        """The parsed central directory (cache, then network); needed to know what exists."""
        with self._lock:
            self._open_entry()
            if self._zip is None:
                self._with_fallback(self._open_zip)
            assert self._zip is not None  # _open_zip sets it or raises
            return self._zip

    # -- cache ------------------------------------------------------------------------
    def _open_entry(self) -> None:
        """Once per source: the cache entry's record, checked against the index's size, and
        against this server when another one recorded it."""
        if not self._opened:
            self._entry.open(self.size)
            ident = self._entry.identity
            if ident is not None and not self._entry.whole.is_file() and not self._entry.vouched(self.url):
                self._recorded_elsewhere(ident.url)
            self._opened = True

    def _recorded_elsewhere(self, url: str) -> None:
        """The entry holds what another server sent under this sha256, which range reads never
        checked: before it answers for this server (result rows included), this server's own
        central directory must be the recorded one (a mismatch marks the entry conflicting)."""
        from sparkmods.sources.http import RangeIgnored

        if self.offline:
            raise SparkmodsError(f"{self.label}: the cache entry {self._entry.dir} was recorded from {url}, not "
                                 f"{self.url}; run once online so this server is checked against it")
        try:
            self._check_cached_central()
        except RangeIgnored as exc:
            self._download_whole(exc)  # verified against the index sha256, and bound to the record
            return
        self._entry.vouch(self.url)

    def _from_store(self, path: str) -> bool:
        """Serve a member of the layout from the member store (memberstore.py) when the bytes
        stored under its key pass its size and CRC-32 check."""
        layout = self.layout()
        data = memberstore.load(self._key(path))
        if data is None or not layout.matches(path, data):
            return False
        self._members[path] = data
        stats.add(cache_hits=1)
        return True

    def _need_network(self, what: str) -> None:
        if self.offline:
            raise SparkmodsError(f"{self.label}: offline and {what} not in the cache "
                                 f"({cache_root()}); run once without --offline")

    # -- opening the zip --------------------------------------------------------------
    def _open_zip(self) -> None:
        if self._entry.whole.is_file():
            stats.add(cache_hits=1)
            self._use_file(self._entry.whole.open("rb"))
            return
        cached = self._entry.load_central()
        if cached is not None:
            stats.add(cache_hits=1)
            offset, data = cached
            rf = self._range_file(offset + len(data))  # the identity's size (load_central checked)
            rf.add(offset, data)
            self._use_file(rf)
            return
        self._use_file(self._fetch_central())

    def _fetch_central(self) -> RangeFile:
        """The end of the wheel from the server, the whole central directory included, bound
        to the cache entry's identity and cached. A failure is kept: the check's own read after
        a failed warm() says why at once instead of asking (and waiting out a deadline) again."""
        if self._central_failed is not None:
            raise self._central_failed
        self._need_network("its central directory is")
        try:
            return self._fetch_tail()
        except SparkmodsError as exc:
            self._central_failed = exc
            raise

    def _fetch_tail(self) -> RangeFile:
        from sparkmods.sources import http  # the HTTP layer (ssl, http.client) only once a request is due

        start, size, tail = http.get_range(self.url, None, TAIL_BYTES)
        if self.size is not None and size != self.size:
            raise SparkmodsError(f"{self.label}: the index says {self.filename} has {self.size} bytes, "
                                 f"the server has {size}")
        self._entry.check_size(size, self.url)
        rf = self._range_file(size)
        rf.add(start, tail)
        central, _ = central_directory(self.label, rf)
        rf.ensure([(central, size)])  # the rest of the central directory if the tail missed some
        offset, data = rf.segment_at(size - 1)
        self._entry.bind(Identity.of(data, offset, size, central, self.url), "the central directory")
        self._entry.store_central(offset, size, data)
        self._central_checked = True
        return rf

    def _check_cached_central(self) -> None:
        """Before the network serves members against a cached central directory, the server's
        own central directory must be the recorded one (one request per source, at most)."""
        ident = self._entry.identity
        if self._central_checked or ident is None:
            return
        from sparkmods.sources import http

        start, size, data = http.get_range(self.url, ident.central_offset, ident.size)
        self._entry.check_size(size, self.url)
        self._entry.bind(Identity.of(data, start, size, ident.central_offset, self.url), "the central directory")
        self._central_checked = True

    def _range_file(self, size: int) -> RangeFile:
        def fetch(start: int, end: int) -> bytes:
            from sparkmods.sources import http

            _, total, data = http.get_range(self.url, start, end)
            if total != size:
                self._entry.check_size(total, self.url)  # a conflict once a size is recorded
                raise SparkmodsError(f"{self.url}: the wheel had {size} bytes, now {total}")
            return data
        return RangeFile(size, fetch, name=self.filename, submit=_submit)

    def _use_file(self, fileobj: Readable) -> None:
        self._file = fileobj
        self._zip = ZipMembers(self.label, fileobj)

    # -- servers that ignore Range ----------------------------------------------------
    def _with_fallback(self, action: Callable[[], None]) -> None:
        """Run action; if the server ignored Range, download the wheel once and run it again."""
        from sparkmods.sources.http import RangeIgnored

        try:
            action()
        except RangeIgnored as exc:
            self._download_whole(exc)
            self._open_zip()  # now over the downloaded wheel, no network
            if action != self._open_zip:
                action()

    def _download_whole(self, exc: http.RangeIgnored) -> None:
        """Stream the full body the server sent into the cache, verifying its sha256."""
        log.warning("%s: %s ignores HTTP Range; downloading the whole wheel (%s) once",
                    self.label, exc.url.split("/")[2], f"{self.size} bytes" if self.size else "size unknown")
        self._entry.dir.mkdir(parents=True, exist_ok=True)
        hasher = hashlib.sha256()
        total = 0
        try:
            with replacing(self._entry.whole, mode=0o600) as out:
                while True:
                    try:
                        chunk = exc.stream.read(_CHUNK)
                    except SparkmodsError as error:
                        raise SparkmodsError(f"{self.label}: download of {self.filename} broke off after "
                                             f"{total} bytes ({error})") from None
                    if not chunk:
                        break
                    hasher.update(chunk)
                    out.write(chunk)
                    total += len(chunk)
                out.flush()
                stats.add(nbytes=total, full_downloads=1)
                got = hasher.hexdigest()
                if self.sha256 is None:
                    log.warning("%s: the index gives no sha256 for %s; the download is unverified",
                                self.label, self.filename)
                elif got != self.sha256:
                    raise SparkmodsError(f"{self.label}: {self.filename} sha256 is {got}, the index says "
                                         f"{self.sha256}; refusing the download")
                self._bind_download(Path(out.name), total)
        finally:
            exc.stream.close()

    def _bind_download(self, path: Path, size: int) -> None:
        """A downloaded wheel must be the one earlier range reads recorded (or becomes the record)."""
        with path.open("rb") as fh:
            central = ZipMembers(self.label, fh).central_offset
            fh.seek(central)
            data = fh.read()
        self._entry.bind(Identity.of(data, central, size, central, self.url), "the downloaded wheel")
