"""Our stdlib PEP 440 ordering must agree with packaging's on every pair we can think of."""

from __future__ import annotations

import itertools
import random

import pytest
from packaging.version import Version as PV

from sparkmods.runtime.pep440 import InvalidRange, InvalidVersion, Range, Version

SAMPLES = [
    "0.18.0", "0.18", "0.18.0.0", "0.18.1", "0.19.0", "0.19.1", "0.19.1rc1", "0.19.1rc2",
    "0.19.1.dev0", "0.19.1rc1.dev15", "0.19.1rc1.dev15+g50cd5674b.d20260403",
    "0.19.1.dev0+g2a69949bd.d20260404", "0.19.1.post1", "0.19.1.post1.dev3", "0.19.1a1",
    "0.19.1b2", "0.19.1+local", "0.19.1+local.7", "0.19.1+7", "0.19.1+abc.5", "1!0.1",
    "0.8.5.post1", "0.10.1.1", "0.11.1rc6.dev16+g933cdea44.cu129", "0.19.1-1", "0.19.1.RC1",
    "v0.20.0", "0.20.0alpha3", "0.20.0.preview1", "0.20.0c1", "0.20.0rev2", "0.20.0.dev",
]


def test_parse_matches_packaging_normal_form():
    for text in SAMPLES:
        assert str(Version(text)) == str(PV(text)), text


def test_ordering_matches_packaging_on_all_pairs():
    for a, b in itertools.product(SAMPLES, repeat=2):
        assert (Version(a) < Version(b)) == (PV(a) < PV(b)), (a, b)
        assert (Version(a) == Version(b)) == (PV(a) == PV(b)), (a, b)


def test_ordering_matches_packaging_on_random_versions():
    rng = random.Random(7)
    def make() -> str:
        v = ".".join(str(rng.randint(0, 3)) for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.4:
            v += rng.choice(["a", "b", "rc"]) + str(rng.randint(0, 2))
        if rng.random() < 0.3:
            v += f".post{rng.randint(0, 2)}"
        if rng.random() < 0.4:
            v += f".dev{rng.randint(0, 2)}"
        if rng.random() < 0.3:
            v += "+" + rng.choice(["g1a2b3c4", "7", "abc.3", "d2026"])
        return v
    versions = [make() for _ in range(400)]
    assert sorted(versions, key=Version) == sorted(versions, key=PV)


def test_commit_and_flags_from_dev_builds():
    v = Version("0.19.1rc1.dev15+g50cd5674b.d20260403")
    assert v.commit == "50cd5674b"
    assert v.is_prerelease and v.is_devbuild
    assert Version("0.19.1.dev0+g2a69949bd.d20260404").commit == "2a69949bd"
    assert Version("0.11.1rc6.dev16+g933cdea44.cu129").commit == "933cdea44"
    assert Version("0.19.1").commit is None and not Version("0.19.1").is_devbuild
    assert Version("0.19.1+cu129").commit is None
    assert Version("0.19.1+g12345").commit is None and Version("0.19.1+gxyz1234567").commit is None


@pytest.mark.parametrize("bad", ["", "abc", "0.19.1+", "1..2", "0.19.1 beta", "0.19.1+g_"])
def test_invalid_versions(bad):
    with pytest.raises(InvalidVersion):
        Version(bad)


def test_dev_builds_fall_before_the_release_they_precede():
    older, newer = Range(">=0.19.0,<0.19.1"), Range(">=0.19.1")
    for dev in ("0.19.1.dev0+g2a69949bd.d20260404", "0.19.1rc1.dev15+g50cd5674b.d20260403", "0.19.1rc1"):
        assert older.contains(dev) and not newer.contains(dev), dev
    assert newer.contains("0.19.1") and newer.contains("0.19.1.post1") and newer.contains("0.19.2.dev3")
    assert not older.contains("0.19.1")
    # the local label never moves a version across a bound
    assert Range("<=0.19.1").contains("0.19.1+cu129")
    assert Range("==0.19.1").contains("0.19.1+g2a69949bd")


def test_range_clauses():
    r = Range("~=0.19.0")
    assert r.contains("0.19.9") and not r.contains("0.20.0") and not r.contains("0.20.0.dev1")
    assert Range(">0.19.0").contains("0.19.0.post1") and not Range(">0.19.0").contains("0.19.0")
    assert Range("<=0.20").contains("0.20.0") and not Range("<=0.20").contains("0.20.0.post1")


@pytest.mark.parametrize("bad", ["", "!=0.19.0", "==0.19.*", ">=0.20,<0.19", ">0.19,<0.19", "0.19", ">=x",
                                  ">=0.19+local", "~=1"])
def test_invalid_ranges(bad):
    with pytest.raises(InvalidRange):
        Range(bad)


def test_overlaps_exactly():
    assert not Range(">=0.18,<0.24").overlaps(Range(">=0.24"))
    assert Range(">=0.18,<=0.24").overlaps(Range(">=0.24"))
    assert not Range(">=0.18,<=0.24").overlaps(Range(">0.24"))
    assert Range(">=0.18").overlaps(Range("<0.18.1"))
    assert not Range("==0.19.0").overlaps(Range(">0.19.0"))
    assert Range("==0.19.0").overlaps(Range(">=0.19,<0.20"))
