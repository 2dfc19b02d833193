"""What a wheel or its server claims is bounded before anything is read or inflated (issue 30,
item 7): a member that inflates far past the size its entry lists (a 46 MB wheel's 1000:1
member took 4.2 GB), a member that lists more than any vLLM file has, a central directory or a
member's byte span of gigabytes on a server that claims a 3 GB file. Each is one line, exit 2,
and the process stays small (peak RSS measured on the real command)."""

from __future__ import annotations

import re
import struct
import zipfile
import zlib
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Dict, List

import pytest

from clirun import one_line_error, sparkmods_peak_rss
from modfactory import ORIGINAL, TARGET
from sparkmods.sources.zipread import MAX_CENTRAL_BYTES, MAX_MEMBER_BYTES
from test_sources_kit import fresh_cache, loopback_index, make_wheel  # noqa: F401

NAME = "vllm-0.19.1-cp38-abi3-manylinux_2_28_x86_64.whl"
SMALL_RSS_KIB = 200 * 1024  # the command itself needs well under this


def _central_entry(raw: bytes, name: str) -> int:
    """Offset of name's central directory record in a (classic, not zip64) zip's bytes."""
    at = struct.unpack_from("<L", raw, raw.rindex(b"PK\x05\x06") + 16)[0]
    while True:
        n, m, k = struct.unpack_from("<3H", raw, at + 28)
        if raw[at + 46:at + 46 + n] == name.encode():
            return at
        at += 46 + n + m + k


def bomb_wheel(path: Path, inflated: int, listed: int) -> Path:
    """A wheel whose TARGET deflates `inflated` zero bytes, its entries listing `listed` bytes."""
    make_wheel(path, "0.19.1", extra={TARGET: ORIGINAL.encode()})
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("vllm/bomb.py", b"\0" * inflated)
    raw = bytearray(path.read_bytes())
    at = _central_entry(bytes(raw), "vllm/bomb.py")
    struct.pack_into("<L", raw, at + 24, listed)  # uncompressed size in the central directory
    path.write_bytes(bytes(raw))
    return path


def check_reading(tmp_path: Path, target: str, *extra: str):
    """`sparkmods check-patch` of a patch to vllm/bomb.py on target, with its peak RSS (KiB)."""
    patch = tmp_path / "bomb.patch"
    patch.write_text("--- a/vllm/bomb.py\n+++ b/vllm/bomb.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    return sparkmods_peak_rss("check-patch", str(patch), "--vllm", target, *extra, timeout=120)


@pytest.mark.parametrize("inflated, listed, message", [
    (400 << 20, 1000, "member vllm/bomb.py inflates past the 1000 bytes its entry lists; the wheel is corrupt or "
                      "hostile"),
    (MAX_MEMBER_BYTES + 1, MAX_MEMBER_BYTES + 1,
     f"member vllm/bomb.py lists {MAX_MEMBER_BYTES + 1} bytes, more than the {MAX_MEMBER_BYTES} a vLLM file may "
     "have; refusing to read it"),
], ids=["1000-to-1 bomb", "listed too large"])
def test_a_local_wheel_member_past_its_bounds_is_one_line_and_small(tmp_path, inflated, listed, message):
    wheel = bomb_wheel(tmp_path / NAME, inflated, listed)
    done, peak = check_reading(tmp_path, f"wheel:{wheel}")
    assert one_line_error(done) == f"sparkmods: error: wheel:{wheel}: {message}"
    assert peak < SMALL_RSS_KIB, peak


def test_a_remote_bomb_is_one_line_and_small(loopback_index, tmp_path):
    loopback_index.add(bomb_wheel(tmp_path / NAME, 400 << 20, 1000))
    done, peak = check_reading(tmp_path, "0.19.1", "--index-url", f"{loopback_index.url}/simple")
    assert one_line_error(done).endswith("member vllm/bomb.py inflates past the 1000 bytes its entry lists; "
                                         "the wheel is corrupt or hostile")
    assert peak < SMALL_RSS_KIB, peak


# --- a server that claims a 3 GB file ----------------------------------------------------------

CLAIMED = 3 << 30


def sparse_route(segments: Dict[int, bytes], size: int, asked: List[str]):
    """Range answers for a file of `size` bytes holding `segments` (offset -> bytes) and zeros
    elsewhere, produced as they are sent (the test never holds gigabytes either)."""
    def answer(handler: BaseHTTPRequestHandler) -> None:
        spec = handler.headers.get("Range") or ""
        asked.append(spec)
        first, last = re.fullmatch(r"bytes=(\d*)-(\d*)", spec).groups()
        start, end = (size - int(last), size) if not first else (int(first), min(int(last) + 1, size))
        handler.send_response(206)
        handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        handler.send_header("Content-Length", str(end - start))
        handler.end_headers()
        try:
            pos = start
            while pos < end:
                chunk = bytearray(min(end - pos, 1 << 20))
                for at, data in segments.items():
                    lo, hi = max(at, pos), min(at + len(data), pos + len(chunk))
                    if lo < hi:
                        chunk[lo - pos:hi - pos] = data[lo - at:hi - at]
                handler.wfile.write(chunk)
                pos += len(chunk)
        except OSError:
            pass  # the client gave up
        handler.close_connection = True
    return answer


def _eocd(entries: int, cd_size: int, cd_offset: int) -> bytes:
    return struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, entries, entries, cd_size, cd_offset, 0)


def _central_record(name: str, offset: int, size: int) -> bytes:
    raw = name.encode()
    return struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, zlib.crc32(b"x" * size), size, size,
                       len(raw), 0, 0, 0, 0, 0, offset) + raw


def _serve_claimed(index, tmp_path: Path, segments: Dict[int, bytes]) -> List[str]:
    """The index lists a 0.19.1 wheel of CLAIMED bytes served sparsely; returns the Range log."""
    asked: List[str] = []
    index.wheels[NAME] = b""  # listed on the page (its size and hash overridden below)
    index.size_override[NAME] = CLAIMED
    index.sha_override[NAME] = "0" * 64
    index.routes[f"/files/{NAME}"] = sparse_route(segments, CLAIMED, asked)
    return asked


def test_a_claimed_huge_central_directory_is_refused_before_it_is_asked_for(loopback_index, tmp_path):
    cd_size = 2 << 30
    asked = _serve_claimed(loopback_index, tmp_path, {CLAIMED - 22: _eocd(1, cd_size, CLAIMED - 22 - cd_size)})
    done, peak = check_reading(tmp_path, "0.19.1", "--index-url", f"{loopback_index.url}/simple")
    assert one_line_error(done).endswith(f"not a readable wheel (its central directory claims {cd_size} bytes, "
                                         f"more than the {MAX_CENTRAL_BYTES} a vLLM wheel's needs)")
    assert len(asked) == 1 and peak < SMALL_RSS_KIB, (asked, peak)


def test_a_member_whose_span_is_gigabytes_is_refused_before_it_is_asked_for(loopback_index, tmp_path):
    body = b"x" * 6
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, zlib.crc32(body), 6, 6, 12, 0) + b"vllm/bomb.py"
    records = _central_record("vllm/bomb.py", 0, 6) + _central_record("vllm/far.py", 2 << 30, 6)
    cd_offset = CLAIMED - 22 - len(records)
    asked = _serve_claimed(loopback_index, tmp_path, {0: local + body, cd_offset: records + _eocd(2, len(records), cd_offset)})
    done, peak = check_reading(tmp_path, "0.19.1", "--index-url", f"{loopback_index.url}/simple")
    assert one_line_error(done).endswith(f"member vllm/bomb.py spans {2 << 30} bytes of the wheel, more than the "
                                         f"{MAX_MEMBER_BYTES} a vLLM file may take; refusing the wheel")
    assert len(asked) == 1 and peak < SMALL_RSS_KIB, (asked, peak)
