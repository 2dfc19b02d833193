"""Read and write safetensors headers without touching tensor data.

The format: an 8-byte little-endian length N, N bytes of UTF-8 JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}`,
then the data buffer. Offsets are relative to the buffer, which starts at 8 + N. Reading
it ourselves (instead of through a framework) lets `inspect` look at a 100 GB checkpoint
in milliseconds and lets the writers copy exact byte ranges.
"""

from __future__ import annotations

import itertools
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from sparkmods.errors import SparkmodsError

# Bits per element of every dtype code the safetensors format defines.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
FLOAT16_DTYPES = frozenset({"F16", "BF16"})
METADATA_KEY = "__metadata__"
# The reference implementation refuses headers above 100 MB; so do we, before allocating.
MAX_HEADER_BYTES = 100_000_000


class HeaderError(SparkmodsError):
    """A file that is not a valid safetensors file."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it; `start`/`end` are absolute file offsets."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ShardHeader:
    """The parsed header of one .safetensors file; tensors are in data order."""

    path: Path
    header_size: int
    metadata: dict[str, str]
    tensors: dict[str, TensorInfo]
    file_size: int

    @property
    def data_start(self) -> int:
        return 8 + self.header_size


def itemsize(dtype: str) -> int:
    """Alignment unit of a dtype in bytes (sub-byte dtypes count as 1)."""
    return max(1, DTYPE_BITS[dtype] // 8)


def tensor_nbytes(dtype: str, shape: Iterable[int]) -> int:
    """Bytes a tensor of this dtype and shape occupies; raises ValueError if not whole."""
    numel = 1
    for dim in shape:
        numel *= dim
    bits = numel * DTYPE_BITS[dtype]
    if bits % 8:
        raise ValueError(f"{numel} elements of {dtype} are not a whole number of bytes")
    return bits // 8


def read_header(path: Path) -> ShardHeader:
    """Parse and validate the header of `path`; reads only its first 8 + N bytes."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            file_size = fh.seek(0, 2)
            fh.seek(0)
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise HeaderError(f"{path}: not a safetensors file ({file_size} bytes, no header)")
            (size,) = struct.unpack("<Q", prefix)
            if size > MAX_HEADER_BYTES or 8 + size > file_size:
                raise HeaderError(
                    f"{path}: not a safetensors file or truncated "
                    f"(header claims {size} bytes, file has {file_size})"
                )
            raw = fh.read(size)
    except OSError as exc:
        raise HeaderError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderError(f"{path}: header is not valid JSON ({exc})") from exc
    except RecursionError:
        raise HeaderError(f"{path}: header JSON is nested too deeply (not a safetensors header)") from None
    if not isinstance(doc, dict):
        raise HeaderError(f"{path}: header is not a JSON object")
    return _validate(path, size, file_size, doc)


def _validate(path: Path, size: int, file_size: int, doc: dict) -> ShardHeader:
    metadata = doc.pop(METADATA_KEY, None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise HeaderError(f"{path}: __metadata__ must map strings to strings")
    data_start = 8 + size
    infos = []
    for name, entry in doc.items():
        infos.append(_tensor(path, name, entry, data_start, file_size))
    infos.sort(key=lambda t: (t.start, t.end))
    for before, after in itertools.pairwise(infos):
        if after.start < before.end:
            raise HeaderError(f"{path}: tensors {before.name} and {after.name} overlap")
    return ShardHeader(path, size, dict(metadata), {t.name: t for t in infos}, file_size)


def _tensor(path: Path, name: str, entry: object, data_start: int, file_size: int) -> TensorInfo:
    def bad(why: str) -> HeaderError:
        return HeaderError(f"{path}: tensor {name}: {why}")

    if not isinstance(entry, dict):
        raise bad("entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise bad(f"unknown dtype {dtype!r} (known: {', '.join(sorted(DTYPE_BITS))})")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise bad(f"bad shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise bad(f"bad data_offsets {offsets!r}")
    try:
        expected = tensor_nbytes(dtype, shape)
    except ValueError as exc:
        raise bad(str(exc)) from exc
    if offsets[1] - offsets[0] != expected:
        raise bad(f"{dtype}{shape} needs {expected} bytes, data_offsets span {offsets[1] - offsets[0]}")
    if data_start + offsets[1] > file_size:
        raise bad(f"data ends at byte {data_start + offsets[1]}, past the end of the file ({file_size})")
    return TensorInfo(name, dtype, tuple(shape), data_start + offsets[0], data_start + offsets[1])


@dataclass(frozen=True)
class HeaderEntry:
    """A tensor to be written: its header fields and size (data comes from elsewhere)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def encode_header(entries: Iterable[HeaderEntry], metadata: Mapping[str, str]) -> bytes:
    """The 8-byte length plus JSON header for `entries` laid out back to back, in order.

    The JSON is padded with spaces so the data buffer starts 8-byte aligned, as the
    reference writer does.
    """
    doc: dict[str, object] = {}
    if metadata:
        doc[METADATA_KEY] = dict(metadata)
    offset = 0
    for entry in entries:
        doc[entry.name] = {
            "dtype": entry.dtype,
            "shape": list(entry.shape),
            "data_offsets": [offset, offset + entry.nbytes],
        }
        offset += entry.nbytes
    raw = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw
