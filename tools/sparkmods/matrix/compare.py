"""Compare two matrix documents: regressions, fixes, new releases; and staleness checks."""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from sparkmods.checking.fingerprints import checker_fingerprint, mod_fingerprint
from sparkmods.matrix.build import served_index
from sparkmods.matrix.document import TIMESTAMP_KEY
from sparkmods.matrix.served import attach
from sparkmods.runtime.modcheck import GREEN


@dataclass
class Diff:
    regressions: List[str] = field(default_factory=list)
    fixes: List[str] = field(default_factory=list)
    new_releases: List[str] = field(default_factory=list)
    changed: List[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"regressions": self.regressions, "fixes": self.fixes,
                "new_releases": self.new_releases, "changed": self.changed}


def _cells(doc: dict) -> Dict[Tuple[str, str], dict]:
    return {(c["mod"], c["vllm"]): c for c in doc["cells"]}


def compare(old: dict, new: dict) -> Diff:
    """What changed from old to new; a regression is a cell that was green and is not."""
    diff = Diff()
    before, after = _cells(old), _cells(new)
    old_versions = {r["vllm"] for r in old["releases"]}
    diff.new_releases = [r["vllm"] for r in new["releases"] if r["vllm"] not in old_versions]
    for key, cell in after.items():
        prior = before.get(key)
        if prior is None:
            continue
        label = f"{key[0]} on vLLM {key[1]}: {prior['status']} -> {cell['status']}"
        if prior["status"] in GREEN and cell["status"] not in GREEN:
            diff.regressions.append(label)
        elif prior["status"] not in GREEN and cell["status"] in GREEN:
            diff.fixes.append(label)
        elif prior["status"] != cell["status"] or prior.get("variant") != cell.get("variant"):
            diff.changed.append(label)
    return diff


def without_timestamp(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != TIMESTAMP_KEY}


def stale_mods(doc: dict, mod_dirs: Sequence[Path]) -> List[str]:
    """One line per mod whose fingerprint changed (or that was added or removed) since doc was made,
    and one if the drift-check code changed (every cell's status may differ then)."""
    problems = []
    if doc.get("checker") != checker_fingerprint():
        problems.append("the drift checks changed since the matrix was generated")
    recorded = {m["name"]: m["content_hash"] for m in doc["mods"]}
    present = {d.name: d for d in mod_dirs}
    for name, path in sorted(present.items()):
        if name not in recorded:
            problems.append(f"mod {name} is not in the matrix")
        elif recorded[name] != mod_fingerprint(path):
            problems.append(f"mod {name} changed since the matrix was generated")
    for name in sorted(set(recorded) - set(present)):
        problems.append(f"mod {name} is in the matrix but no longer exists")
    return problems


def stale_served(doc: dict, mod_dirs: Sequence[Path]) -> List[str]:
    """One line per cell whose served mark disagrees with the committed GPU results."""
    fresh = {(c["mod"], c["target"]): c.get("served") for c in attach(deepcopy(doc), served_index(mod_dirs))["cells"]}
    return [f"{c['mod']} on {c['target']}: the served mark differs from ci/bench/results"
            for c in doc["cells"] if c.get("served") != fresh[(c["mod"], c["target"])]]
