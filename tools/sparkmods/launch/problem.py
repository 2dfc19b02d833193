"""What a validation rule reports, and what it gets to look at."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from sparkmods.launch.plan import LaunchPlan
from sparkmods.launch.vllmfacts import VllmFacts
from sparkmods.runtime.modcheck import ModResult

__all__ = ["Problem", "Context", "ERROR", "WARNING"]

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class Problem:
    """One finding: the rule's short name and one line saying what to change."""

    rule: str
    message: str
    severity: str = ERROR

    def __str__(self) -> str:
        return f"{self.severity}: {self.rule}: {self.message}"

    def to_dict(self) -> dict:
        return {"severity": self.severity, "rule": self.rule, "message": self.message}


@dataclass
class Context:
    """What every rule sees: the plan, the target's facts (None: no target), the mod results."""

    plan: LaunchPlan
    facts: Optional[VllmFacts]
    mod_results: Sequence[ModResult]

    @property
    def where(self) -> str:
        return self.facts.label if self.facts else "the target vLLM"
