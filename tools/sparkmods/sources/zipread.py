"""A wheel's zip directory and members, over any seekable file (local, or a RangeFile).

The central directory is read here rather than by zipfile: a vLLM wheel lists about 4,000
members and a check reads only a few, and zipfile builds a ZipInfo per member (a fifth of a
cold check's CPU time over 23 releases). One record is one struct unpack and one name
decode; a member is read from its local header, inflated and checked against its CRC-32 and
size only when asked for. What a remote reader needs on top: names that escape the tree are
refused, each member's exact byte span (so it can be fetched before it is read), and
one-line errors. Zip64 end records are followed; encrypted members and compression other
than stored and deflate (what wheels use) are refused when read.
"""

from __future__ import annotations

import bisect
import struct
import zlib
from typing import Dict, Iterable, List, NamedTuple, Optional, Protocol, Tuple

from sparkmods.errors import SparkmodsError
from sparkmods.sources.base import is_safe_member
from sparkmods.sources.rangefile import Span


class Readable(Protocol):
    """What the reader needs of a file: a local one, or a RangeFile over HTTP."""

    def seek(self, offset: int, whence: int = 0, /) -> int: ...

    def read(self, n: int = -1, /) -> bytes: ...


_EOCD = struct.Struct("<4s4H2LH")  # end of central directory
_LOCATOR = struct.Struct("<4sLQL")  # (its offset field is not needed: the record precedes it)  # zip64 end of central directory locator
_EOCD64 = struct.Struct("<4sQ2H2L4Q")  # zip64 end of central directory record
# One central directory record, only the fields read: signature, flags, method, CRC-32, sizes,
# name/extra/comment lengths, local header offset (versions, times, disk and attributes skipped).
_CENTRAL = struct.Struct("<4s4x2H4x3L3H8xL")
_LOCAL = struct.Struct("<4s2B4HL2L2H")  # one local file header
_MAX_COMMENT = 0xFFFF
_UTF8_FLAG, _ENCRYPTED_FLAG = 0x800, 0x1
_STORED, _DEFLATED = 0, 8
# What a wheel may claim before anything is read or inflated: a vLLM file is at most a few
# hundred KB (its RECORD under 1 MB), a central directory under 1 MB. Past these a member,
# its byte span or the directory is refused in one line, never read into memory.
MAX_MEMBER_BYTES = 64 << 20
MAX_CENTRAL_BYTES = 64 << 20
_SPAN_SLACK = 1 << 17  # a member's span beyond its data: local header, name, extra, data descriptor
ContentId = Tuple[str, int, int]  # name, size, CRC-32: what the central directory says a member holds


class Member(NamedTuple):
    """What the central directory says about one member."""

    header_offset: int
    compressed: int
    size: int
    crc: int
    method: int
    flags: int


class ZipMembers:
    """The central directory of one wheel, and CRC-checked reads of its members."""

    def __init__(self, label: str, fileobj: Readable) -> None:
        self.label = label
        self._file = fileobj
        self._offsets: List[int] = []  # every local header, duplicates' included
        try:
            self.central_offset, size, concat = _locate(fileobj)
            self._members = self._read_central(size, concat)
        except _UNREADABLE as exc:
            raise SparkmodsError(f"{label}: not a readable wheel ({exc})") from None
        unsafe = [n for n in self._members if _maybe_unsafe(n) and not is_safe_member(n)]
        if unsafe:
            raise SparkmodsError(f"{label}: refusing a wheel whose member {unsafe[0]!r} escapes the package tree")
        # A member ends where the next local header (or the central directory) begins.
        self._bounds = sorted(set(self._offsets) | {self.central_offset})
        for name in [n for n in self._members if n.endswith("/")]:
            del self._members[name]  # folders: listed by zips, never read
        self._names: Optional[List[str]] = None

    # -- the central directory ----------------------------------------------------------
    def _read_at(self, offset: int, n: int) -> bytes:
        return _read_at(self._file, offset, n)

    def _read_central(self, size: int, concat: int) -> Dict[str, Member]:
        data = self._read_at(self.central_offset, size)
        members: Dict[str, Member] = {}
        pos, unpack, record, last = 0, _CENTRAL.unpack_from, _CENTRAL.size, len(data) - _CENTRAL.size
        make = tuple.__new__  # Member(...) runs Python code per call; this is one C call
        offsets = self._offsets
        while pos <= last:
            sig, flags, method, crc, compressed, fsize, n, m, k, offset = unpack(data, pos)
            if sig != b"PK\x01\x02":
                raise ValueError(f"bad central directory record at offset {self.central_offset + pos}")
            start = pos + record
            raw = data[start:start + n]
            # ASCII reads the same in both encodings and has a fast decoder (cp437's is a
            # Python-level codec, and a vLLM wheel has about 4,000 names)
            name = raw.decode("ascii") if raw.isascii() else raw.decode("utf-8" if flags & _UTF8_FLAG else "cp437")
            if compressed == 0xFFFFFFFF or fsize == 0xFFFFFFFF or offset == 0xFFFFFFFF:
                fsize, compressed, offset = _zip64(data[start + n:start + n + m], fsize, compressed, offset)
            offset += concat
            members[name] = make(Member, (offset, compressed, fsize, crc, method, flags))
            offsets.append(offset)
            pos = start + n + m + k
        return members

    # -- queries ------------------------------------------------------------------------
    def names(self) -> List[str]:
        """Every member, sorted (computed once: the drift checks ask for it per mod)."""
        if self._names is None:
            self._names = sorted(self._members)
        return self._names

    def __contains__(self, name: str) -> bool:
        return name in self._members

    def span(self, name: str) -> Span:
        """Bytes [start, end) holding the member: local header, data, data descriptor."""
        start = self._members[name].header_offset
        i = bisect.bisect_right(self._bounds, start)
        end = self._bounds[i] if i < len(self._bounds) else self.central_offset
        if end - start > MAX_MEMBER_BYTES + _SPAN_SLACK:
            raise SparkmodsError(f"{self.label}: member {name} spans {end - start} bytes of the wheel, more than "
                                 f"the {MAX_MEMBER_BYTES} a vLLM file may take; refusing the wheel")
        return start, end

    def spans(self, names: Iterable[str]) -> List[Span]:
        return [self.span(n) for n in names if n in self._members]

    def widened(self, span: Span, reach: int) -> Span:
        """span grown by the whole members next to it, up to `reach` bytes on each side,
        stopping before any member larger than `reach` (a shared library, never read).

        The drift checks chase imports from the patched files one round at a time, and the
        modules they reach lie near each other in the archive (a wheel stores its members in
        path order), so reading ahead turns most later rounds into bytes already held."""
        bounds = self._bounds
        lo = bisect.bisect_left(bounds, span[0])
        while lo > 0 and span[0] - bounds[lo - 1] <= reach and bounds[lo] - bounds[lo - 1] <= reach:
            lo -= 1
        hi = bisect.bisect_left(bounds, span[1])
        while hi + 1 < len(bounds) and bounds[hi + 1] - span[1] <= reach and bounds[hi + 1] - bounds[hi] <= reach:
            hi += 1
        return min(bounds[lo], span[0]), max(bounds[hi] if hi < len(bounds) else span[1], span[1])

    def content_id(self, name: str) -> Optional[ContentId]:
        """(name, size, CRC-32) as the central directory lists the member; None when absent.
        Not an identity of the content: four chosen bytes give any CRC-32 (memberstore.py)."""
        member = self._members.get(name)
        return None if member is None else (name, member.size, member.crc)

    def matches(self, name: str, data: bytes) -> bool:
        """Whether data has the size and CRC-32 the central directory lists for the member."""
        member = self._members[name]
        return len(data) == member.size and zlib.crc32(data) == member.crc

    def read(self, name: str) -> Optional[bytes]:
        """The member's content, verified against its CRC-32 and size; None when absent."""
        member = self._members.get(name)
        if member is None:
            return None
        try:
            data = self._content(name, member)
        except (zlib.error, EOFError, struct.error) as exc:
            raise SparkmodsError(f"{self.label}: member {name} cannot be decompressed ({exc})") from None
        if not self.matches(name, data):
            raise SparkmodsError(f"{self.label}: member {name} failed its CRC-32 check; "
                                 "the wheel or the transfer is corrupt")
        return data

    def _content(self, name: str, member: Member) -> bytes:
        if member.flags & _ENCRYPTED_FLAG:
            raise SparkmodsError(f"{self.label}: member {name} is encrypted; a wheel never is")
        if member.method not in (_STORED, _DEFLATED):
            raise SparkmodsError(f"{self.label}: member {name} uses zip compression method {member.method}; "
                                 "wheels use stored or deflate")
        if max(member.size, member.compressed) > MAX_MEMBER_BYTES:
            raise SparkmodsError(f"{self.label}: member {name} lists {max(member.size, member.compressed)} bytes, "
                                 f"more than the {MAX_MEMBER_BYTES} a vLLM file may have; refusing to read it")
        header = _LOCAL.unpack(self._read_at(member.header_offset, _LOCAL.size))
        if header[0] != b"PK\x03\x04":
            raise SparkmodsError(f"{self.label}: member {name} is damaged (no local header at its offset); "
                                 "the wheel or the transfer is corrupt")
        n, m = header[-2], header[-1]
        stored = self._read_at(member.header_offset + _LOCAL.size, n + m + member.compressed)
        if stored[:n] not in (name.encode("utf-8"), name.encode("cp437", "replace")):
            raise SparkmodsError(f"{self.label}: member {name} is damaged (its local header names another file); "
                                 "the wheel or the transfer is corrupt")
        body = stored[n + m:]
        if member.method == _STORED:
            return body
        inflate = zlib.decompressobj(-15)
        data = inflate.decompress(body, member.size + 1)  # never more than it lists, plus one to tell
        if len(data) > member.size:
            raise SparkmodsError(f"{self.label}: member {name} inflates past the {member.size} bytes its entry "
                                 "lists; the wheel is corrupt or hostile")
        return data + inflate.flush()  # the input is used up (the limit was not hit): no more than a window


_UNREADABLE = (struct.error, ValueError, IndexError, EOFError, UnicodeDecodeError)


def central_directory(label: str, fileobj: Readable) -> Tuple[int, int]:
    """(where the central directory starts, its size), from the end records alone: what a
    wheel's identity needs (wheelentry.py) without reading every record."""
    try:
        offset, size, _ = _locate(fileobj)
    except _UNREADABLE as exc:
        raise SparkmodsError(f"{label}: not a readable wheel ({exc})") from None
    return offset, size


def _read_at(fileobj: Readable, offset: int, n: int) -> bytes:
    fileobj.seek(offset)
    data = fileobj.read(n)
    if len(data) != n:
        raise EOFError(f"{n} bytes wanted at offset {offset}, {len(data)} there")
    return data


def _locate(fileobj: Readable) -> Tuple[int, int, int]:
    """(central directory offset, its size, bytes prepended to the archive), from the end of
    central directory record (and the zip64 one its locator names)."""
    size = fileobj.seek(0, 2)
    tail_start = max(0, size - _EOCD.size - _MAX_COMMENT)
    tail = _read_at(fileobj, tail_start, size - tail_start)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < _EOCD.size:
        raise ValueError("no end of central directory record")
    _, _, _, _, _, cd_size, cd_offset, _ = _EOCD.unpack_from(tail, at)
    end_record = tail_start + at  # where the directory's end records begin
    if at >= _LOCATOR.size and tail[at - _LOCATOR.size:at - _LOCATOR.size + 4] == b"PK\x06\x07":
        rec = _EOCD64.unpack(_read_at(fileobj, end_record - _LOCATOR.size - _EOCD64.size, _EOCD64.size))
        if rec[0] != b"PK\x06\x06":
            raise ValueError("zip64 end of central directory record not where its locator says")
        cd_size, cd_offset = rec[8], rec[9]
        end_record -= _LOCATOR.size + _EOCD64.size
    if cd_size > MAX_CENTRAL_BYTES:
        raise ValueError(f"its central directory claims {cd_size} bytes, more than the {MAX_CENTRAL_BYTES} "
                         "a vLLM wheel's needs")
    concat = end_record - cd_size - cd_offset  # bytes prepended to the archive (as zipfile allows)
    if concat < 0:
        raise ValueError("the central directory lies outside the file")
    return cd_offset + concat, cd_size, concat


def _maybe_unsafe(name: str) -> bool:
    """A cheap superset of the names is_safe_member refuses (most wheels have none)."""
    return not name or ".." in name or name[0] in "/\\" or name[1:2] == ":" or not name.isprintable()


def _zip64(extra: bytes, fsize: int, compressed: int, offset: int) -> "tuple[int, int, int]":
    """(size, compressed size, header offset), the 0xFFFFFFFF ones taken from the zip64 extra field."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<2H", extra, pos)
        if tag == 1:
            values = list(struct.unpack_from(f"<{length // 8}Q", extra, pos + 4))
            if fsize == 0xFFFFFFFF:
                fsize = values.pop(0)
            if compressed == 0xFFFFFFFF:
                compressed = values.pop(0)
            if offset == 0xFFFFFFFF:
                offset = values.pop(0)
            return fsize, compressed, offset
        pos += 4 + length
    raise ValueError("a member's zip64 sizes are missing")
