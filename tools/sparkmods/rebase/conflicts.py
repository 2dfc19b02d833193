"""Conflict-marked files for a human: onto with the placed edits applied and, where an edit
could not be placed, a diff3-style block (onto / base / patched base) around the lines that
changed upstream next to it."""

from __future__ import annotations

from typing import List, Sequence, Tuple

from .align import Alignment
from .edits import Edit, apply_edits
from .merge import CONFLICT, PLACED, EditOutcome

__all__ = ["conflict_lines"]


def _o_left(align: Alignment, b: int) -> int:
    """onto index where a region starting at base line b starts (after what precedes b)."""
    for run in align.runs:
        if run.b <= b <= run.b + run.size:
            return run.o + (b - run.b)
    ends = [run.o + run.size for run in align.runs if run.b + run.size <= b]
    return max(ends) if ends else 0


def _o_right(align: Alignment, b: int) -> int:
    """onto index where a region ending at base line b ends (before what follows b)."""
    for run in reversed(align.runs):
        if run.b <= b <= run.b + run.size:
            return run.o + (b - run.b)
    starts = [run.o for run in align.runs if run.b >= b]
    return min(starts) if starts else len(align.onto)


def _regions(align: Alignment, bad: Sequence[Edit]) -> List[Tuple[int, int]]:
    chunks = align.changed_b_lines()
    regions: List[Tuple[int, int]] = []
    for e in bad:
        lo, hi = e.base_start, e.base_end
        for c0, c1, _, _ in chunks:
            if (c0 < hi + 1 and lo - 1 < c1) or (c0 == c1 and lo <= c0 <= hi):
                lo, hi = min(lo, c0), max(hi, c1)
        regions.append((lo, hi))
    regions.sort()
    merged: List[Tuple[int, int]] = []
    for lo, hi in regions:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def conflict_lines(align: Alignment, outcomes: Sequence[EditOutcome], onto_label: str, base_label: str) -> List[str]:
    base, onto = align.base, align.onto
    regions = _regions(align, [x.edit for x in outcomes if x.outcome == CONFLICT])
    inside = lambda e: any(lo <= e.base_start and e.base_end <= hi for lo, hi in regions)  # noqa: E731
    repl = [(*x.span, list(x.edit.new)) for x in outcomes if x.outcome == PLACED and not inside(x.edit)]
    for lo, hi in regions:
        onto_start, onto_end = _o_left(align, lo), _o_right(align, hi)
        mine = [(e.base_start - lo, e.base_end - lo, e.new) for e in (x.edit for x in outcomes)
                if lo <= e.base_start and e.base_end <= hi]
        block = ([f"<<<<<<< onto ({onto_label})\n"] + _ended(onto[onto_start:onto_end])
                 + [f"||||||| base ({base_label})\n"] + _ended(base[lo:hi])
                 + ["=======\n"] + _ended(apply_edits(base[lo:hi], mine)) + [">>>>>>> patch\n"])
        repl.append((onto_start, onto_end, block))
    repl.sort(key=lambda r: (r[0], r[1]))
    keep: List[Tuple[int, int, list]] = []
    for r in repl:
        if keep and r[0] < keep[-1][1]:
            continue  # a placed edit inside a conflict block's onto side: the block shows it
        keep.append(r)
    return apply_edits(list(onto), keep)


def _ended(lines: Sequence[str]) -> List[str]:
    return [x if x.endswith("\n") else x + "\n" for x in lines]
