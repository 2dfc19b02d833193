"""safetensors headers: our reader against files the real library wrote, and every way a
header can be broken; our writer's headers read back by the real library."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

import ckptfactory as cf
from sparkmods.checkpoint.header import (
    HeaderEntry,
    HeaderError,
    encode_header,
    read_header,
    tensor_nbytes,
)

SPECS = [
    cf.Spec("a.weight", "F8_E4M3", (3, 5)),
    cf.Spec("a.weight_scale_inv", "F32", (1, 1)),
    cf.Spec("b.weight", "BF16", (4, 2)),
    cf.Spec("c.qweight", "I32", (2, 8)),
]


def test_reads_what_the_library_wrote(tmp_path: Path) -> None:
    path = cf.write_safetensors(tmp_path / "x.safetensors", SPECS, metadata={"format": "pt"})
    header = read_header(path)
    truth = cf.read_tensors(path)
    assert header.metadata == {"format": "pt"}
    assert set(header.tensors) == set(truth)
    raw = path.read_bytes()
    for name, info in header.tensors.items():
        dtype, shape, data = truth[name]
        assert (info.dtype, info.shape) == (dtype, shape)
        assert raw[info.start:info.end] == data  # absolute offsets point at the data
    assert header.file_size == len(raw)


def test_encode_header_is_read_back_by_the_library(tmp_path: Path) -> None:
    entries = [HeaderEntry(s.name, s.dtype, s.shape, s.nbytes) for s in SPECS]
    blobs = [bytes([i]) * s.nbytes for i, s in enumerate(SPECS)]
    prefix = encode_header(entries, {"format": "pt"})
    assert (len(prefix) - 8) % 8 == 0  # data buffer starts 8-byte aligned
    path = tmp_path / "ours.safetensors"
    path.write_bytes(prefix + b"".join(blobs))
    back = cf.read_tensors(path)
    assert [back[s.name] for s in SPECS] == [(s.dtype, s.shape, b) for s, b in zip(SPECS, blobs)]


def _raw_file(path: Path, header: object, data: bytes = b"", size: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if size is None else size) + raw + data)
    return path


@pytest.mark.parametrize(
    "header, data, message",
    [
        ({"t": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}, b"x", "unknown dtype 'Q9'"),
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"x" * 4, "needs 8 bytes"),
        ({"t": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, b"x", "past the end"),
        ({"t": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}, b"", "bad shape"),
        ({"t": {"dtype": "U8", "shape": [2], "data_offsets": [2, 0]}}, b"xx", "bad data_offsets"),
        (
            {"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
             "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}},
            b"xxx", "overlap",
        ),
        ({"__metadata__": {"k": 1}}, b"", "__metadata__"),
        ([1, 2], b"", "not a JSON object"),
    ],
)
def test_broken_headers_are_one_clear_line(tmp_path: Path, header: object, data: bytes, message: str) -> None:
    path = _raw_file(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(HeaderError, match=message) as err:
        read_header(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_truncated_and_tiny_files(tmp_path: Path) -> None:
    (tmp_path / "tiny.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(HeaderError, match="no header"):
        read_header(tmp_path / "tiny.safetensors")
    path = _raw_file(tmp_path / "cut.safetensors", {}, size=10_000)
    with pytest.raises(HeaderError, match="truncated"):
        read_header(path)
    (tmp_path / "junk.safetensors").write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{}")
    with pytest.raises(HeaderError, match="not valid JSON"):
        read_header(tmp_path / "junk.safetensors")


def test_header_of_a_64gb_file_is_read_without_touching_the_data(tmp_path: Path) -> None:
    """A sparse 64 GB shard: reading it costs the header, not the data."""
    n = 64 << 30
    path = _raw_file(tmp_path / "huge.safetensors", {"w": {"dtype": "BF16", "shape": [n // 2], "data_offsets": [0, n]}})
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size + n)
    start = time.perf_counter()
    header = read_header(path)
    assert time.perf_counter() - start < 2  # reading 64 GB would take minutes
    assert header.tensors["w"].nbytes == n


def test_sub_byte_dtypes() -> None:
    assert tensor_nbytes("F4", [3, 4]) == 6
    with pytest.raises(ValueError):
        tensor_nbytes("F4", [3])
