"""Line alignment of base and onto, and the diff3 placement it gives.

The alignment is difflib's longest-matching-block diff (junk heuristic off) over the middle
part that differs; the common head and tail are matched first, cheaply. An edit is carried
by the alignment only the way diff3 would (its lines and one line on each side unchanged,
in one unchanged run), and only when that run holds, on each side of the edit, a line that
is unique in both files (or reaches the file's edge there). Between two such anchors of one
contiguous run every line provably corresponds; outside them a diff may "slide" generic
lines (`)`, blank lines) onto the wrong code, which is how plain diff3 misplaces changes.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import List, Optional, Sequence, Tuple

__all__ = ["Run", "Alignment"]


@dataclass(frozen=True)
class Run:
    """Lines base[b:b+size] equal onto[o:o+size]."""

    b: int
    o: int
    size: int


class Alignment:
    def __init__(self, base: Sequence[str], onto: Sequence[str]) -> None:
        self.base, self.onto = base, onto
        self.runs = _runs(base, onto)
        self._starts = [r.b for r in self.runs]
        self._count_b = Counter(base)
        self._count_o = Counter(onto)

    def run_at(self, b: int) -> Optional[Run]:
        """The unchanged run holding base line b, if any."""
        i = bisect.bisect_right(self._starts, b) - 1
        if i >= 0:
            run = self.runs[i]
            if run.b <= b < run.b + run.size:
                return run
        return None

    def _unique(self, b: int) -> bool:
        line = self.base[b]
        return bool(line.strip()) and self._count_b[line] == 1 and self._count_o[line] == 1

    def anchored(self, run: Run, base_start: int, base_end: int) -> bool:
        """True when the run pins base[base_start:base_end] from both sides: a line unique in both files
        in run[:base_end] and one in run[base_start:] (the file's edge counts when the run reaches it)."""
        end = run.b + run.size
        before = (run.b == 0 and run.o == 0) or any(self._unique(b) for b in range(base_end - 1, run.b - 1, -1))
        after = (end == len(self.base) and run.o + run.size == len(self.onto)) or any(
            self._unique(b) for b in range(base_start, end))
        return before and after

    def place(self, base_start: int, base_end: int) -> Tuple[Optional[int], str]:
        """diff3: the onto index for base[base_start:base_end] (equal bounds: an insertion point),
        or None and why."""
        nb, no = len(self.base), len(self.onto)
        lo, hi = base_start - 1, base_end  # the neighbours that must be unchanged too
        span = [i for i in range(max(lo, 0), min(hi, nb - 1) + 1)]
        if not span:
            return (0, "") if nb == 0 and no == 0 else (None, "empty file")
        run = self.run_at(span[0])
        if run is None or span[-1] >= run.b + run.size:
            return None, "next to or inside lines that changed upstream"
        onto_start = run.o + (base_start - run.b)
        if lo < 0 and (run.b != 0 or run.o != 0):
            return None, "at the start of a file whose start changed upstream"
        if hi >= nb and (run.b + run.size != nb or run.o + run.size != no):
            return None, "at the end of a file whose end changed upstream"
        if not self.anchored(run, base_start, base_end):
            return None, "the unchanged lines around it are too generic to locate"
        return onto_start, ""

    def changed_b_lines(self) -> List[Tuple[int, int, int, int]]:
        """The changed chunks as (base_start, base_end, onto_start, onto_end), in order (either side may be empty)."""
        out = []
        pb = po = 0
        for run in self.runs + [Run(len(self.base), len(self.onto), 0)]:
            if run.b > pb or run.o > po:
                out.append((pb, run.b, po, run.o))
            pb, po = run.b + run.size, run.o + run.size
        return out


def _runs(base: Sequence[str], onto: Sequence[str]) -> List[Run]:
    head = 0
    limit = min(len(base), len(onto))
    while head < limit and base[head] == onto[head]:
        head += 1
    tail = 0
    while tail < limit - head and base[len(base) - 1 - tail] == onto[len(onto) - 1 - tail]:
        tail += 1
    runs: List[Run] = [Run(0, 0, head)] if head else []
    mid_b = base[head:len(base) - tail]
    mid_o = onto[head:len(onto) - tail]
    if mid_b and mid_o:
        matcher = SequenceMatcher(None, mid_b, mid_o, autojunk=False)
        for a, b, size in matcher.get_matching_blocks():
            if size:
                runs.append(Run(head + a, head + b, size))
    if tail:
        runs.append(Run(len(base) - tail, len(onto) - tail, tail))
    return _merge_adjacent(runs)


def _merge_adjacent(runs: List[Run]) -> List[Run]:
    out: List[Run] = []
    for run in runs:
        if out and out[-1].b + out[-1].size == run.b and out[-1].o + out[-1].size == run.o:
            last = out.pop()
            run = Run(last.b, last.o, last.size + run.size)
        out.append(run)
    return out
