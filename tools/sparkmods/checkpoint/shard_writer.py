"""Write a .safetensors file whose tensors are byte ranges of other files.

The header is computed from the pieces, written first, then each piece's bytes are
copied straight from its source file (kernel copy or a bounded buffer): memory use is
independent of tensor, shard and checkpoint size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from sparkmods.checkpoint.fileops import copy_range
from sparkmods.checkpoint.header import HeaderEntry, TensorInfo, encode_header


@dataclass(frozen=True)
class Piece:
    """One output tensor: its header fields and where its bytes are."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    src: Path
    offset: int
    nbytes: int

    @classmethod
    def of(cls, info: TensorInfo, src: Path) -> "Piece":
        return cls(info.name, info.dtype, info.shape, src, info.start, info.nbytes)


def _runs(pieces: Sequence[Piece]) -> Iterator[tuple[Path, int, int]]:
    """(source, offset, length) with back-to-back pieces of one source merged: fewer syscalls."""
    src: Path | None = None
    start = end = 0
    for p in pieces:
        if p.src == src and p.offset == end:
            end += p.nbytes
            continue
        if src is not None:
            yield src, start, end - start
        src, start, end = p.src, p.offset, p.offset + p.nbytes
    if src is not None:
        yield src, start, end - start


def write_shard(
    path: Path,
    pieces: Sequence[Piece],
    metadata: Mapping[str, str],
    on_bytes: Callable[[int], None] = lambda n: None,
) -> int:
    """Create `path` (must not exist) holding `pieces` in order; returns its size."""
    header = encode_header((HeaderEntry(p.name, p.dtype, p.shape, p.nbytes) for p in pieces), metadata)
    sources: dict[Path, int] = {}
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(header)
        while view:
            view = view[os.write(out, view):]
        for src, offset, length in _runs(pieces):
            if src not in sources:
                sources[src] = os.open(src, os.O_RDONLY)
            copy_range(sources[src], out, offset, length, on_bytes)
        return os.lseek(out, 0, os.SEEK_CUR)
    finally:
        os.close(out)
        for fd in sources.values():
            os.close(fd)
