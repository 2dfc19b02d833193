"""Compute the matrix document, re-checking only cells whose inputs changed.

A cell's inputs are the mod's fingerprint (its manifest, patches, installed files and the
runtime's code: checking/fingerprints.py, so an engine change re-checks everything, a docstring edit
nothing) and the wheel's sha256 from the index. When both equal what the previous matrix recorded, the old cell is reused without a
byte of network traffic. Sources without a sha256 (dir:, git:, image:) are always re-checked,
and so is everything when the drift-check code changed (`checker`, see checking/fingerprints.py).
Cells the previous matrix cannot give come from checking.batch.check_source, which reuses the rows
`sparkmods check` stored for the same inputs (resultcache.py) before checking anything.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from sparkmods.checking import resultcache
from sparkmods.checking.batch import SOURCE_JOBS, check_source
from sparkmods.checking.fingerprints import checker_fingerprint, mod_fingerprint
from sparkmods.matrix import served
from sparkmods.matrix.document import document
from sparkmods.modsdir import load
from sparkmods.pyindex import gcpause
from sparkmods.runtime.manifest import Manifest
from sparkmods.runtime.modcheck import ModResult
from sparkmods.runtime.pep440 import Version

if TYPE_CHECKING:
    from sparkmods.sources.base import VllmSource


def _mod_entry(manifest: Manifest, content_hash: str) -> dict:
    entry: Dict[str, Any] = {
        "name": manifest.name,
        "summary": manifest.summary,
        "content_hash": content_hash,
        "variants": [{"label": v.label, "vllm": str(v.vllm), "verified": list(v.verified)} for v in manifest.variants],
    }
    if manifest.upstream is not None:
        entry["upstream"] = {"since": str(manifest.upstream.since), "evidence": manifest.upstream.evidence}
    return entry


def cell_from_result(result: ModResult, target: str, content_hash: str, sha256: Optional[str]) -> dict:
    """A matrix cell: status, variant and the detail needed to say what breaks where."""
    files = []
    for f in result.files:
        unusual = [h.to_dict() for h in f.hunks if h.outcome not in ("exact",)]
        if f.status not in ("ok",) or unusual:
            entry = {"path": f.path, "status": f.status, "hunks": unusual}
            if f.reason:
                entry["reason"] = f.reason
            files.append(entry)
    cell: Dict[str, Any] = {"mod": result.mod, "vllm": result.version, "target": target, "status": result.status,
            "variant": result.variant, "mod_hash": content_hash, "wheel_sha256": sha256}
    if result.reason:
        cell["reason"] = result.reason
    if files:
        cell["files"] = files
    return cell


def _reusable(previous: Optional[dict], checker: str) -> Dict[Tuple[str, str], dict]:
    if not previous or previous.get("checker") != checker:
        return {}
    return {(c["mod"], c["target"]): c for c in previous.get("cells", []) if c.get("wheel_sha256")}


@dataclass
class Built:
    """The document, and how many cells were reused from the previous one or checked anew
    (what `sparkmods matrix` tells the user, so a run that checked nothing says so)."""

    doc: dict
    reused: int  # from the previous matrix or the result cache
    rechecked: int
    from_cache: int = 0  # of reused: from the result cache


def build(mod_dirs: Sequence[Path], sources: Sequence, previous: Optional[dict] = None,
          on_progress: Optional[Callable[[str], None]] = None, jobs: int = SOURCE_JOBS) -> dict:
    """The matrix document for these mods on these sources (oldest first)."""
    return build_counted(mod_dirs, sources, previous, on_progress, jobs).doc


def served_index(mod_dirs: Sequence[Path]) -> Dict[served.Key, List[served.Served]]:
    """The GPU runs committed beside these mods (served.py), by (mod, release)."""
    return served.index(served.results_dir(mod_dirs), {d.name: load(d) for d in mod_dirs},
                        served.current_fingerprints(mod_dirs))


def build_counted(mod_dirs: Sequence[Path], sources: Sequence, previous: Optional[dict] = None,
                  on_progress: Optional[Callable[[str], None]] = None, jobs: int = SOURCE_JOBS) -> Built:
    """build(), counting reused and re-checked cells; each green cell marked with the GPU run
    that served its variant, if one did."""
    mods = [(d, load(d)) for d in mod_dirs]
    hashes = {m.name: mod_fingerprint(d) for d, m in mods}
    checker = checker_fingerprint()
    counts = resultcache.active().counts
    stored_before = counts.reused
    old = _reusable(previous, checker)

    def one(source: VllmSource) -> Tuple[List[dict], int]:
        cells: Dict[str, dict] = {}
        todo = []
        for mod_dir, manifest in mods:
            prior = old.get((manifest.name, source.label))
            if (prior and source.sha256 and prior["wheel_sha256"] == source.sha256
                    and prior["mod_hash"] == hashes[manifest.name]):
                cells[manifest.name] = prior
            else:
                todo.append((mod_dir, manifest))
        if todo:
            for row in check_source(todo, source, hashes):
                cells[row.result.mod] = cell_from_result(row.result, source.label, hashes[row.result.mod], source.sha256)
        if on_progress:
            on_progress(source.label)
        return [cells[m.name] for _, m in mods], len(todo)

    with gcpause.paused(), ThreadPoolExecutor(max_workers=max(1, min(jobs, len(sources)))) as pool:
        done = list(pool.map(one, sources))
    per_source = [cells for cells, _ in done]
    from_cache = counts.reused - stored_before
    rechecked = sum(n for _, n in done) - from_cache
    cells = [per_source[j][i] for i in range(len(mods)) for j in range(len(sources))]
    doc = document(sources, [_mod_entry(m, hashes[m.name]) for _, m in mods], cells)
    served.attach(doc, served_index(mod_dirs))
    return Built(doc, len(cells) - rechecked, rechecked, from_cache)


def sort_sources(sources: Sequence) -> List:
    """Oldest first by version, stable for equal versions (keeps the order the user gave)."""
    return sorted(sources, key=lambda s: Version(s.version))
