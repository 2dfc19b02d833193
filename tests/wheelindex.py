"""Real wheel zips built with zipfile, and a loopback package index (http.server on 127.0.0.1)
that speaks PEP 503 HTML and PEP 691 JSON and serves files with or without HTTP Range support.
The fixtures over them (loopback_index, fresh_cache) are in conftest.py."""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import json
import random
import re
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

JSON_TYPE = "application/vnd.pypi.simple.v1+json"

# Member layout of make_wheel: A and B are adjacent (one coalesced request), FAR sits past a
# 3 MiB incompressible filler (larger than the first tail fetch and than the read-ahead, as a
# vLLM wheel's shared libraries are), close to the central directory (inside the tail fetch).
A = "vllm/model_executor/layers/logits_processor.py"
B = "vllm/model_executor/layers/quantization/inc.py"
FAR = "vllm/platforms/cuda.py"
FILLER = "vllm/_C.abi3.so"


def module_text(version: str, name: str) -> bytes:
    """A Python module whose content differs per version and file (so mix-ups show)."""
    lines = [f'"""{name} of vLLM {version}."""', ""] + [f"CONSTANT_{i} = {i * 7}  # {version}" for i in range(200)]
    return ("\n".join(lines) + "\n").encode()


def wheel_files(version: str) -> Dict[str, bytes]:
    """The vllm/ files make_wheel puts in every wheel, in zip order."""
    return {"vllm/__init__.py": f'__version__ = "{version}"\n'.encode(), A: module_text(version, A),
            B: module_text(version, B)}


def record_line(name: str, data: bytes) -> str:
    """A RECORD row as bdist_wheel writes it: path, sha256 (urlsafe base64, no padding), size."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def make_wheel(path: Path, version: str, *, zip64: bool = False, stored: bool = False,
               extra: Optional[Dict[str, bytes]] = None, record: Optional[Dict[str, bytes]] = None) -> Path:
    """A real wheel zip: vllm files, a binary filler, FAR, dist-info (METADATA, WHEEL, RECORD).

    zip64=True adds 70 000 empty entries, past the 65 535 a classic end record can count, so
    zipfile writes the zip64 end of central directory; the vllm files then also carry zip64
    local headers. stored=True keeps members uncompressed (so a flipped byte reaches the CRC).
    RECORD lists every file's sha256 as a real wheel's does; `record` overrides what it says
    a file holds (a lying RECORD), and a None value leaves the file out of it.
    """
    compression = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    rng = random.Random(version)
    dist = f"vllm-{version}.dist-info"
    written: Dict[str, bytes] = {}
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        def put(info: zipfile.ZipInfo, data: bytes, **kw) -> None:
            zf.writestr(info, data, **kw)
            written[info.filename] = data

        for name, data in wheel_files(version).items():
            with zf.open(zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0)), "w", force_zip64=zip64) as out:
                out.write(data)
            written[name] = data
        put(zipfile.ZipInfo(FILLER), rng.randbytes(3 << 20), compress_type=zipfile.ZIP_STORED)
        put(zipfile.ZipInfo(FAR, (1980, 1, 1, 0, 0, 0)), module_text(version, FAR), compress_type=compression)
        for name, data in (extra or {}).items():
            put(zipfile.ZipInfo(name), data)
        if zip64:
            for i in range(70_000):
                zf.writestr(zipfile.ZipInfo(f"vllm/_many/m{i:05d}.txt"), b"", compress_type=zipfile.ZIP_STORED)
        put(zipfile.ZipInfo(f"{dist}/METADATA"),
            f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n\nA test wheel.\n".encode(),
            compress_type=compression)
        put(zipfile.ZipInfo(f"{dist}/WHEEL"),
            b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp38-abi3-manylinux_2_28_x86_64\n",
            compress_type=compression)
        claimed = {**written, **(record or {})}
        rows = "".join(record_line(n, d) for n, d in claimed.items() if d is not None)
        zf.writestr(f"{dist}/RECORD", rows + f"{dist}/RECORD,,\n")
    return path


def flip_byte_in_member(path: Path, name: str) -> None:
    """Corrupt one byte of a stored member's data in place (its CRC-32 no longer matches)."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(name)
    raw = bytearray(path.read_bytes())
    name_len, extra_len = int.from_bytes(raw[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(raw[info.header_offset + 28:info.header_offset + 30], "little")
    data_at = info.header_offset + 30 + name_len + extra_len
    raw[data_at + 10] ^= 0xFF
    path.write_bytes(bytes(raw))


@dataclass
class Hit:
    path: str
    range: Optional[str]
    status: int
    sent: int  # body bytes


@dataclass
class LoopbackIndex:
    """A package index on 127.0.0.1: /simple/vllm/ (JSON or HTML by Accept), /nightly/vllm/ (HTML
    only, relative links), /files/NAME (Range honoured unless honour_range is False)."""

    wheels: Dict[str, bytes] = field(default_factory=dict)  # filename -> bytes
    nightly: List[str] = field(default_factory=list)  # filenames listed on /nightly/vllm/
    yanked: set = field(default_factory=set)
    sha_override: Dict[str, str] = field(default_factory=dict)
    size_override: Dict[str, int] = field(default_factory=dict)
    honour_range: bool = True
    # path -> a function that answers the request itself (hostile servers: trickles, bombs, bad JSON)
    routes: Dict[str, Callable[[BaseHTTPRequestHandler], None]] = field(default_factory=dict)
    hits: List[Hit] = field(default_factory=list)
    url: str = ""

    def add(self, path: Path, nightly: bool = False) -> str:
        self.wheels[path.name] = path.read_bytes()
        if nightly:
            self.nightly.append(path.name)
        return path.name

    def sha256(self, name: str) -> str:
        return self.sha_override.get(name) or hashlib.sha256(self.wheels[name]).hexdigest()

    def file_hits(self) -> List[Hit]:
        return [h for h in self.hits if h.path.startswith("/files/")]

    def page_json(self) -> bytes:
        files = [{"filename": n, "url": f"../../files/{n}", "hashes": {"sha256": self.sha256(n)},
                  "size": self.size_override.get(n, len(d)), "yanked": n in self.yanked}
                 for n, d in sorted(self.wheels.items()) if n not in self.nightly]
        return json.dumps({"meta": {"api-version": "1.1"}, "name": "vllm", "files": files}).encode()

    def page_html(self, names: List[str]) -> bytes:
        yanked = ' data-yanked=""'
        links = "\n".join(f'<a href="../../files/{n.replace("+", "%2B")}#sha256={self.sha256(n)}"'
                          f'{yanked if n in self.yanked else ""}>{n}</a><br/>' for n in names)
        return f"<!DOCTYPE html>\n<html><body>\n<h1>Links for vllm</h1>\n{links}\n</body></html>\n".encode()


def _handler(index: LoopbackIndex):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like a real file host

        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, body: bytes, headers: Dict[str, str]) -> None:
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            # Recorded before the body goes out: the client may assert on hits as soon as it has it.
            index.hits.append(Hit(self.path, self.headers.get("Range"), status, len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path in index.routes:
                index.hits.append(Hit(self.path, self.headers.get("Range"), 0, 0))
                return index.routes[path](self)
            if path == "/simple/vllm/":
                if JSON_TYPE in (self.headers.get("Accept") or ""):
                    if "gzip" in (self.headers.get("Accept-Encoding") or ""):  # as PyPI's CDN does
                        return self._send(200, gzip.compress(index.page_json()),
                                          {"Content-Type": JSON_TYPE, "Content-Encoding": "gzip"})
                    return self._send(200, index.page_json(), {"Content-Type": JSON_TYPE})
                names = [n for n in sorted(index.wheels) if n not in index.nightly]
                return self._send(200, index.page_html(names), {"Content-Type": "text/html"})
            if path == "/nightly/vllm/":
                return self._send(200, index.page_html(index.nightly), {"Content-Type": "text/html"})
            if path.startswith("/files/"):
                name = path[len("/files/"):].replace("%2B", "+")
                data = index.wheels.get(name)
                if data is None:
                    return self._send(404, b"no such file", {})
                span = _range(self.headers.get("Range"), len(data)) if index.honour_range else None
                if span is None:
                    return self._send(200, data, {"Content-Type": "application/octet-stream"})
                start, end = span
                return self._send(206, data[start:end], {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}"})
            return self._send(404, b"not found", {})

    return Handler


def _range(header: Optional[str], size: int) -> Optional[Tuple[int, int]]:
    match = re.fullmatch(r"bytes=(\d*)-(\d*)", header or "")
    if not match:
        return None
    first, last = match.groups()
    if not first:
        return max(size - int(last), 0), size
    return int(first), min(int(last) + 1 if last else size, size)


@contextlib.contextmanager
def serving(index: LoopbackIndex) -> Iterator[LoopbackIndex]:
    """index served on 127.0.0.1 (index.url set) until the block ends: a second server beside
    the fixture's, e.g. a hostile index and the real one."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(index))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    index.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield index
    finally:
        server.shutdown()
        server.server_close()
