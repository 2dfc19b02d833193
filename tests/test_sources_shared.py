"""What the wheels of one run share: members stored by the sha256 their wheel's RECORD lists
(memberstore.py), the paths siblings were asked for (siblings.py), and the check slots
(checking/cpuslots.py)."""

from __future__ import annotations

import random
import threading
import time
from typing import List

import pytest

from modfactory import ORIGINAL, TARGET, make_mod
from sparkmods.checking import batch, cpuslots, resultcache
from sparkmods.sources import memberstore, open_targets, stats
from sparkmods.sources.base import MemorySource
from sparkmods.sources.siblings import Siblings
from wheelindex import A, make_wheel, wheel_files

pytestmark = pytest.mark.usefixtures("fresh_cache")

WHEEL = "vllm-{v}-cp38-abi3-manylinux_2_28_x86_64.whl"
SHARED = "vllm/shared.py"  # the same bytes in every wheel below
HINTED = "vllm/hinted.py"  # outside the tail and far from A: only a hint brings it along A
SPACER = "vllm/_D.abi3.so"


def two_releases(index, tmp_path) -> List:
    for version in ("0.19.0", "0.19.1"):
        extra = {SHARED: b"SHARED = 1\n" * 50, HINTED: f"HINTED = {version!r}\n".encode(),
                 SPACER: random.Random(version).randbytes(2 << 20)}
        index.add(make_wheel(tmp_path / WHEEL.format(v=version), version, extra=extra))
    return open_targets(">=0.19", index_url=f"{index.url}/simple")


def member_requests(index, version: str) -> List[str]:
    """The range requests for members (not the tail) a wheel got."""
    return [h.range for h in index.file_hits() if h.path.endswith(WHEEL.format(v=version)) and "=-" not in h.range]


def test_a_member_two_wheels_hold_byte_for_byte_is_fetched_once(loopback_index, tmp_path):
    old, new = two_releases(loopback_index, tmp_path)
    assert old.read(SHARED) == b"SHARED = 1\n" * 50
    stats.reset()
    assert new.read(SHARED) == b"SHARED = 1\n" * 50
    assert member_requests(loopback_index, "0.19.1") == [] and stats.snapshot()["cache_hits"] == 1


def test_a_member_whose_bytes_differ_is_never_taken_from_another_wheel(loopback_index, tmp_path):
    old, new = two_releases(loopback_index, tmp_path)
    assert old.read(A) != new.read(A)  # same path and size, another CRC-32
    assert new.read(A) == wheel_files("0.19.1")[A] and len(member_requests(loopback_index, "0.19.1")) == 1


def test_a_stored_member_that_fails_its_check_is_fetched_again(loopback_index, tmp_path):
    old, new = two_releases(loopback_index, tmp_path)
    old.read(SHARED)
    key = old._key(SHARED)
    memberstore._path(key).write_bytes(b"SHARED = 2\n" * 50)  # same size, other bytes: a damaged store
    assert new.read(SHARED) == b"SHARED = 1\n" * 50 and len(member_requests(loopback_index, "0.19.1")) == 1
    assert memberstore.load(key) == b"SHARED = 1\n" * 50  # stored again, verified


def _claimed_elsewhere(wheel, path: str):
    """Claim path's bytes as another wheel fetching them would; (claim, set once a reader waits)."""
    key = wheel._key(path)
    mine, _ = memberstore.claim([key])
    event, reached = memberstore._claims[key.name], threading.Event()
    wait = event.wait
    event.wait = lambda timeout=None: (reached.set(), wait(timeout))[1]
    return mine, reached


def _read_in_thread(wheel, path: str):
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("data", wheel.read(path)))
    thread.start()
    return thread, out


def test_a_wheel_waits_for_the_fetch_another_is_making_of_the_same_bytes(loopback_index, tmp_path):
    _, new = two_releases(loopback_index, tmp_path)
    claim, reached = _claimed_elsewhere(new, SHARED)
    thread, out = _read_in_thread(new, SHARED)
    assert reached.wait(10)
    memberstore.save(claim[0], b"SHARED = 1\n" * 50)  # what the other fetch stores
    memberstore.settle(claim)
    thread.join(10)
    assert out["data"] == b"SHARED = 1\n" * 50 and member_requests(loopback_index, "0.19.1") == []


def test_when_the_fetch_waited_for_fails_the_wheel_fetches_itself(loopback_index, tmp_path):
    _, new = two_releases(loopback_index, tmp_path)
    claim, reached = _claimed_elsewhere(new, SHARED)
    thread, out = _read_in_thread(new, SHARED)
    assert reached.wait(10)
    memberstore.settle(claim)  # nothing stored
    thread.join(10)
    assert out["data"] == b"SHARED = 1\n" * 50 and len(member_requests(loopback_index, "0.19.1")) == 1


def test_a_warmed_wheel_holds_nothing_and_its_first_read_is_one_request(loopback_index, tmp_path):
    old, _ = two_releases(loopback_index, tmp_path)
    old.warm()
    assert [h.range.startswith("bytes=-") for h in loopback_index.file_hits()] == [True]
    assert old._zip is None and old._file is None
    old.warm()  # cached now: nothing to do
    assert old.read(A) == wheel_files("0.19.0")[A]
    assert len(loopback_index.file_hits()) == 2 and len(member_requests(loopback_index, "0.19.0")) == 1


def test_a_wheel_fetches_what_its_sibling_was_asked_for_in_the_same_round(loopback_index, tmp_path):
    old, new = two_releases(loopback_index, tmp_path)
    old.prefetch([A, HINTED])
    old.release()
    new.read(A)
    ranges = member_requests(loopback_index, "0.19.1")
    assert len(ranges) == 2  # A's span and HINTED's, in one parallel batch
    assert new.read(HINTED) == b"HINTED = '0.19.1'\n" and member_requests(loopback_index, "0.19.1") == ranges


def test_hints_come_from_the_nearest_siblings_up_to_a_done_one():
    siblings = Siblings(max_asked=2)
    places = [siblings.join() for _ in range(5)]
    assert siblings.hints(places[0]) == []
    siblings.note_asked(places[0], ["a"])
    siblings.note_asked(places[2], ["c", "d", "e"])  # bounded: "e" is dropped
    siblings.note_asked(places[4], ["e"])
    assert siblings.hints(places[3]) == ["c", "d", "e", "a"]  # none done: all, nearest first
    assert siblings.hints(places[1]) == ["a", "c", "d", "e"]  # at the same distance the earlier first
    siblings.done(places[2])
    assert siblings.hints(places[3]) == ["c", "d"]  # its chains are complete: nothing further
    assert siblings.hints(places[1]) == ["a", "c", "d"]


class _SlowSource(MemorySource):
    """A source whose reads take a while and count how many checks read at once."""

    lock = threading.Lock()
    reading = 0
    most = 0

    def read(self, path: str):
        cls = type(self)
        with cls.lock:
            cls.reading += 1
            cls.most = max(cls.most, cls.reading)
        time.sleep(0.02)
        with cls.lock:
            cls.reading -= 1
        return super().read(path)


def test_no_more_sources_are_checked_at_once_than_there_are_check_slots(tmp_path):
    resultcache.start(reuse=False)
    mod = make_mod(tmp_path / "mods", "demo")
    sources = [_SlowSource("0.19.1", {TARGET: ORIGINAL}) for _ in range(3 * batch.SOURCE_JOBS)]
    rows = batch.check_mods([mod], sources)
    assert [r.result.status for r in rows] == ["ok"] * len(sources)
    assert _SlowSource.most == cpuslots.CHECK_SLOTS < batch.SOURCE_JOBS
