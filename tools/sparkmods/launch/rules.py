"""Validation before any script is written: each problem is one line naming what to change.

Three kinds of checks:
- the mods against the target vLLM, through the same engine as `sparkmods check` (injected as
  a callable, so validation does not care how the target was opened): modrules.py;
- known-bad combinations reported by users or visible in vLLM's own source, and shell safety for
  what the launcher would mangle (launch-cluster.sh word-splits `-e` values): flagrules.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence

from sparkmods.launch import flagrules, modrules, prrules
from sparkmods.launch.plan import LaunchPlan
from sparkmods.launch.problem import ERROR, WARNING, Context, Problem
from sparkmods.launch.vllmfacts import VllmFacts
from sparkmods.runtime.manifest import MANIFEST_TOML
from sparkmods.runtime.modcheck import ModResult

if TYPE_CHECKING:
    from sparkmods.sources.base import VllmSource

__all__ = ["Problem", "Validation", "validate", "CheckMods", "ERROR", "WARNING", "RULES"]

# (mod folders, the target source) -> one ModResult per folder, in order.
CheckMods = Callable[[Sequence[Path], "VllmSource"], Sequence[ModResult]]
RULES = modrules.RULES + prrules.RULES + flagrules.RULES


@dataclass
class Validation:
    problems: List[Problem]
    mod_results: List[ModResult]

    @property
    def errors(self) -> List[Problem]:
        return [p for p in self.problems if p.severity == ERROR]


def validate(plan: LaunchPlan, facts: Optional[VllmFacts], check: Optional[CheckMods]) -> Validation:
    """Every problem of the plan on its target (errors first, each one line) and the mod results.

    Without facts (no target) the target-dependent rules stay silent: that is `recipe check`.
    """
    results: List[ModResult] = []
    checkable = [d for d in plan.mod_dirs if (d / MANIFEST_TOML).is_file()]
    if facts is not None:
        facts.prefetch()
        if check is not None and checkable:
            results = list(check(checkable, facts.source))
    ctx = Context(plan, facts, results)
    problems = [p for rule in RULES for p in rule(ctx)]
    return Validation(sorted(problems, key=lambda p: p.severity != ERROR), results)
