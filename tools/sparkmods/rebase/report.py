"""Human-readable rebase reports: one line per file, one per edit that needs a person."""

from __future__ import annotations

from collections import Counter
from typing import List, Sequence

from sparkmods.checking.drift import DriftFinding

from .core import RebaseResult
from .merge import CONFLICT

__all__ = ["result_lines", "drift_lines"]


def result_lines(result: RebaseResult, indent: str = "") -> List[str]:
    lines = []
    for f in result.files:
        outcomes = [o for p in f.parts for o in p.outcomes]
        rules = Counter(o.rule or o.outcome for o in outcomes)
        how = ", ".join(f"{n} {rule}" for rule, n in sorted(rules.items()))
        moved = sorted({p.target for p in f.parts if p.target != f.path})
        where = f" -> {', '.join(moved)}" if moved else ""
        lines.append(f"{indent}{f.path}{where}: {f.status}" + (f" ({how})" if how else "")
                     + (f": {f.reason}" if f.reason and not outcomes else ""))
        for o in outcomes:
            if o.outcome == CONFLICT:
                lines.append(f"{indent}  hunk {o.edit.hunk}, base line {o.edit.base_start + 1}: {o.reason}")
        if f.candidates and f.status != "rebased":
            lines.append(f"{indent}  candidates: " + ", ".join(f"{c.path} ({c.score:.0%})" for c in f.candidates))
    if result.problem:
        lines.append(f"{indent}{result.problem}")
    return lines


def drift_lines(findings: Sequence[DriftFinding], indent: str = "") -> List[str]:
    return [f"{indent}drift: {f}" for f in findings]
