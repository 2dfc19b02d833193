"""The wheel reader's own central-directory parser agrees with zipfile on real archives."""

from __future__ import annotations

import io
import zipfile

import pytest

from releasewheel import vllm_wheel
from sparkmods.errors import SparkmodsError
from sparkmods.sources.zipread import MAX_MEMBER_BYTES, ZipMembers


def _agrees(members: ZipMembers, reference: zipfile.ZipFile, sample: int = 0) -> None:
    files = [i for i in reference.infolist() if not i.is_dir()]
    assert members.names() == sorted(i.filename for i in files)
    assert members.central_offset == reference.start_dir
    chosen = files if not sample else files[:: max(1, len(files) // sample)]
    for info in chosen:
        if max(info.file_size, info.compress_size) > MAX_MEMBER_BYTES:  # vLLM's compiled kernels: never read
            with pytest.raises(SparkmodsError, match=f"more than the {MAX_MEMBER_BYTES} a vLLM file may have"):
                members.read(info.filename)
            continue
        assert members.read(info.filename) == reference.read(info)


@pytest.mark.network
def test_real_vllm_wheel_names_offsets_and_members_match_zipfile() -> None:
    wheel = vllm_wheel("0.19.1")
    with wheel.open("rb") as fh, zipfile.ZipFile(wheel) as reference:
        members = ZipMembers("wheel", fh)
        _agrees(members, reference, sample=300)
        start, end = members.span("vllm/__init__.py")
        assert start == reference.getinfo("vllm/__init__.py").header_offset and end > start


def _archive(force_zip64: bool, prefix: bytes = b"") -> bytes:
    buf = io.BytesIO()
    buf.write(prefix)
    with zipfile.ZipFile(buf, "a" if prefix else "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("vllm/", b"")
        for i in range(40):
            with zf.open(f"vllm/m{i}.py", "w", force_zip64=force_zip64) as fh:
                fh.write((f"x = {i}\n" * (i * 50)).encode())
        zf.writestr(zipfile.ZipInfo("vllm/stored.txt"), b"plain")
        zf.writestr("vllm/\u00e9t\u00e9.py", b"utf8 = 1\n")
    return buf.getvalue()


@pytest.mark.parametrize("force_zip64", [False, True])
@pytest.mark.parametrize("prefix", [b"", b"#!/bin/sh\nexit 0\n" * 30])
def test_zip64_records_and_prepended_bytes_match_zipfile(force_zip64: bool, prefix: bytes) -> None:
    data = _archive(force_zip64, prefix)
    _agrees(ZipMembers("x", io.BytesIO(data)), zipfile.ZipFile(io.BytesIO(data)))


def test_a_flipped_byte_in_a_member_fails_its_crc_in_one_line() -> None:
    data = bytearray(_archive(False))
    members = ZipMembers("x", io.BytesIO(bytes(data)))
    start, end = members.span("vllm/stored.txt")
    at = bytes(data).index(b"plain", start, end)
    data[at] ^= 0x20
    with pytest.raises(SparkmodsError, match=r"^x: member vllm/stored.txt failed its CRC-32 check"):
        ZipMembers("x", io.BytesIO(bytes(data))).read("vllm/stored.txt")


@pytest.mark.parametrize("cut", [10, 30, 200])
def test_a_truncated_archive_is_one_line_not_a_traceback(cut: int) -> None:
    data = _archive(False)
    with pytest.raises(SparkmodsError, match=r"^x: not a readable wheel"):
        ZipMembers("x", io.BytesIO(data[:-cut]))


def _sized_archive(sizes: "list[int]") -> bytes:
    """Stored members m0, m1, ... of the given sizes, in that order."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for i, size in enumerate(sizes):
            zf.writestr(f"vllm/m{i}.py", b"#" * size)
    return buf.getvalue()


@pytest.mark.parametrize("reach", [0, 999, 1_100, 5_000, 50_000])
def test_widened_takes_whole_neighbours_within_reach_and_stops_at_a_large_member(reach: int) -> None:
    sizes = [300, 300, 300, 20_000, 300, 300, 300, 300, 300]
    members = ZipMembers("x", io.BytesIO(_sized_archive(sizes)))
    spans = [members.span(f"vllm/m{i}.py") for i in range(len(sizes))]
    start, end = members.widened(spans[5], reach)
    # every member either lies wholly inside the widened span or wholly outside it
    inside = [i for i, (s, e) in enumerate(spans) if start <= s and e <= end]
    assert all(e <= start or s >= end for i, (s, e) in enumerate(spans) if i not in inside)
    assert 5 in inside and inside == list(range(inside[0], inside[-1] + 1))
    assert start >= spans[0][0] and end <= members.central_offset  # never past the central directory
    for i in inside:  # each one taken is within reach of the asked span, and not larger than it
        assert (spans[5][0] - spans[i][0] <= reach and spans[i][1] - spans[5][1] <= reach) or i == 5
        assert spans[i][1] - spans[i][0] <= reach or i == 5
    if reach >= 20_000 + 4 * 400:
        assert inside == list(range(len(sizes)))  # the large member is within reach now
    elif reach >= 4 * 400:
        assert inside == [4, 5, 6, 7, 8]  # m3 (20 kB) stops it to the left; the end of the archive to the right
    if reach == 0:
        assert (start, end) == spans[5]
