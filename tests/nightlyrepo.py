"""A loopback stand-in for vLLM's per-commit wheel repository (the real one is unreachable here).

Laid out like the real thing: `/nightly/vllm/` and `/<commit>/vllm/` each hold an `index.html`
(PEP 503, links relative to the page) and a `metadata.json`; wheels live in `/<commit>/`. Files
are served from a folder with HTTP Range support, as the real file host does.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import zipfile
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator, List, Tuple
from urllib.parse import quote


class _RangeHandler(SimpleHTTPRequestHandler):
    """Static files with single-range GETs answered 206, like an object store."""

    def log_message(self, *args) -> None:
        pass

    def send_head(self):
        path = Path(self.translate_path(self.path))
        if path.is_dir():
            path = path / "index.html"
        header = self.headers.get("Range")
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", header or "")
        if not match or not path.is_file():
            return super().send_head()
        size = path.stat().st_size
        first, last = match.groups()
        start, end = (max(size - int(last), 0), size) if not first else (int(first), min(int(last) + 1 if last else size, size))
        fh = open(path, "rb")  # noqa: SIM115 - send_head returns it; the server closes it
        fh.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        self._remaining = end - start
        return fh

    def copyfile(self, source, outputfile) -> None:
        remaining = getattr(self, "_remaining", None)
        if remaining is None:
            return super().copyfile(source, outputfile)
        while remaining > 0:
            chunk = source.read(min(1 << 20, remaining))
            if not chunk:
                break
            outputfile.write(chunk)
            remaining -= len(chunk)
        self._remaining = None


@contextmanager
def serve(root: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_RangeHandler, directory=str(root)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _entry(wheel: str, version: str, rel_path: str) -> dict:
    return {"package_name": "vllm", "version": version, "build_tag": None, "python_tag": "cp38",
            "abi_tag": "abi3", "platform_tag": "manylinux_2_28_x86_64", "variant": None,
            "filename": wheel, "path": quote(rel_path, safe=":%/")}


def _write_index(folder: Path, wheels: List[Tuple[str, str, str]]) -> None:
    """wheels: (filename, version, path relative to folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    links = "\n".join(f'    <a href="{quote(p, safe=":%/")}">{w}</a><br/>' for w, _, p in wheels)
    (folder / "index.html").write_text(f"<!DOCTYPE html>\n<html>\n  <body>\n{links}\n  </body>\n</html>\n")
    (folder / "metadata.json").write_text(json.dumps([_entry(w, v, p) for w, v, p in wheels], indent=2))


def add_commit(root: Path, commit: str, wheel: Path, version: str, nightly: bool) -> str:
    """Publish a wheel under /<commit>/ (renamed for version) and optionally as /nightly/."""
    name = re.sub(r"^vllm-[^-]+-", f"vllm-{version}-", wheel.name)
    (root / commit).mkdir(parents=True, exist_ok=True)
    if not (root / commit / name).exists():
        shutil.copyfile(wheel, root / commit / name)
    _write_index(root / commit / "vllm", [(name, version, f"../{name}")])
    if nightly:
        _write_index(root / "nightly" / "vllm", [(name, version, f"../../{commit}/{name}")])
    return name


def rebuild_with_edit(wheel: Path, out: Path, member: str, old: bytes, new: bytes) -> None:
    """Copy a real wheel, replacing one member's text; unchanged members keep their bytes.

    The copy is opened for appending, the member's old directory entry is dropped and the edited
    member is written at the end with a fresh central directory: no re-compression of the other
    thousands of files.
    """
    shutil.copyfile(wheel, out)
    with zipfile.ZipFile(out, "a") as zf:
        info = zf.getinfo(member)
        data = zf.read(member)
        assert old in data, f"{member} does not contain {old!r}"
        zf.filelist.remove(info)
        del zf.NameToInfo[member]
        zf.writestr(zipfile.ZipInfo(member, date_time=info.date_time), data.replace(old, new, 1),
                    compress_type=zipfile.ZIP_DEFLATED)
