"""The result cache: a row stored under everything it is a function of comes back exactly as
checked (verdict, files, hunks), without reading the wheel; anything else is checked again.

Real wheels: the network tier compares checked and reused rows of the real mods on real vLLM
releases from PyPI; the fast tier uses real wheel zips on a loopback index.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import pytest

from modfactory import ORIGINAL, TARGET, make_mod, make_site
from sparkmods import resultcache
from sparkmods.check import check_mods
from sparkmods.cli import main
from sparkmods.sources import open_targets
from test_sources_kit import fresh_cache, loopback_index, make_wheel  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
WHEEL = "vllm-{v}-cp38-abi3-manylinux_2_28_x86_64.whl"


def check_json(capsys, *args: str) -> dict:
    code = main(["check", "--json", *args])
    doc = json.loads(capsys.readouterr().out)
    doc["code"] = code
    return doc


def entries(cache: Path) -> List[Path]:
    return sorted((cache / "results-v2").glob("*.json"))


@pytest.fixture
def two_wheels(loopback_index, tmp_path):
    """Mods `demo` (applies) and `broken` (conflicts) and two releases on a loopback index."""
    make_mod(tmp_path / "mods", "demo")
    make_mod(tmp_path / "mods", "broken",
             patch=f"--- a/{TARGET}\n+++ b/{TARGET}\n@@ -1,2 +1,2 @@\n-no such line\n+x\n context that is not there\n")
    for version in ("0.19.1", "0.20.0"):
        loopback_index.add(make_wheel(tmp_path / WHEEL.format(v=version), version, extra={TARGET: ORIGINAL.encode()}))
    return ["--mods-dir", str(tmp_path / "mods"), "--index-url", f"{loopback_index.url}/simple", "--vllm", ">=0.19"]


def test_reused_rows_equal_checked_rows_and_read_no_wheel(two_wheels, loopback_index, fresh_cache, capsys):
    first = check_json(capsys, *two_wheels)
    assert first["result_cache"] == {"reuse": True, "reused": 0, "checked": 4, "not_cacheable": 0}
    assert {r["status"] for r in first["results"]} == {"ok", "conflict"} and first["code"] == 1
    assert len(entries(fresh_cache)) == 4
    hits = len(loopback_index.file_hits())
    second = check_json(capsys, *two_wheels)
    assert second["result_cache"] == {"reuse": True, "reused": 4, "checked": 0, "not_cacheable": 0}
    assert second["results"] == first["results"] and second["code"] == first["code"]
    assert len(loopback_index.file_hits()) == hits  # not a byte of a wheel read
    fresh = check_json(capsys, *two_wheels, "--no-cache")
    assert fresh["result_cache"] == {"reuse": False, "reused": 0, "checked": 4, "not_cacheable": 0}
    assert fresh["results"] == first["results"]


def test_text_output_says_rows_were_reused(two_wheels, capsys):
    assert main(["check", *two_wheels]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "4 checked, 2 green, 2 not"
    assert main(["check", *two_wheels]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "4 checked, 2 green, 2 not; 4 reused from the result cache"


@pytest.mark.parametrize("damage", [
    lambda raw: b"{not json",
    lambda raw: raw[: len(raw) // 2],
    lambda raw: json.dumps({**json.loads(raw), "key": {**json.loads(raw)["key"], "subject": "0" * 64}}).encode(),
    lambda raw: json.dumps({**json.loads(raw), "result": {**json.loads(raw)["result"], "status": 7}}).encode(),
    lambda raw: json.dumps({**json.loads(raw), "result": {**json.loads(raw)["result"], "extra": 1}}).encode(),
    lambda raw: json.dumps({**json.loads(raw), "result": {**json.loads(raw)["result"], "mod": "other"}}).encode(),
])
def test_a_damaged_or_foreign_entry_is_checked_again(two_wheels, fresh_cache, capsys, damage):
    first = check_json(capsys, *two_wheels)
    for path in entries(fresh_cache):
        path.write_bytes(damage(path.read_bytes()))
    again = check_json(capsys, *two_wheels)
    assert again["result_cache"]["checked"] == 4 and again["results"] == first["results"]
    assert check_json(capsys, *two_wheels)["result_cache"]["reused"] == 4  # rewritten whole


def test_any_change_to_the_mod_is_a_new_key(two_wheels, tmp_path, capsys):
    check_json(capsys, *two_wheels)
    (tmp_path / "mods" / "demo" / "README.md").write_text("changed\n")
    doc = check_json(capsys, *two_wheels)
    assert doc["result_cache"] == {"reuse": True, "reused": 2, "checked": 2, "not_cacheable": 0}
    assert {r["mod"] for r in doc["results"]} == {"demo", "broken"}


def test_the_cache_is_bounded_least_recently_used_first(two_wheels, fresh_cache, capsys, monkeypatch):
    monkeypatch.setattr(resultcache, "MAX_ENTRIES", 2)
    one_release = two_wheels[:-1] + ["0.19.1"]  # one source: rows are written in a known order
    check_json(capsys, *one_release)  # demo and broken stored
    (Path(two_wheels[1]) / "demo" / "README.md").write_text("changed\n")
    doc = check_json(capsys, *one_release)  # broken reused (touched), demo stored anew: 3 > 2
    assert doc["result_cache"] == {"reuse": True, "reused": 1, "checked": 1, "not_cacheable": 0}
    assert len(entries(fresh_cache)) == 2  # the old demo row went: the least recently used
    assert check_json(capsys, *one_release)["result_cache"]["reused"] == 2


def test_a_folder_is_never_cached(tmp_path, fresh_cache, capsys):
    site = make_site(tmp_path / "site", "0.19.1")
    make_mod(tmp_path / "mods", "demo")
    for _ in range(2):
        doc = check_json(capsys, "--mods-dir", str(tmp_path / "mods"), "--vllm", f"dir:{site}")
        assert doc["result_cache"] == {"reuse": True, "reused": 0, "checked": 0, "not_cacheable": 1}
    assert entries(fresh_cache) == []


def test_a_checked_wheel_keeps_nothing_in_memory(two_wheels, loopback_index, tmp_path):
    resultcache.start(reuse=False)
    sources = open_targets(">=0.19", index_url=f"{loopback_index.url}/simple")
    rows = check_mods([tmp_path / "mods" / "demo", tmp_path / "mods" / "broken"], sources)
    assert all(s._zip is None and not s._members for s in sources)
    assert all(f.before is None and f.after is None for r in rows for f in r.result.files)
    assert [r.result.status for r in rows] == ["ok", "conflict", "ok", "conflict"]


@pytest.mark.network
def test_real_mods_on_real_releases_reused_equal_checked(fresh_cache, capsys):
    """Every mod of this collection and a loose patch with a drift finding, on real wheels."""
    targets = ["--vllm", "0.19.1", "--vllm", "0.20.0", "--vllm", "0.26.0"]
    checked = check_json(capsys, *targets, "--no-cache")
    reused = check_json(capsys, *targets)
    assert reused["result_cache"]["reused"] == len(checked["results"]) > 10
    # (fetch counts are per process: the second command added no request)
    assert reused["results"] == checked["results"] and reused["fetch"]["requests"] == checked["fetch"]["requests"]

    patch = str(REPO / "examples" / "deepgemm.patch")
    first = main(["check-patch", patch, "--json", "--no-cache", *targets])
    checked = json.loads(capsys.readouterr().out)
    assert main(["check-patch", patch, "--json", *targets]) == first == 1
    reused = json.loads(capsys.readouterr().out)
    assert "drift" in {r["status"] for r in checked["results"]}
    assert reused["results"] == checked["results"] and reused["result_cache"]["reused"] == 3


def test_a_patch_edited_between_two_checks_in_one_process_is_read_again(two_wheels, tmp_path, capsys):
    """Patches are parsed once per mod content (check._patches): an edit between two checks in
    one process is a new content hash and must be read again, and a patch made unreadable fails
    every time (errors are not kept)."""
    first = check_json(capsys, *two_wheels, "--no-cache")
    assert {r["status"] for r in first["results"] if r["mod"] == "demo"} == {"ok"}
    patch = tmp_path / "mods" / "demo" / "patches" / "v1" / "demo.patch"
    patch.write_text(f"--- a/{TARGET}\n+++ b/{TARGET}\n@@ -1,2 +1,2 @@\n-no such line\n+x\n context that is not there\n")
    again = check_json(capsys, *two_wheels, "--no-cache")
    assert {r["status"] for r in again["results"] if r["mod"] == "demo"} == {"conflict"}
    patch.write_bytes(b"\xff\xfe binary")
    for _ in range(2):
        assert main(["check", *two_wheels, "--no-cache"]) == 2
        assert "demo.patch: not UTF-8 text" in capsys.readouterr().err
