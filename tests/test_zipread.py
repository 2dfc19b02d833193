"""The wheel reader's own central-directory parser agrees with zipfile on real archives."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from sparkmods.errors import SparkmodsError
from sparkmods.sources.zipread import ZipMembers

WHEEL = Path.home() / ".cache" / "sparkmods" / "test-wheels" / "vllm-0.19.1-cp38-abi3-manylinux_2_31_x86_64.whl"


def _agrees(members: ZipMembers, reference: zipfile.ZipFile, sample: int = 0) -> None:
    files = [i for i in reference.infolist() if not i.is_dir()]
    assert members.names() == sorted(i.filename for i in files)
    assert members.central_offset == reference.start_dir
    chosen = files if not sample else files[:: max(1, len(files) // sample)]
    for info in chosen:
        assert members.read(info.filename) == reference.read(info)


@pytest.mark.skipif(not WHEEL.is_file(), reason="the sources tests download the vLLM 0.19.1 wheel")
def test_real_vllm_wheel_names_offsets_and_members_match_zipfile() -> None:
    with WHEEL.open("rb") as fh, zipfile.ZipFile(WHEEL) as reference:
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
