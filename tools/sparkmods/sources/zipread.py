"""A wheel's zip directory and members, over any seekable file (local, or a RangeFile).

zipfile does the format work (end of central directory, zip64, local headers, CRC-32);
this layer adds what a remote reader needs: refusing names that escape the tree, the exact
byte span of each member (so it can be fetched before it is read), and one-line errors.
"""

from __future__ import annotations

import bisect
import zipfile
import zlib
from typing import BinaryIO, Dict, Iterable, List, Optional

from sparkmods.errors import SparkmodsError
from sparkmods.sources.base import is_safe_member
from sparkmods.sources.rangefile import Span


class ZipMembers:
    """The central directory of one wheel, and CRC-checked reads of its members."""

    def __init__(self, label: str, fileobj: BinaryIO) -> None:
        self.label = label
        try:
            self._zip = zipfile.ZipFile(fileobj)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
            raise SparkmodsError(f"{label}: not a readable wheel ({exc})") from None
        infos = self._zip.infolist()
        unsafe = [i.filename for i in infos if not is_safe_member(i.filename)]
        if unsafe:
            raise SparkmodsError(f"{label}: refusing a wheel whose member {unsafe[0]!r} escapes the package tree")
        self._infos: Dict[str, zipfile.ZipInfo] = {i.filename: i for i in infos if not i.is_dir()}
        # A member ends where the next local header (or the central directory) begins.
        self._bounds = sorted({i.header_offset for i in infos} | {self.central_offset})
        self._names: Optional[List[str]] = None

    @property
    def central_offset(self) -> int:
        """Where the central directory starts (zipfile's own bookkeeping)."""
        return self._zip.start_dir

    def names(self) -> List[str]:
        """Every member, sorted (computed once: the drift checks ask for it per mod)."""
        if self._names is None:
            self._names = sorted(self._infos)
        return self._names

    def __contains__(self, name: str) -> bool:
        return name in self._infos

    def span(self, name: str) -> Span:
        """Bytes [start, end) holding the member: local header, data, data descriptor."""
        start = self._infos[name].header_offset
        i = bisect.bisect_right(self._bounds, start)
        return start, self._bounds[i] if i < len(self._bounds) else self.central_offset

    def spans(self, names: Iterable[str]) -> List[Span]:
        return [self.span(n) for n in names if n in self._infos]

    def read(self, name: str) -> Optional[bytes]:
        """The member's content, verified against its CRC-32; None when absent."""
        info = self._infos.get(name)
        if info is None:
            return None
        try:
            return self._zip.read(info)
        except zipfile.BadZipFile as exc:
            what = "failed its CRC-32 check" if "CRC" in str(exc) else f"is damaged ({exc})"
            raise SparkmodsError(f"{self.label}: member {name} {what}; the wheel or the transfer is corrupt") from None
        except (zlib.error, EOFError, NotImplementedError) as exc:
            raise SparkmodsError(f"{self.label}: member {name} cannot be decompressed ({exc})") from None
