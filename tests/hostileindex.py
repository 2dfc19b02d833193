"""Hostile answers for the loopback index (tests/wheelindex.py): exact HTTP bytes, trickled one at a
time, and `sparkmods check` run against such an index."""

from __future__ import annotations

import re
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Callable, Dict, List, Optional

from clirun import sparkmods
from modfactory import make_mod
from wheelindex import JSON_TYPE, LoopbackIndex

NAME = "vllm-0.19.1-cp38-abi3-manylinux_2_28_x86_64.whl"
Route = Callable[[BaseHTTPRequestHandler], None]


def simple(index: LoopbackIndex) -> str:
    return f"{index.url}/simple"


def check_args(index: LoopbackIndex, tmp_path: Path) -> List[str]:
    """`check demo --vllm 0.19.1` against the index (the demo mod made under tmp_path once)."""
    mods = tmp_path / "mods"
    if not (mods / "demo").is_dir():
        make_mod(mods)
    return ["check", "demo", "--mods-dir", str(mods), "--vllm", "0.19.1", "--index-url", simple(index)]


def check_cli(index: LoopbackIndex, tmp_path: Path, env: Optional[Dict[str, str]] = None):
    """`sparkmods check demo --vllm 0.19.1` against the index, in a subprocess."""
    return sparkmods(*check_args(index, tmp_path), env=env, timeout=60)


def raw_answer(head: bytes, body: bytes, pause: float = 0.0, slow_head: bool = False) -> Route:
    """A route that writes an exact HTTP answer; with pause, one byte at a time (at most 15 s)."""
    def answer(handler: BaseHTTPRequestHandler) -> None:
        out = head + body
        try:
            if not pause:
                handler.wfile.write(out)
                return
            fast = 0 if slow_head else len(head)
            handler.wfile.write(out[:fast])
            for i in range(fast, min(len(out), fast + int(15 / pause))):
                handler.wfile.write(out[i:i + 1])
                handler.wfile.flush()
                time.sleep(pause)
        except OSError:
            pass  # the client gave up: what the deadline is for
        handler.close_connection = True
    return answer


def http_head(status: str, headers: Dict[str, str], length: int) -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers.items()), f"Content-Length: {length}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def page_route(body: bytes, content_type: str = JSON_TYPE, encoding: str = "", **trickle) -> Route:
    headers = {"Content-Type": content_type, **({"Content-Encoding": encoding} if encoding else {})}
    return raw_answer(http_head("200 OK", headers, len(body)), body, **trickle)


def wheel_trickle(index: LoopbackIndex) -> Route:
    """Range answers for the wheel, right headers, body one byte every 0.2 s."""
    data = index.wheels[NAME]

    def answer(handler: BaseHTTPRequestHandler) -> None:
        size = int(re.fullmatch(r"bytes=-(\d+)", handler.headers["Range"]).group(1))
        head = http_head("206 Partial Content", {"Content-Range": f"bytes {len(data) - size}-{len(data) - 1}/"
                                                                  f"{len(data)}"}, size)
        raw_answer(head, data[-size:], pause=0.2)(handler)
    return answer
