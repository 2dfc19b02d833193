"""The served layer: which mod variants a GPU end-to-end run served on which vLLM release.

Derived, never typed: `ci/gpu/e2e.py` writes one JSON document per scenario (the scenario is
named after the mod it proves) with the release, the GPU and every check; a scenario whose
checks all passed is evidence that the mod's variant for that release serves. The matrix marks
a green cell served when such evidence names the same mod, release and variant, so a cell
changes only when the results or the variant do. What run.sh said in the run must agree (a run
whose run.sh called the mod not needed proves the upstream claim, not a variant). A result must
name the variant it ran (`variants`, as run.sh reported it): today's manifest cannot say what ran
then, nor can a label: a result must also record the variant's fingerprint (`fingerprints`: its
patches and install sources), and stops being evidence once they change. Results older than the
`date` field get it from the run's summary.md heading.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from sparkmods.checking.fingerprints import variant_fingerprints
from sparkmods.runtime.manifest import Manifest, Variant
from sparkmods.runtime.modcheck import GREEN

RESULTS = Path("ci") / "bench" / "results"
RUN_GLOB = "gpu-e2e-*"
UPSTREAM = "upstream"  # the variant recorded when vLLM itself does what the mod did
_HEADING = re.compile(r"^## (\d{4}-\d{2}-\d{2}) [\d:]+ vLLM (\S+) on (.+)$")
_GPU = re.compile(r"\b([A-Z]+\d{2,4}[A-Z]?)\b")

Key = Tuple[str, str]  # (mod, vLLM version)


@dataclass(frozen=True)
class Served:
    """One passing end-to-end run of a mod's variant on a release."""

    mod: str
    vllm: str
    variant: str
    gpu: str
    date: str
    path: str  # the scenario's result file, relative to the repository
    parallel: str = "one GPU"

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "date": self.date, "result": self.path, "parallel": self.parallel}


def describe(mark: Mapping[str, str]) -> str:
    """`served on H100 (2026-11-27)`: what a check row says of a cell's `served` mark."""
    found = _GPU.search(mark["gpu"])
    split = "" if mark.get("parallel", "one GPU") == "one GPU" else f", {mark['parallel']}"
    return f"served on {found.group(1) if found else mark['gpu']}{split} ({mark['date']})"


def results_dir(mod_dirs: Iterable[Path]) -> Optional[Path]:
    """The repository's results folder beside the mods folder, if there is one."""
    for mod_dir in mod_dirs:
        candidate = mod_dir.resolve().parent.parent / RESULTS
        return candidate if candidate.is_dir() else None
    return None


def variant_label(manifest: Manifest, version: str) -> Optional[str]:
    """The label of what the manifest selects for a release: a variant, `upstream`, or None."""
    chosen = manifest.select(version)
    if chosen is None:
        return None
    return chosen.label if isinstance(chosen, Variant) else UPSTREAM


def current_fingerprints(mod_dirs: Iterable[Path]) -> Dict[Tuple[str, str], str]:
    """(mod, variant label) -> the variant's fingerprint today."""
    return {(d.name, label): fp for d in mod_dirs for label, fp in variant_fingerprints(d).items()}


def _dates(summary: Path) -> Dict[Tuple[str, str], str]:
    """(vLLM, device) -> the newest date of a run heading in a summary.md."""
    out: Dict[Tuple[str, str], str] = {}
    if summary.is_file():
        for line in summary.read_text(encoding="utf-8", errors="replace").splitlines():
            m = _HEADING.match(line)
            if m:
                device = m.group(3).split(",")[0].strip()
                out[(m.group(2), device)] = max(m.group(1), out.get((m.group(2), device), ""))
    return out


def _applied(checks: List[dict], mod: str) -> Optional[str]:
    """What the run's run.sh of `mod` did: `upstream` (it said the mod is not needed), `applied`,
    or None when no server of the run applied the mod."""
    said = [str(c.get("detail", "")) for c in checks if str(c.get("name", "")).endswith(f"run.sh of {mod} succeeds")]
    if not said:
        return None
    return UPSTREAM if any(line.startswith(f"[{mod}] not needed") for line in said) else "applied"


def _evidence(doc: dict, path: Path, repo: Path, manifests: Mapping[str, Manifest],
              fingerprints: Mapping[Tuple[str, str], str]) -> Optional[Served]:
    mod, version = doc.get("scenario"), doc.get("vllm")
    checks = doc.get("checks") or []
    if not isinstance(mod, str) or mod not in manifests or not isinstance(version, str) or not checks:
        return None
    if not all(c.get("passed") for c in checks):
        return None
    device = str(doc.get("device") or "unknown")
    done = _applied(checks, mod)
    variant = (doc.get("variants") or {}).get(mod)
    if not isinstance(variant, str) or done is None or (done == UPSTREAM) != (variant == UPSTREAM):
        return None  # no variant named, the mod was not applied, or run.sh did not do what the variant says
    recorded = (doc.get("fingerprints") or {}).get(mod)
    if variant != UPSTREAM and (recorded is None or recorded != fingerprints.get((mod, variant))):
        return None  # no bytes recorded, or the variant's patches changed since this run served them
    date = doc.get("date") or _dates(path.parent / "summary.md").get((version, device), "")
    if not date:
        return None
    return Served(mod, version, variant, device, date, path.relative_to(repo).as_posix(),
                  str(doc.get("parallel") or "one GPU"))


def index(results: Optional[Path], manifests: Mapping[str, Manifest],
          fingerprints: Mapping[Tuple[str, str], str]) -> Dict[Key, List[Served]]:
    """Every passing run under `results` that still describes its variant (`fingerprints`: today's,
    by mod and label), by (mod, release), newest first."""
    found: Dict[Key, List[Served]] = {}
    if results is None:
        return found
    repo = results.resolve().parents[len(RESULTS.parts) - 1]
    for path in sorted(results.resolve().glob(f"{RUN_GLOB}/**/*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        served = _evidence(doc, path, repo, manifests, fingerprints) if isinstance(doc, dict) else None
        if served is not None:
            found.setdefault((served.mod, served.vllm), []).append(served)
    for runs in found.values():
        runs.sort(key=lambda s: (s.date, s.path), reverse=True)
    return found


def lookup(found: Mapping[Key, List[Served]], mod: str, version: str, variant: Optional[str],
           status: str) -> Optional[Served]:
    """The newest run that served this green cell's variant, or None."""
    if status not in GREEN:
        return None
    wanted = variant or UPSTREAM
    return next((s for s in found.get((mod, version), []) if s.variant == wanted), None)


def attach(doc: dict, found: Mapping[Key, List[Served]]) -> dict:
    """doc with every cell's `served` set from `found` (and removed where nothing serves it)."""
    for cell in doc["cells"]:
        served = lookup(found, cell["mod"], cell["vllm"], cell.get("variant"), cell["status"])
        if served is None:
            cell.pop("served", None)
        else:
            cell["served"] = served.to_dict()
    return doc
