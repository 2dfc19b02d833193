"""A read-only, seekable file over byte-range fetches, in the spirit of pip's lazy wheel.

Code above it (zipread.ZipMembers) just seeks and reads; any byte not yet held is fetched on demand.
`ensure()` fetches many ranges at once, coalesced and in parallel, so a whole batch of zip
members costs one round trip. Held bytes live in a sparse list of merged segments.
"""

from __future__ import annotations

import bisect
import io
import threading
from typing import TYPE_CHECKING, Callable, Iterable, List, Optional, Tuple

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

Span = Tuple[int, int]  # [start, end)
Fetch = Callable[[int, int], bytes]  # bytes [start, end) of the remote file


def coalesce(spans: Iterable[Span], gap: int = 0) -> List[Span]:
    """Sorted, merged spans; spans closer than `gap` bytes become one (fewer requests)."""
    merged: List[List[int]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


class RangeFile(io.RawIOBase):
    """A file of `size` bytes whose content arrives through `fetch(start, end)`."""

    def __init__(self, size: int, fetch: Fetch, name: Optional[str] = None,
                 submit: Optional[Callable] = None) -> None:
        super().__init__()
        self.size = size
        self.name = name
        self._fetch = fetch
        self._submit = submit  # executor.submit for parallel fetches; None = one by one
        self._pos = 0
        self._starts: List[int] = []  # sorted starts of held, non-touching segments
        self._data: dict = {}  # start -> bytes
        self._lock = threading.Lock()

    # -- the sparse store -------------------------------------------------------------
    def add(self, start: int, data: bytes) -> None:
        """Hold bytes [start, start+len(data)), merging with touching segments."""
        if not data:
            return
        with self._lock:
            end = start + len(data)
            i = bisect.bisect_right(self._starts, start) - 1
            if i >= 0 and self._starts[i] + len(self._data[self._starts[i]]) >= start:
                prev = self._starts[i]
                held = self._data[prev]
                data = held[: start - prev] + data + held[end - prev:]  # bytes past `end` kept
                start, end = prev, max(end, prev + len(held))
                del self._data[prev]
                del self._starts[i]
            j = bisect.bisect_left(self._starts, start)
            while j < len(self._starts) and self._starts[j] <= end:
                nxt = self._starts.pop(j)
                held = self._data.pop(nxt)
                if nxt + len(held) > end:
                    data += held[end - nxt:]
                    end = nxt + len(held)
            bisect.insort(self._starts, start)
            self._data[start] = data

    def missing(self, start: int, end: int) -> List[Span]:
        """The parts of [start, end) not held yet."""
        gaps: List[Span] = []
        with self._lock:
            i = max(bisect.bisect_right(self._starts, start) - 1, 0)
            cursor = start
            while cursor < end and i < len(self._starts):
                seg = self._starts[i]
                seg_end = seg + len(self._data[seg])
                if seg_end <= cursor:
                    i += 1
                    continue
                if seg >= end:
                    break
                if seg > cursor:
                    gaps.append((cursor, seg))
                cursor = seg_end
                i += 1
            if cursor < end:
                gaps.append((cursor, end))
        return gaps

    def segment_at(self, offset: int) -> Tuple[int, bytes]:
        """The held segment that contains offset (used to cache what was fetched)."""
        with self._lock:
            i = bisect.bisect_right(self._starts, offset) - 1
            if i < 0 or self._starts[i] + len(self._data[self._starts[i]]) <= offset:
                raise KeyError(offset)
            return self._starts[i], self._data[self._starts[i]]

    def ensure(self, spans: Iterable[Span], gap: int = 0) -> None:
        """Fetch whatever of spans is not held: coalesced, then in parallel when possible."""
        wanted = coalesce(spans, gap)
        todo = coalesce([g for s, e in wanted for g in self.missing(s, min(e, self.size))], gap)
        if not todo:
            return
        if self._submit is None or len(todo) == 1:
            for start, end in todo:
                self.add(start, self._fetch(start, end))
            return
        futures = [(start, self._submit(self._fetch, start, end)) for start, end in todo]
        first_error: Optional[BaseException] = None
        for start, future in futures:
            try:
                self.add(start, future.result())
            except Exception as exc:  # noqa: BLE001 - wait for all, then raise the first error
                if first_error is None:
                    first_error = exc
                else:
                    _discard(exc)
        if first_error is not None:
            raise first_error

    # -- the file interface -----------------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self._pos + n, self.size)
        if end <= self._pos:
            return b""
        self.ensure([(self._pos, end)])
        start, data = self.segment_at(self._pos)
        out = data[self._pos - start: end - start]
        self._pos = end
        return out

    def readinto(self, buffer: WriteableBuffer) -> int:  # io.RawIOBase contract
        view = memoryview(buffer)
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)


def _discard(exc: BaseException) -> None:
    """Close an unread body carried by a second error (see http.RangeIgnored)."""
    stream = getattr(exc, "stream", None)
    if stream is not None:
        stream.close()
