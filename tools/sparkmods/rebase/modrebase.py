"""Mod-level rebase: give a mod a variant for a vLLM none of its variants works on.

The nearest variant with patches is the source; its patches were verified on some releases
(`verified`), so one of those (the one nearest to onto whose files the patches fit) is the
base of a three-way rebase of every patch. The new variant's range starts at onto and ends
where the next variant (or upstream.since) begins; a variant whose range holds onto is cut
to end below it, so ranges stay disjoint. mod.toml is edited minimally and validated before
an atomic rename; patch files are written first and removed again if anything fails.
"""

from __future__ import annotations

import posixpath
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from sparkmods.checking.drift import DriftFinding, check_patched, new_findings
from sparkmods.errors import SparkmodsError
from sparkmods.runtime.engine import plan as engine_plan
from sparkmods.runtime.manifest import MANIFEST_TOML, Manifest, ManifestError, Variant
from sparkmods.runtime.modcheck import variant_patches
from sparkmods.runtime.pep440 import Range, Version
from sparkmods.runtime.udiff import FilePatch, parse_patch

from .core import BaseMismatch, RebaseResult, Tree, rebase_patches
from .tomledit import TomlEditError, edit_manifest, render_variant

__all__ = ["PatchPlan", "ModPlan", "nearest_variant", "plan_ranges", "base_candidates", "default_label",
           "patches_by_file", "rebase_variant", "plan_mod", "drift_of", "new_manifest_text", "verify_plan",
           "write_plan"]


@dataclass
class PatchPlan:
    source: str  # patches/<old label>/x.patch
    target: str  # patches/<new label>/x.patch
    result: RebaseResult
    drift: List[DriftFinding] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.result.clean and not self.drift


@dataclass
class ModPlan:
    mod: str
    onto: str  # version
    variant: Variant  # the source variant
    base: str  # the release the patches were rebased from
    label: str
    range: str
    cuts: Dict[str, Tuple[str, str]]  # label -> (old range, new range)
    patches: List[PatchPlan]

    @property
    def clean(self) -> bool:
        return all(p.clean for p in self.patches)

    @property
    def carried(self) -> List[PatchPlan]:
        """The patches the new variant needs (a patch onto already contains is dropped)."""
        return [p for p in self.patches if p.result.patch]

    @property
    def new_files(self) -> List[PatchPlan]:
        """The carried patches that need a new file (the others are reused as they are)."""
        return [p for p in self.carried if p.target != p.source]

    def to_dict(self) -> dict:
        return {"mod": self.mod, "onto": self.onto, "from_variant": self.variant.label, "base": self.base,
                "label": self.label, "vllm": self.range, "clean": self.clean,
                "cuts": [{"variant": k, "from": a, "to": b} for k, (a, b) in self.cuts.items()],
                "patches": [{"from": p.source, "to": p.target, "result": p.result.to_dict(),
                             "drift": [f.to_dict() for f in p.drift]} for p in self.patches]}


def nearest_variant(manifest: Manifest, onto: Version) -> Variant:
    """The variant with patches whose range holds onto, else the one whose verified release
    is nearest below onto, else nearest above."""
    cands = [v for v in manifest.variants if v.patches]
    if not cands:
        raise SparkmodsError(f"mod {manifest.name!r} has no variant with patches: nothing to rebase")
    for v in cands:
        if v.vllm.contains(onto):
            return v

    def verified(v: Variant) -> List[Version]:
        return sorted(Version(x) for x in v.verified)
    below = [(max(x for x in verified(v) if x < onto), i) for i, v in enumerate(cands)
             if any(x < onto for x in verified(v))]
    if below:
        return cands[max(below)[1]]
    above = [(min(verified(v)), i) for i, v in enumerate(cands) if v.verified]
    if not above:
        raise SparkmodsError(f"mod {manifest.name!r}: no variant lists a verified release to rebase from")
    return cands[min(above)[1]]


def base_candidates(variant: Variant, onto: Version) -> List[str]:
    """The variant's verified releases to rebase from: the newest below onto first, then
    older ones, then those above onto (oldest first)."""
    below = sorted((x for x in variant.verified if Version(x) < onto), key=Version, reverse=True)
    above = sorted((x for x in variant.verified if Version(x) >= onto), key=Version)
    return below + above


def _lower_clause(r: Range) -> str:
    if r.lower is None:
        return ""
    return (">=" if r.lower_inclusive else ">") + str(r.lower)


def plan_ranges(manifest: Manifest, onto: Version) -> Tuple[str, Dict[str, Tuple[str, str]]]:
    """(the new variant's range, label -> (old, new) range of each variant cut below onto)."""
    v = onto.public
    cuts: Dict[str, Tuple[str, str]] = {}
    bounds: List[Tuple[Version, str]] = []  # (version, clause) candidates for the upper end
    for var in manifest.variants:
        r = var.vllm
        if r.contains(v):
            if r.lower is not None and r.lower == v:
                raise SparkmodsError(f"variant {var.label!r} ({r}) starts at {v}: edit it by hand rather than replace it")
            above = [x for x in var.verified if Version(x).public >= v]
            if above:
                raise SparkmodsError(f"variant {var.label!r} is verified on {', '.join(above)}, at or above {v}: its "
                                     f"range cannot end below {v}; fix its `verified` list or pick another --onto")
            low = _lower_clause(r)
            cuts[var.label] = (str(r), f"{low}, <{v}" if low else f"<{v}")
            if r.upper is not None:
                bounds.append((r.upper, ("<=" if r.upper_inclusive else "<") + str(r.upper)))
        elif r.lower is not None and (r.lower > v or (r.lower == v and not r.lower_inclusive)):
            bounds.append((r.lower, ("<" if r.lower_inclusive else "<=") + str(r.lower)))
    if manifest.upstream is not None and manifest.upstream.since > v:
        bounds.append((manifest.upstream.since, f"<{manifest.upstream.since}"))
    if manifest.upstream is not None and manifest.upstream.since <= v:
        raise SparkmodsError(f"vLLM {v} is past upstream.since {manifest.upstream.since}: the mod is not needed there")
    new = f">={v}"
    if bounds:
        lowest = min(b[0] for b in bounds)
        tight = sorted(c for b, c in bounds if b == lowest)  # "<" sorts before "<=": the tighter one
        new += f", {tight[0]}"
    return new, cuts


def default_label(variant: Variant, onto: Version) -> str:
    label = f"{variant.label}-{onto.public}"
    return label if len(label) <= 40 else f"v{onto.public}"


def patches_by_file(mod_dir: Path, variant: Variant) -> Dict[str, List[FilePatch]]:
    """Each patch file of the variant, parsed (the variant's own checks run first)."""
    variant_patches(mod_dir, variant)  # unreadable, malformed or overlapping patches: ManifestError
    return {rel: parse_patch((mod_dir / rel).read_text(encoding="utf-8")) for rel in variant.patches}


def rebase_variant(mod_dir: Path, manifest: Manifest, variant: Variant, patches: Dict[str, List[FilePatch]],
                   base: Tree, onto: Tree, label: str) -> List[PatchPlan]:
    """Rebase every patch file of the variant from base onto onto, with drift checks."""
    plans = []
    names = [posixpath.basename(p) for p in variant.patches]
    if len(set(names)) != len(names):
        raise SparkmodsError(f"variant {variant.label!r}: two patch files share a name; rename one")
    for rel in variant.patches:
        fps = patches[rel]
        try:
            result = rebase_patches(fps, base, onto)
        except BaseMismatch as exc:
            raise SparkmodsError(f"{mod_dir / rel}: {exc}") from None
        unchanged = result.clean and result.patch == (mod_dir / rel).read_text(encoding="utf-8")
        target = rel if unchanged else f"patches/{label}/{posixpath.basename(rel)}"  # shared patches stay shared
        plan = PatchPlan(rel, target, result)
        if result.clean:
            plan.drift = drift_of(fps, result, base, onto)
        plans.append(plan)
    return plans


def plan_mod(mod_dir: Path, manifest: Manifest, onto: Tree, open_release: Callable[[str], Tree],
             label: Optional[str] = None) -> ModPlan:
    """The rebase of the nearest variant onto `onto`, from the first of its verified releases
    (open_release opens one by version) whose files its patches fit; what `sparkmods rebase`
    and the nightly heal both run."""
    version = Version(onto.version)
    variant = nearest_variant(manifest, version)
    label = label or default_label(variant, version)
    if any(v.label == label for v in manifest.variants):
        raise SparkmodsError(f"{manifest.name}: a variant is already labelled {label!r}; pass --label")
    new_range, cuts = plan_ranges(manifest, version)
    patches = patches_by_file(mod_dir, variant)
    problems = []
    for candidate in base_candidates(variant, version):
        base = open_release(candidate)
        try:
            plans = rebase_variant(mod_dir, manifest, variant, patches, base, onto, label)
        except SparkmodsError as exc:
            problems.append(str(exc))
            continue
        return ModPlan(manifest.name, onto.version, variant, candidate, label, new_range, cuts, plans)
    raise SparkmodsError(f"{manifest.name}: the patches of variant {variant.label!r} apply to none of its "
                         f"verified releases ({'; '.join(problems) or 'none listed'})")


def drift_of(fps: Sequence[FilePatch], result: RebaseResult, base: Tree, onto: Tree) -> List[DriftFinding]:
    """Drift the rebased patch shows on onto that the original did not show on base."""
    on_base = {f.path: (f.before, f.after) for f in engine_plan(fps, base.read) if f.changes}
    before = check_patched(on_base, base.read, base.list_files)
    after = check_patched(result.changes(), onto.read, onto.list_files)
    return new_findings(after, before)


def _load_toml(text: str, where: str) -> Dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SparkmodsError(f"{where}: {exc}") from None


def new_manifest_text(mod_dir: Path, manifest: Manifest, plan: ModPlan) -> str:
    """mod.toml with the new variant and the cut ranges; validated, else SparkmodsError."""
    path = mod_dir / MANIFEST_TOML
    text = path.read_text(encoding="utf-8")
    raw = _load_toml(text, str(path))
    source = next(t for t in raw["variant"] if t["label"] == plan.variant.label)
    table: Dict[str, Any] = {"label": plan.label, "vllm": plan.range, "patches": [p.target for p in plan.carried],
                             "verified": []}
    for key in ("install", "notes"):
        if key in source:
            table[key] = source[key]
    comment = (f"rebased by `sparkmods rebase` from variant {plan.variant.label!r} (vLLM {plan.base}) onto "
               f"{plan.onto}; check it on {plan.onto}, then add {plan.onto} to verified")
    try:
        new_text = edit_manifest(text, {k: b for k, (_, b) in plan.cuts.items()}, plan.variant.label,
                                 render_variant(table, comment))
    except TomlEditError as exc:
        raise SparkmodsError(f"{path}: {exc}; add the variant by hand") from None
    expected = dict(raw)
    variants = [dict(t) for t in raw["variant"]]
    for t in variants:
        if t["label"] in plan.cuts:
            t["vllm"] = plan.cuts[t["label"]][1]
    at = next(i for i, t in enumerate(variants) if t["label"] == plan.variant.label)
    variants.insert(at + 1, table)
    expected["variant"] = variants
    got = _load_toml(new_text, f"{path} (edited)")
    if got != expected:
        raise SparkmodsError(f"{path}: the minimal edit did not produce the intended manifest; add the variant by hand")
    try:
        Manifest.from_dict(got, str(path))
    except ManifestError as exc:
        raise SparkmodsError(f"{exc} (after adding variant {plan.label!r})") from None
    return new_text


def verify_plan(plan: ModPlan, onto_read: Callable[[str], Optional[bytes]]) -> None:
    """The new variant's patches, together, must apply with every hunk exact to onto."""
    fps: List[FilePatch] = []
    seen: Dict[str, str] = {}
    for p in plan.carried:
        for fp in parse_patch(p.result.patch or ""):
            if fp.path in seen:
                raise SparkmodsError(f"{p.source} and {seen[fp.path]} both land in {fp.path} on {plan.onto}: "
                                     f"merge them by hand")
            seen[fp.path] = p.source
            fps.append(fp)
    for res in engine_plan(fps, onto_read):
        if res.status != "ok" or any(h.outcome != "exact" for h in res.hunks):
            raise SparkmodsError(f"internal: the rebased patches do not apply exactly to {plan.onto} "
                                 f"({res.path}: {res.status})")


def write_plan(mod_dir: Path, manifest: Manifest, plan: ModPlan, write: Callable[[Path, bytes], None],
               onto_read: Callable[[str], Optional[bytes]]) -> List[str]:
    """Write the new patch files, then mod.toml (all validated first); returns what was written."""
    text = new_manifest_text(mod_dir, manifest, plan)
    verify_plan(plan, onto_read)
    folder = mod_dir / "patches" / plan.label
    if plan.new_files and folder.exists():
        raise SparkmodsError(f"{folder} already exists: pick another --label")
    written: List[Path] = []
    try:
        for p in plan.new_files:
            target = mod_dir / p.target
            write(target, (p.result.patch or "").encode("utf-8"))
            written.append(target)
        write(mod_dir / MANIFEST_TOML, text.encode("utf-8"))
    except BaseException:
        for target in written:
            target.unlink(missing_ok=True)
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        raise
    return [p.target for p in plan.new_files] + [MANIFEST_TOML]

