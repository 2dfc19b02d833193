"""Hostile package servers on loopback (the kit's index with per-path routes): hashes that are
paths, wheels served under another wheel's hash (cache poisoning), gzip bombs, malformed PEP 691
JSON, servers that trickle. Each is one line naming the URL (exit 2 through the CLI), never a
traceback, a hang, a write outside the cache, or a poisoned entry used again."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest

from clirun import one_line_error, sparkmods, sparkmods_peak_rss
from modfactory import make_mod
from sparkmods.errors import SparkmodsError
from sparkmods.sources import open_targets
from sparkmods.sources.http import MAX_PAGE_BYTES
from sparkmods.sources.remote import RemoteWheel
from test_sources_kit import JSON_TYPE, A, B, LoopbackIndex, fresh_cache, loopback_index, make_wheel, wheel_files  # noqa: F401

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


def files_outside(root: Path, cache: Path) -> List[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and cache not in p.parents)


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


# --- 1. the sha256 names the cache folder ------------------------------------------------------

@pytest.mark.parametrize("bad", ["../../..", "/tmp/sparkmods-evil", "A" * 64, "0" * 63, "0" * 64 + "/.."])
def test_a_sha256_that_is_not_64_lowercase_hex_digits_is_refused(loopback_index, tmp_path, fresh_cache, bad):
    loopback_index.add(make_wheel(tmp_path / NAME, "0.19.1"))
    loopback_index.sha_override[NAME] = bad
    before = files_outside(tmp_path, fresh_cache)
    with pytest.raises(SparkmodsError) as err:
        open_targets("0.19.1", index_url=simple(loopback_index))
    assert str(err.value) == (f"{simple(loopback_index)}/vllm/: {NAME} (vllm 0.19.1): sha256 {bad!r} is not "
                              f"64 lowercase hex digits; refusing this index")
    assert files_outside(tmp_path, fresh_cache) == before and not (fresh_cache / "wheels-v2").exists()
    assert not Path("/tmp/sparkmods-evil").exists()


def test_the_html_page_hash_is_checked_too_and_the_cli_says_it_in_one_line(loopback_index, tmp_path, fresh_cache):
    loopback_index.add(make_wheel(tmp_path / NAME, "0.19.1"))
    loopback_index.sha_override[NAME] = "../../../../tmp"
    done, _ = check_cli(loopback_index, tmp_path)
    line = one_line_error(done)
    assert f"/simple/vllm/: {NAME} (vllm 0.19.1): sha256 '../../../../tmp' is not 64 lowercase" in line
    assert not (fresh_cache / "wheels-v2").exists()


def test_a_remote_wheel_never_takes_a_bad_hash_as_a_folder_name(fresh_cache):
    """The same check where the folder is named, whoever builds the source."""
    with pytest.raises(SparkmodsError, match=r"sha256 '\.\./x' for http://h/w\.whl is not 64 lowercase hex"):
        RemoteWheel("pypi:0.19.1", "0.19.1", "http://h/w.whl", filename="w.whl", sha256="../x")


# --- 2. range reads tie the cache entry to what was read ---------------------------------------

def _poison(index: LoopbackIndex, tmp_path: Path, monkeypatch, html: bool = False) -> bytes:
    """Run 1 against a lying server (it serves another build's bytes under X's hash), then make
    the server honest. Returns X's bytes. Both wheels are stored zips of the same size."""
    for side in ("x", "y"):
        (tmp_path / side).mkdir()
    honest = make_wheel(tmp_path / "x" / NAME, "0.19.1", stored=True).read_bytes()
    other = make_wheel(tmp_path / "y" / NAME, "0.19.0", stored=True).read_bytes()
    assert len(honest) == len(other) and honest != other
    if html:
        monkeypatch.setattr("sparkmods.sources.index.ACCEPT", "text/html")
    index.wheels[NAME] = other
    index.sha_override[NAME] = hashlib.sha256(honest).hexdigest()
    [lied] = open_targets("0.19.1", index_url=simple(index))
    assert lied.read(A) == wheel_files("0.19.0")[A]  # range reads cannot see the lie yet
    index.wheels[NAME] = honest
    index.sha_override.clear()
    return honest


def _refused(source, path: str) -> str:
    with pytest.raises(SparkmodsError) as err:
        source.read(path)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_an_index_that_lists_another_size_refuses_the_entry_for_good(loopback_index, tmp_path, monkeypatch):
    honest = _poison(loopback_index, tmp_path, monkeypatch)
    loopback_index.size_override[NAME] = len(honest) + 1  # as if the honest wheel were another size
    [source] = open_targets("latest", index_url=simple(loopback_index))  # a fresh listing, not the liar's
    message = _refused(source, A)
    assert re.search(rf"refusing the cache entry .*wheels-v2/{source.sha256}: the index lists {len(honest) + 1} "
                     rf"bytes, an earlier read from {loopback_index.url}/files/{NAME} got {len(honest)} ", message)
    [offline] = open_targets("0.19.1", index_url=simple(loopback_index), offline=True)
    assert "the index lists" in _refused(offline, A)  # marked: never used again, not even offline


def test_a_central_directory_seen_again_with_other_bytes_is_a_conflict_not_a_hit(loopback_index, tmp_path,
                                                                                monkeypatch):
    """PEP 503 pages list no size: the lie shows once a member must be fetched."""
    _poison(loopback_index, tmp_path, monkeypatch, html=True)
    hits = len(loopback_index.file_hits())
    [source] = open_targets("0.19.1", index_url=simple(loopback_index))
    message = _refused(source, B)
    assert "the central directory from" in message and "differs from the one an earlier read" in message
    [cached] = open_targets("0.19.1", index_url=simple(loopback_index))
    assert "differs" in _refused(cached, A)  # A was cached by the lying run: refused, not served
    assert len(loopback_index.file_hits()) == hits + 1  # one look at the central directory, no member


def test_a_verified_download_that_contradicts_earlier_range_reads_is_a_conflict(loopback_index, tmp_path,
                                                                               monkeypatch, fresh_cache):
    _poison(loopback_index, tmp_path, monkeypatch, html=True)
    loopback_index.honour_range = False
    [source] = open_targets("0.19.1", index_url=simple(loopback_index))
    assert "the downloaded wheel from" in _refused(source, B)
    assert not list(fresh_cache.rglob("wheel.whl"))


def test_an_honest_second_run_still_costs_nothing(loopback_index, tmp_path):
    """The binding adds no request to a cached run."""
    loopback_index.add(make_wheel(tmp_path / NAME, "0.19.1"))
    [first] = open_targets("0.19.1", index_url=simple(loopback_index))
    first.read(A)
    hits = len(loopback_index.hits)
    [again] = open_targets("0.19.1", index_url=simple(loopback_index))
    assert again.read(A) == wheel_files("0.19.1")[A] and len(loopback_index.hits) == hits
    assert again.read(B) == wheel_files("0.19.1")[B]
    assert len(loopback_index.hits) == hits + 2  # B, plus one look at the server's central directory


# --- 3. index pages: bounded, and checked key by key -------------------------------------------

def test_a_gzip_bomb_is_refused_after_the_cap_not_decoded_to_the_end(loopback_index, tmp_path):
    member = gzip.compress(bytes(1 << 20))
    bomb = member * 1024  # 1 GiB decoded from about 1 MB on the wire
    loopback_index.routes["/simple/vllm/"] = page_route(bomb, encoding="gzip")
    done, peak_kib = sparkmods_peak_rss(*check_args(loopback_index, tmp_path))
    assert one_line_error(done) == (f"sparkmods: error: {simple(loopback_index)}/vllm/: the gzip body decodes "
                                    f"to more than {MAX_PAGE_BYTES} bytes; refusing it")
    assert peak_kib < 512 * 1024  # never near the 1 GiB the body decodes to


@pytest.mark.parametrize("doc, problem", [
    ({"meta": {"api-version": "1.1"}, "files": [1]}, "files[0] is a number, want an object"),
    ({"files": [{"filename": NAME, "url": NAME, "hashes": "x"}]}, "files[0].hashes is a string, want an object"),
    ({"files": [{"filename": NAME, "hashes": {}}]}, "files[0].url is null, want a string"),
    ({"files": [{"filename": NAME, "url": NAME, "hashes": {"sha256": 5}}]},
     "files[0].hashes.sha256 is a number, want a string"),
    ({"files": [{"filename": NAME, "url": NAME, "hashes": {}, "size": "12"}]},
     "files[0].size is a string, want a number of bytes"),
    ({"files": [{"filename": NAME, "url": NAME, "hashes": {}, "size": True}]},
     "files[0].size is true, want a number of bytes"),
    ({"files": [{"filename": NAME, "url": NAME, "hashes": {}, "yanked": 3}]},
     "files[0].yanked is a number, want true, false or a reason"),
    ({"meta": []}, "meta is a list, want an object"),
    ({"meta": {}}, "files is null, want a list"),
    ([], "the document is a list, want an object"),
], ids=["files-1", "hashes-x", "no-url", "sha-number", "size-text", "size-bool", "yanked-3", "meta-list",
        "no-files", "top-list"])
def test_malformed_pep691_json_is_one_line_naming_the_page(loopback_index, doc, problem):
    loopback_index.routes["/simple/vllm/"] = page_route(json.dumps(doc).encode())
    with pytest.raises(SparkmodsError) as err:
        open_targets("0.19.1", index_url=simple(loopback_index))
    assert str(err.value) == f"{simple(loopback_index)}/vllm/: not a valid PEP 691 project page: {problem}"


@pytest.mark.parametrize("body, fragment", [
    (b"{nope", "not JSON (Expecting property name"),
    (b"[" * 200_000 + b"]" * 200_000, "not JSON (maximum recursion depth"),
], ids=["syntax", "nesting-bomb"])
def test_a_page_that_is_not_json_through_the_cli(loopback_index, tmp_path, body, fragment):
    loopback_index.routes["/simple/vllm/"] = page_route(body)
    done, _ = check_cli(loopback_index, tmp_path)
    assert f"/simple/vllm/: not a valid PEP 691 project page: {fragment}" in one_line_error(done)


# --- 4. an overall deadline per request ----------------------------------------------------------

def _wheel_trickle(index: LoopbackIndex) -> Route:
    """Range answers for the wheel, right headers, body one byte every 0.2 s."""
    data = index.wheels[NAME]

    def answer(handler: BaseHTTPRequestHandler) -> None:
        size = int(re.fullmatch(r"bytes=-(\d+)", handler.headers["Range"]).group(1))
        head = http_head("206 Partial Content", {"Content-Range": f"bytes {len(data) - size}-{len(data) - 1}/"
                                                                  f"{len(data)}"}, size)
        raw_answer(head, data[-size:], pause=0.2)(handler)
    return answer


@pytest.mark.parametrize("where", ["status line", "page body", "wheel range"])
def test_a_trickling_server_is_cut_off_at_the_deadline(loopback_index, tmp_path, where):
    loopback_index.add(make_wheel(tmp_path / NAME, "0.19.1"))
    if where == "wheel range":
        loopback_index.routes[f"/files/{NAME}"] = _wheel_trickle(loopback_index)
        url = f"{loopback_index.url}/files/{NAME}"
    else:
        loopback_index.routes["/simple/vllm/"] = page_route(loopback_index.page_json(), pause=0.2,
                                                            slow_head=where == "status line")
        url = f"{simple(loopback_index)}/vllm/"
    done, seconds = check_cli(loopback_index, tmp_path, env={"SPARKMODS_HTTP_DEADLINE": "1.5"})
    assert url in one_line_error(done)
    assert done.stderr.strip().endswith("no complete answer within 1.5 s (a stalled or trickling server; "
                                        "SPARKMODS_HTTP_DEADLINE sets the limit)")
    assert seconds < 10  # the trickle alone would take 15 s, and forever without its own cap


@pytest.mark.parametrize("value", ["soon", "0", "-3", "inf", "nan"])
def test_a_bad_deadline_setting_is_one_line(loopback_index, tmp_path, value):
    loopback_index.add(make_wheel(tmp_path / NAME, "0.19.1"))
    done, _ = check_cli(loopback_index, tmp_path, env={"SPARKMODS_HTTP_DEADLINE": value})
    assert one_line_error(done) == (f"sparkmods: error: SPARKMODS_HTTP_DEADLINE={value!r}: want a number of "
                                    f"seconds > 0, e.g. 300")
