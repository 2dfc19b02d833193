"""linediff.changed_lines marks exactly the lines difflib's SequenceMatcher (no junk) marks
added or changed: on random line sequences, on this repository's Python files edited at
random, and with every anchor threshold (0: no anchors, SequenceMatcher's own search only)."""

from __future__ import annotations

import random
from difflib import SequenceMatcher
from pathlib import Path
from typing import List, Sequence

import pytest

from sparkmods.checking import linediff
from sparkmods.checking.linediff import changed_lines

TOOLS = Path(__file__).resolve().parents[1] / "tools" / "sparkmods"


def reference(old: Sequence[str], new: Sequence[str]) -> List[int]:
    out: List[int] = []
    for tag, _, _, j1, j2 in SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            out.extend(range(j1, j2))
    return out


def edited(rnd: random.Random, old: List[str], pool: Sequence[str], edits: int, width: int) -> List[str]:
    """old with insertions (lines from pool), deletions, replacements and copied blocks."""
    new = list(old)
    for _ in range(edits):
        at, op = rnd.randint(0, len(new)), rnd.random()
        if op < 0.35:
            new[at:at] = [rnd.choice(pool) for _ in range(rnd.randint(1, width))]
        elif op < 0.6:
            del new[at:at + rnd.randint(1, width)]
        elif op < 0.8:
            new[at:at + 1] = [rnd.choice(pool)]
        else:
            start = rnd.randint(0, len(old))
            new[at:at] = old[start:start + rnd.randint(1, 3 * width)]
    return new


@pytest.mark.parametrize("seed", range(4))
def test_random_sequences(seed: int) -> None:
    rnd = random.Random(seed)
    for _ in range(2000):
        alphabet = [str(x) for x in range(rnd.randint(1, 8))]
        old = [rnd.choice(alphabet) for _ in range(rnd.randint(0, 30))]
        if rnd.random() < 0.5:
            new = edited(rnd, old, alphabet + ["x", "y"], rnd.randint(0, 4), 4)
        else:
            new = [rnd.choice(alphabet) for _ in range(rnd.randint(0, 30))]
        want = reference(old, new)
        for anchor_max in (0, 1, 2, 3, 8):
            assert changed_lines(old, new, anchor_max) == want, (old, new, anchor_max)


def test_edited_python_files() -> None:
    """Real files (many blank lines and lone brackets) edited the way patches edit them."""
    rnd = random.Random(7)
    files = [p.read_text().splitlines() for p in sorted(TOOLS.rglob("*.py")) if p.stat().st_size > 4000]
    pool = [line for lines in files for line in lines]
    for _ in range(150):
        old = rnd.choice(files)
        new = edited(rnd, old, pool, rnd.randint(1, 6), 12)
        want = reference(old, new)
        assert changed_lines(old, new) == want
        assert changed_lines(old, new, 1) == want


def test_anchors_spare_the_full_search(monkeypatch) -> None:
    """The speed: on an edited file the whole-file block comes from anchors; SequenceMatcher's
    search runs only on small leftovers, if at all."""
    searched: List[int] = []
    real = linediff._Matcher._search

    def search(self, alo: int, ahi: int, blo: int, bhi: int):
        searched.append(ahi - alo)
        return real(self, alo, ahi, blo, bhi)
    monkeypatch.setattr(linediff._Matcher, "_search", search)
    old = (TOOLS / "checking" / "drift.py").read_text().splitlines()
    new = old[:100] + ["        x = helper(y)", ""] + old[100:250] + old[260:]
    assert changed_lines(old, new) == reference(old, new)
    assert all(n < 50 for n in searched), searched
