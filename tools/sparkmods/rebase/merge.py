"""Three-way merge of one file: base, base + patch, onto -> onto + patch, edit by edit.

Each edit is placed by two independent methods: the diff3 alignment (`align`) and, for
Python, the structural anchors (`anchor`). When both give a place they must agree; when one
gives a place it is used; when neither does, the edit is a conflict. Then the placements
must keep their order and not overlap, and the merged Python file must parse; otherwise
every edit of the file is reported as a conflict. Nothing here ever guesses.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from sparkmods.pyindex import safeparse
from sparkmods.runtime.engine import APPLIED, plan_file
from sparkmods.runtime.udiff import FilePatch

from .align import Alignment
from .anchor import Anchorer, Answer, Placement
from .edits import Edit, apply_edits, join_lines
from .pyscope import PyFile, parse_py

__all__ = ["PLACED", "ALREADY", "CONFLICT", "EditOutcome", "FileMerge", "merge_file"]

PLACED, ALREADY, CONFLICT = "placed", "already-in-onto", "conflict"


@dataclass
class EditOutcome:
    edit: Edit
    outcome: str
    rule: str = ""
    onto_start: Optional[int] = None  # 0-based onto line where it goes (placed)
    onto_end: Optional[int] = None
    reason: str = ""

    @property
    def span(self) -> Tuple[int, int]:
        """(onto_start, onto_end) of a placed edit."""
        if self.onto_start is None or self.onto_end is None:
            raise ValueError(f"hunk {self.edit.hunk}: {self.outcome}, not placed")
        return self.onto_start, self.onto_end

    def to_dict(self) -> dict:
        out = {"hunk": self.edit.hunk, "base_line": self.edit.base_start + 1,
               "removes": self.edit.base_end - self.edit.base_start,
               "adds": len(self.edit.new), "outcome": self.outcome}
        if self.rule:
            out["rule"] = self.rule
        if self.onto_start is not None:
            out["onto_line"] = self.onto_start + 1
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass
class FileMerge:
    outcomes: List[EditOutcome]
    merged: Optional[List[str]]  # onto with every edit placed; None when any conflicts
    reason: str = ""
    alignment: Optional[Alignment] = field(default=None, repr=False)

    @property
    def clean(self) -> bool:
        return self.merged is not None


def _scopes(pf: PyFile, lo: int, hi: int) -> "tuple[str, str]":
    """The def/class holding the line before an edit and the line after it."""
    last = len(pf.lines) - 1
    return (pf.scope_at(lo) if lo >= 0 else "<start>", pf.scope_at(hi) if hi <= last else "<end>")


def _diff3(align: Alignment, bf: Optional[PyFile], of: Optional[PyFile], e: Edit) -> "tuple[Optional[Placement], str]":
    onto_start, why = align.place(e.base_start, e.base_end)
    if onto_start is None:
        return None, why
    if bf is not None and of is not None:
        size = e.base_end - e.base_start
        if _scopes(bf, e.base_start - 1, e.base_end) != _scopes(of, onto_start - 1, onto_start + size):
            return None, "the enclosing def/class differs at the aligned place"
    return Placement(onto_start, onto_start + (e.base_end - e.base_start), "diff3"), ""


def _place(align: Alignment, anchors: Optional[Anchorer], bf: Optional[PyFile], of: Optional[PyFile], e: Edit) -> EditOutcome:
    d, dwhy = _diff3(align, bf, of, e)
    answer = anchors.place(e.base_start, e.base_end, e.new) if anchors is not None else Answer(None)
    s, swhy = answer.placement, answer.reason
    if answer.veto:
        return EditOutcome(e, CONFLICT, reason=swhy + " (both sides changed this statement)")
    if d is not None and s is not None:
        if (d.onto_start, d.onto_end) != (s.onto_start, s.onto_end):
            return EditOutcome(e, CONFLICT, reason=f"diff3 puts it at onto line {d.onto_start + 1}, Python anchoring "
                                                   f"({s.rule}) at line {s.onto_start + 1}: refusing to choose")
        return EditOutcome(e, PLACED, "diff3", d.onto_start, d.onto_end)
    chosen = d or s
    if chosen is not None:
        return EditOutcome(e, PLACED, chosen.rule, chosen.onto_start, chosen.onto_end)
    reasons = [r for r in (dwhy, swhy) if r]
    return EditOutcome(e, CONFLICT, reason="; ".join(dict.fromkeys(reasons)) or "cannot be placed")


def _order(outcomes: List[EditOutcome]) -> None:
    """Placements must keep base order and not overlap; offenders become conflicts."""
    placed = [x for x in outcomes if x.outcome == PLACED]
    for a, b in itertools.pairwise(placed):
        if b.onto_start < a.onto_end:  # type: ignore[operator]  # a PLACED outcome has both ends
            for x in (a, b):
                x.outcome, x.reason = CONFLICT, "placed out of order with a neighbouring edit"


def _already(fp: FilePatch, onto: bytes, outcomes: List[EditOutcome]) -> None:
    """Hunks none of whose edits could be placed but whose result onto already has."""
    for number, hunk in enumerate(fp.hunks, 1):
        mine = [x for x in outcomes if x.edit.hunk == number]
        if mine and all(x.outcome == CONFLICT for x in mine):
            single = FilePatch(fp.old_path, fp.new_path, [hunk])
            if plan_file(single, onto).status == APPLIED:
                for x in mine:
                    x.outcome, x.rule, x.reason = ALREADY, "", "onto already has this hunk's result"


def _with_eol(line: str, eol: str) -> str:
    """An added line in onto's line-ending style (the engine writes added lines that way)."""
    if not line.endswith("\n"):
        return line
    return line.rstrip("\r\n") + eol


def merge_file(fp: FilePatch, base: Sequence[str], onto: Sequence[str], edits: Sequence[Edit],
               python: bool, onto_bytes: bytes) -> FileMerge:
    align = Alignment(base, onto)
    bf = parse_py(base) if python else None
    of = parse_py(onto) if python else None
    anchors = Anchorer(bf, of) if bf is not None and of is not None else None
    outcomes = [_place(align, anchors, bf, of, e) for e in edits]
    _order(outcomes)
    _already(fp, onto_bytes, outcomes)
    if any(x.outcome == CONFLICT for x in outcomes):
        return FileMerge(outcomes, None, alignment=align)
    eol = "\r\n" if sum(1 for x in onto if x.endswith("\r\n")) * 2 > len(onto) else "\n"
    placed = [(x.onto_start, x.onto_end, [_with_eol(line, eol) for line in x.edit.new])
              for x in outcomes if x.outcome == PLACED]
    merged = apply_edits(list(onto), placed)  # type: ignore[arg-type]  # PLACED outcomes have both ends
    if python and of is not None:
        try:
            safeparse.parse(join_lines(merged))
        except SyntaxError as exc:
            for x in outcomes:
                if x.outcome == PLACED:
                    x.outcome, x.reason = CONFLICT, "the merged file would not parse"
            return FileMerge(outcomes, None, f"merged file does not parse: {exc.msg} at line {exc.lineno}", align)
    return FileMerge(outcomes, merged, alignment=align)
