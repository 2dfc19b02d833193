"""A pull request's diff as launch-cluster.sh's `--apply-vllm-pr` applies it (prrules.py checks it
against the recipe's mods)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Tuple

from sparkmods.gitdiff import Change
from sparkmods.patchfile import read_diff_file
from sparkmods.runtime.engine import PACKAGE

__all__ = ["PrDiff", "read_pr_diff"]


@dataclass(frozen=True)
class PrDiff:
    """A PR's diff as the launcher applies it: only its changes under vllm/."""

    path: Path
    changes: Tuple[Change, ...]

    @property
    def files(self) -> Dict[str, Change]:
        return {p: c for c in self.changes for p in c.paths}


def read_pr_diff(path: Path) -> PrDiff:
    """The diff file (a bad one is one line naming it), kept to what the launcher applies."""
    changes = read_diff_file(path)
    return PrDiff(path, tuple(c for c in changes if all(p.startswith(PACKAGE + "/") for p in c.paths)))
