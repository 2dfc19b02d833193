"""Validate one plan on every vLLM the user named (`--vllm` is repeatable, as for `check`).

A problem that holds whatever the target is reported once; one that only some targets have is
reported once per such target, naming it, so `--vllm 0.19.1 --vllm 0.21.0` never hides the
release that cannot run the recipe behind the one that can.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from sparkmods.launch.plan import LaunchPlan
from sparkmods.launch.problem import ERROR, Problem
from sparkmods.launch.rules import CheckMods, validate
from sparkmods.launch.vllmfacts import VllmFacts
from sparkmods.runtime.modcheck import ModResult

__all__ = ["TargetProblem", "MultiValidation", "validate_on"]


@dataclass(frozen=True)
class TargetProblem:
    """A problem, and the target it belongs to (None: every target, or no target at all)."""

    problem: Problem
    target: Optional[str] = None

    def __str__(self) -> str:
        return f"{self.problem} (on {self.target})" if self.target else str(self.problem)

    def to_dict(self) -> dict:
        return {**self.problem.to_dict(), "target": self.target}


@dataclass
class MultiValidation:
    findings: List[TargetProblem]
    checked: List[Tuple[str, List[ModResult]]]  # (target label, its mod results), in the order given

    @property
    def errors(self) -> List[TargetProblem]:
        return [f for f in self.findings if f.problem.severity == ERROR]


def validate_on(plan: LaunchPlan, targets: Sequence[VllmFacts], check: Optional[CheckMods]) -> MultiValidation:
    """Every problem of the plan on each target; with no targets, the target-independent ones."""
    if not targets:
        return MultiValidation([TargetProblem(p) for p in validate(plan, None, None).problems], [])
    runs = [(facts.label, validate(plan, facts, check)) for facts in targets]
    everywhere = set.intersection(*(set(v.problems) for _, v in runs))
    findings = [TargetProblem(p) for p in runs[0][1].problems if p in everywhere]
    for label, run in runs:
        findings += [TargetProblem(p, label) for p in run.problems if p not in everywhere]
    findings.sort(key=lambda f: f.problem.severity != ERROR)
    return MultiValidation(findings, [(label, run.mod_results) for label, run in runs])
