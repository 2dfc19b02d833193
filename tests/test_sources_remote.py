"""Remote wheels over real HTTP on loopback: PEP 691/503 indexes, range reads, the cache,
offline mode, servers that ignore Range, zip64, corrupt and hostile wheels."""

from __future__ import annotations

import hashlib
import logging
import random
import zipfile
from pathlib import Path

import pytest

from sparkmods.errors import SparkmodsError
from sparkmods.sources import open_targets, stats
from sparkmods.sources.rangefile import RangeFile, coalesce
from sparkmods.sources.remote import TAIL_BYTES
from wheelindex import FAR, FILLER, A, B, flip_byte_in_member, make_wheel, module_text, wheel_files

pytestmark = pytest.mark.usefixtures("fresh_cache")

WHEEL = "vllm-{v}-cp38-abi3-manylinux_2_28_x86_64.whl"


def publish(index, tmp_path: Path, version: str, name: str = WHEEL, **kwargs) -> str:
    return index.add(make_wheel(tmp_path / name.format(v=version), version, **kwargs))


def simple(index) -> str:
    return f"{index.url}/simple"


def test_pinned_release_is_read_with_range_requests_only(loopback_index, tmp_path):
    name = publish(loopback_index, tmp_path, "0.19.1")
    size = len(loopback_index.wheels[name])
    [source] = open_targets("pypi:0.19.1", index_url=simple(loopback_index))
    assert (source.label, source.version, source.commit) == ("pypi:0.19.1", "0.19.1", None)
    assert source.sha256 == hashlib.sha256(loopback_index.wheels[name]).hexdigest()

    source.prefetch([A, B, "vllm/absent.py"])
    hits = loopback_index.file_hits()
    assert [h.range for h in hits] == [f"bytes=-{TAIL_BYTES}", hits[1].range]  # tail, then A+B in ONE request
    assert all(h.status == 206 for h in hits)
    with zipfile.ZipFile(tmp_path / name) as zf:
        first, end = zf.getinfo("vllm/__init__.py").header_offset, zf.getinfo(FILLER).header_offset
    # A and B with the member before them (read ahead), up to the filler: a member larger than
    # the read-ahead is never read unless asked for
    assert hits[1].range == f"bytes={first}-{end - 1}"
    assert sum(h.sent for h in hits) < size / 2

    expected = wheel_files("0.19.1")
    assert source.read(A) == expected[A] and source.read(B) == expected[B]
    assert source.read("vllm/absent.py") is None
    assert source.read(FAR) == module_text("0.19.1", FAR)  # inside the tail already fetched
    assert source.read("vllm/__init__.py") == expected["vllm/__init__.py"]  # read ahead with A
    assert len(loopback_index.file_hits()) == 2
    assert {"vllm/__init__.py", A, B, FAR, "vllm-0.19.1.dist-info/METADATA"} <= set(source.list_files())
    snap = stats.snapshot()
    assert snap["requests"] == 3 and snap["bytes"] == sum(h.sent for h in loopback_index.hits)
    assert set(snap) == {"requests", "bytes", "cache_hits", "full_downloads", "seconds"}


def test_index_page_comes_gzipped_and_is_cached_decoded(loopback_index, tmp_path):
    for version in ("0.18.0", "0.19.1"):
        publish(loopback_index, tmp_path, version)
    assert [s.version for s in open_targets(">=0.18", index_url=simple(loopback_index))] == ["0.18.0", "0.19.1"]
    [page] = loopback_index.hits
    assert page.sent < len(loopback_index.page_json()) and stats.snapshot()["bytes"] == page.sent
    offline = open_targets(">=0.18", index_url=simple(loopback_index), offline=True)
    assert [s.sha256 for s in offline] == [loopback_index.sha256(WHEEL.format(v=v)) for v in ("0.18.0", "0.19.1")]


def test_second_run_is_served_from_the_cache_then_offline(loopback_index, tmp_path):
    publish(loopback_index, tmp_path, "0.19.1")
    [first] = open_targets("0.19.1", index_url=simple(loopback_index))
    first.prefetch([A, "vllm/absent.py"])
    before = len(loopback_index.hits)
    stats.reset()

    [again] = open_targets("0.19.1", index_url=simple(loopback_index))  # pinned and listed: no page fetch
    assert again.read(A) == wheel_files("0.19.1")[A] and again.read("vllm/absent.py") is None
    assert len(loopback_index.hits) == before and stats.snapshot()["requests"] == 0
    assert stats.snapshot()["cache_hits"] >= 3  # page, member, absence

    loopback_index.wheels.clear()  # even a dead server is never asked offline
    [offline] = open_targets("0.19.1", index_url=simple(loopback_index), offline=True)
    assert offline.read(A) == wheel_files("0.19.1")[A]
    assert offline.read(FAR) == module_text("0.19.1", FAR)  # never read, but inside the cached tail
    assert len(loopback_index.hits) == before


def test_offline_without_the_cache_names_what_is_missing(loopback_index, tmp_path):
    publish(loopback_index, tmp_path, "0.19.1")
    with pytest.raises(SparkmodsError, match=r"offline and the index page .* not in the cache"):
        open_targets("0.19.1", index_url=simple(loopback_index), offline=True)
    [online] = open_targets("0.19.1", index_url=simple(loopback_index))
    online.read(A)  # caches the central directory and A only
    [offline] = open_targets("0.19.1", index_url=simple(loopback_index), offline=True)
    assert offline.read(A) == wheel_files("0.19.1")[A]
    with pytest.raises(SparkmodsError,
                       match=r"pypi:0.19.1: offline and 1 file\(s\) such as .*inc.py are not in the cache"):
        offline.read(B)


def test_ranges_expand_oldest_first_and_skip_yanked_and_prereleases(loopback_index, tmp_path):
    for version in ("0.17.1", "0.18.0", "0.18.1", "0.19.0rc1", "0.19.0", "0.19.1"):
        publish(loopback_index, tmp_path, version)
    loopback_index.yanked.add(WHEEL.format(v="0.18.1"))
    url = simple(loopback_index)
    assert [s.version for s in open_targets(">=0.18", index_url=url)] == ["0.18.0", "0.19.0", "0.19.1"]
    assert [s.label for s in open_targets(">=0.18,<0.19.1", index_url=url, prereleases=True)] == \
        ["pypi:0.18.0", "pypi:0.19.0rc1", "pypi:0.19.0"]
    assert [s.version for s in open_targets("latest", index_url=url)] == ["0.19.1"]
    assert [s.version for s in open_targets("pypi:latest", index_url=url)] == ["0.19.1"]
    with pytest.raises(SparkmodsError, match=r"no vllm release on .* is in '>=0.20'"):
        open_targets(">=0.20", index_url=url)


def test_yanked_release_is_read_only_when_pinned(loopback_index, tmp_path, caplog):
    publish(loopback_index, tmp_path, "0.18.1")
    loopback_index.yanked.add(WHEEL.format(v="0.18.1"))
    with caplog.at_level(logging.WARNING, logger="sparkmods.sources"):
        [source] = open_targets("0.18.1", index_url=simple(loopback_index))
    assert source.read(A) == wheel_files("0.18.1")[A]
    assert "yanked" in caplog.text


def test_html_index_is_used_when_the_server_has_no_json(loopback_index, tmp_path, monkeypatch):
    publish(loopback_index, tmp_path, "0.19.1")
    monkeypatch.setattr("sparkmods.sources.index.ACCEPT", "text/html")
    monkeypatch.setenv("SPARKMODS_INDEX_URL", simple(loopback_index))  # the env var picks the index
    [source] = open_targets("0.19.1")
    assert source.sha256 == hashlib.sha256(loopback_index.wheels[WHEEL.format(v="0.19.1")]).hexdigest()
    assert source.read(B) == wheel_files("0.19.1")[B]
    assert loopback_index.hits[0].path == "/simple/vllm/"


def test_nightly_index_by_url_and_version(loopback_index, tmp_path):
    """A per-commit index: PEP 503 only, relative links, dev versions whose local label names the commit."""
    older = "0.11.1rc6.dev16+g933cdea44.cu129"
    newer = "0.11.1rc6.dev20+g50cd5674b.cu129"
    for version in (older, newer):
        loopback_index.add(make_wheel(tmp_path / f"vllm-{version}-cp38-abi3-manylinux1_x86_64.whl", version),
                           nightly=True)
    nightly = f"{loopback_index.url}/nightly/vllm/"
    [newest] = open_targets(f"index:{nightly}")
    assert (newest.version, newest.commit) == (newer, "50cd5674b")
    assert newest.label == f"index:{nightly}#{newer}"
    [pinned] = open_targets(f"index:{nightly}#{older}")
    assert pinned.commit == "933cdea44" and pinned.read(A) == wheel_files(older)[A]
    [public] = open_targets(f"index:{nightly}#0.11.1rc6.dev16")  # the local label may be left out
    assert public.version == older
    with pytest.raises(SparkmodsError, match=r"vllm 0.11.2 is not on .*nightly/vllm/ \(newest there: "):
        open_targets(f"index:{nightly}#0.11.2")


def test_preferred_wheel_is_manylinux_x86_64_with_the_highest_build_tag(loopback_index, tmp_path):
    for name in ("vllm-0.20.1-cp38-abi3-manylinux_2_35_aarch64.whl",
                 "vllm-0.20.1-cp38-abi3-manylinux_2_35_x86_64.whl",
                 "vllm-0.20.1-1-cp38-abi3-manylinux_2_35_x86_64.whl",
                 "vllm-0.20.1-1-cp38-abi3-manylinux_2_35_aarch64.whl",
                 "vllm-0.20.1-py3-none-any.whl"):
        publish(loopback_index, tmp_path, "0.20.1", name=name)
    [source] = open_targets("0.20.1", index_url=simple(loopback_index))
    assert source.filename == "vllm-0.20.1-1-cp38-abi3-manylinux_2_35_x86_64.whl"


def test_server_ignoring_range_gets_one_verified_full_download(loopback_index, tmp_path, caplog):
    name = publish(loopback_index, tmp_path, "0.19.1")
    loopback_index.honour_range = False
    [source] = open_targets("0.19.1", index_url=simple(loopback_index))
    with caplog.at_level(logging.WARNING, logger="sparkmods.sources"):
        source.prefetch([A, B])
    assert "ignores HTTP Range" in caplog.text
    assert source.read(A) == wheel_files("0.19.1")[A] and source.read(FAR) == module_text("0.19.1", FAR)
    assert [h.status for h in loopback_index.file_hits()] == [200]
    snap = stats.snapshot()
    assert snap["full_downloads"] == 1 and snap["bytes"] >= len(loopback_index.wheels[name])
    [again] = open_targets("0.19.1", index_url=simple(loopback_index), offline=True)
    assert again.read(B) == wheel_files("0.19.1")[B]  # from the downloaded wheel in the cache


def test_full_download_with_a_wrong_sha256_is_refused(loopback_index, tmp_path, fresh_cache):
    name = publish(loopback_index, tmp_path, "0.19.1")
    loopback_index.honour_range = False
    loopback_index.sha_override[name] = "0" * 64
    [source] = open_targets("0.19.1", index_url=simple(loopback_index))
    with pytest.raises(SparkmodsError, match=r"sha256 is [0-9a-f]{64}, the index says 0{64}; refusing"):
        source.read(A)
    assert not list(fresh_cache.rglob("*.whl"))


def test_zip64_wheel(loopback_index, tmp_path):
    name = publish(loopback_index, tmp_path, "0.19.1", zip64=True)
    assert b"PK\x06\x06" in loopback_index.wheels[name][-200:]  # a zip64 end of central directory record
    [source] = open_targets("0.19.1", index_url=simple(loopback_index))
    assert source.read(A) == wheel_files("0.19.1")[A]
    assert len(source.list_files()) > 70_000


def test_corrupt_member_fails_its_crc(loopback_index, tmp_path):
    path = make_wheel(tmp_path / WHEEL.format(v="0.19.1"), "0.19.1", stored=True)
    flip_byte_in_member(path, B)
    loopback_index.add(path)
    [source] = open_targets("0.19.1", index_url=simple(loopback_index))
    assert source.read(A) == wheel_files("0.19.1")[A]
    with pytest.raises(SparkmodsError, match=r"pypi:0.19.1: member .*inc.py failed its CRC-32 check"):
        source.read(B)


@pytest.mark.parametrize("bad", ["../../etc/evil.py", "/etc/evil.py", "vllm/../../evil.py"])
def test_wheel_with_escaping_member_names_is_refused(loopback_index, tmp_path, bad):
    publish(loopback_index, tmp_path, "0.19.1", extra={bad: b"x"})
    [source] = open_targets("0.19.1", index_url=simple(loopback_index))
    with pytest.raises(SparkmodsError, match=r"refusing a wheel whose member .* escapes the package tree"):
        source.read(A)


def test_requested_paths_that_escape_are_refused(loopback_index, tmp_path):
    publish(loopback_index, tmp_path, "0.19.1")
    [source] = open_targets("0.19.1", index_url=simple(loopback_index))
    with pytest.raises(SparkmodsError, match=r"refusing path '../x.py'"):
        source.read("../x.py")
    assert loopback_index.file_hits() == []


def test_index_size_mismatch_and_missing_project_are_clear(loopback_index, tmp_path):
    name = publish(loopback_index, tmp_path, "0.19.1")
    loopback_index.size_override[name] = 123
    [source] = open_targets("0.19.1", index_url=simple(loopback_index))
    with pytest.raises(SparkmodsError, match=r"the index says .* has 123 bytes, the server has"):
        source.read(A)
    with pytest.raises(SparkmodsError, match=r"/nowhere/vllm/: HTTP 404"):
        open_targets("0.19.1", index_url=f"{loopback_index.url}/nowhere")
    with pytest.raises(SparkmodsError, match=r"vllm 9.9.9 is not on .* \(newest there: 0.19.1\)"):
        open_targets("9.9.9", index_url=simple(loopback_index))


def test_unreachable_index_is_one_line():
    with pytest.raises(SparkmodsError) as err:
        open_targets("0.19.1", index_url="http://127.0.0.1:9/simple")
    assert "cannot fetch http://127.0.0.1:9/simple/vllm/" in str(err.value) and "\n" not in str(err.value)


# --- the sparse range file under all of it ---------------------------------------------------

def test_coalesce_merges_touching_and_close_spans():
    assert coalesce([(10, 20), (0, 5), (20, 30), (40, 50), (5, 5)]) == [(0, 5), (10, 30), (40, 50)]
    assert coalesce([(0, 5), (10, 20)], gap=5) == [(0, 20)]


def test_range_file_fetches_only_missing_bytes_and_reads_like_a_file():
    data = random.Random(1).randbytes(100_000)
    fetched = []

    def fetch(start: int, end: int) -> bytes:
        fetched.append((start, end))
        return data[start:end]

    rng = random.Random(2)
    rf = RangeFile(len(data), fetch)
    for _ in range(300):
        start = rng.randrange(len(data))
        end = min(len(data), start + rng.randrange(1, 3000))
        if rng.random() < 0.5:
            rf.ensure([(start, end), (max(0, start - 5000), start - 4000)])
        rf.seek(start)
        assert rf.read(end - start) == data[start:end]
    total = sum(e - s for s, e in fetched)
    assert total <= len(data)  # never fetched a byte twice
    rf.seek(-10, 2)
    assert rf.read() == data[-10:] and rf.tell() == len(data)
    with zipfile.ZipFile(make_wheel(Path(__import__("tempfile").mkdtemp()) / "w.whl", "0.1.0")) as zf:
        assert zf.testzip() is None
