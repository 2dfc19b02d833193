"""Judge a community mod on a vLLM the way its run.sh behaves there.

Steps run in order, each against the files the steps before it left (a stack of patches is
judged as one). A step that fails (a conflict, a missing file, or a change already present:
`patch` and `git apply` both exit 1 on it) stops run.sh unless run.sh tolerates it; a
tolerated failure of a change that is not there is `skipped`: run.sh exits 0, the container
starts, and the model runs without the fix. That is the harmful case, and it is never green.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from sparkmods.checking.batch import SOURCE_JOBS
from sparkmods.community.runsh import CommunityMod, PatchStep
from sparkmods.pyindex import gcpause
from sparkmods.runtime.engine import APPLIED, CONFLICT, EXACT, OFFSET, OK, OK_OFFSET, FileResult, plan
from sparkmods.runtime.modcheck import ModResult, aggregate
from sparkmods.runtime.udiff import FilePatch, Hunk

if TYPE_CHECKING:
    from sparkmods.sources.base import VllmSource

__all__ = ["SKIPPED", "NOT_CHECKABLE", "CommunityResult", "judge", "judge_all", "not_checkable"]

SKIPPED = "skipped"  # a failed patch run.sh goes on after: the mod silently does nothing (or half)
NOT_CHECKABLE = "not-checkable"


@dataclass
class CommunityResult(ModResult):
    """A row for a community mod: the mod-level status plus what each step did."""

    steps: List[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        out = super().to_dict()
        out["steps"] = self.steps
        return out


def not_checkable(mod: CommunityMod, version: str = "-") -> CommunityResult:
    return CommunityResult(mod.name, version, NOT_CHECKABLE, None, mod.why_not(),
                           steps=[b.to_dict() for b in mod.blockers])


def _half_written(step: PatchStep, files: Sequence[FileResult]) -> str:
    """GNU patch writes the hunks that fit and leaves .rej files for the rest (git apply and a
    dry-run-guarded step write nothing)."""
    if step.tool != "patch" or step.guarded:
        return ""
    fitted = sum(1 for f in files if f.status == CONFLICT for h in f.hunks if h.outcome in (EXACT, OFFSET))
    return f"; GNU patch still writes {fitted} hunk(s) and leaves .rej files (a half-patched vLLM)" if fitted else ""


GNU_FUZZ = 2  # GNU patch's default -F: up to this many context lines at a hunk's ends may differ


def _trimmed(hunk: Hunk, fuzz: int) -> Hunk:
    """The hunk with up to `fuzz` context lines dropped at each end, as GNU patch's locate_hunk
    drops them (each end's share reduced by how much shorter its context is than the longer)."""
    lead = next((i for i, (tag, _) in enumerate(hunk.lines) if tag != " "), len(hunk.lines))
    tail = next((i for i, (tag, _) in enumerate(reversed(hunk.lines)) if tag != " "), len(hunk.lines))
    context = max(lead, tail)
    cut_lead, cut_tail = max(0, min(lead, fuzz + lead - context)), max(0, min(tail, fuzz + tail - context))
    lines = hunk.lines[cut_lead:len(hunk.lines) - cut_tail]
    cut = cut_lead + cut_tail
    return Hunk(hunk.old_start + cut_lead, hunk.old_len - cut, hunk.new_start + cut_lead, hunk.new_len - cut,
                hunk.section, lines, hunk.old_eof_newline or cut_tail > 0, hunk.new_eof_newline or cut_tail > 0)


def _with_fuzz(step: PatchStep, read: Callable[[str], Optional[bytes]]) -> Optional[Tuple[List[FileResult], str, str]]:
    """GNU patch applies a hunk whose outer context lines differ (fuzz 1, then 2): the step's
    plan with the least fuzz that fits, or None."""
    for fuzz in range(1, GNU_FUZZ + 1):
        patches = [FilePatch(fp.old_path, fp.new_path, [_trimmed(h, fuzz) for h in fp.hunks])
                   if not (fp.is_new or fp.is_delete) else fp for fp in step.patches]
        files = plan(patches, read)
        status, _ = aggregate(files)
        if status in (OK, OK_OFFSET):
            return files, OK_OFFSET, f"applies only with fuzz {fuzz} (GNU patch allows {GNU_FUZZ})"
    return None


def judge(mod: CommunityMod, source: VllmSource, keep_bytes: bool = False) -> CommunityResult:
    """The row for one checkable mod on one source (read, version; prefetch/list_files optional).
    keep_bytes: the row's files keep the vLLM files before and after every step (for adopt)."""
    from sparkmods.checking.drift import drift_status  # parses vLLM's Python: only when a row is judged

    overlay: Dict[str, Optional[bytes]] = {}
    originals: Dict[str, Optional[bytes]] = {}

    def read(path: str) -> Optional[bytes]:
        return overlay[path] if path in overlay else source.read(path)

    prefetch = getattr(source, "prefetch", None)
    if prefetch is not None:
        prefetch(sorted({fp.path for step in mod.steps for fp in step.patches}))
    steps: List[dict] = []
    skipped: List[str] = []
    statuses: List[str] = []
    for step in mod.steps:
        files = plan(step.patches, read)
        status, reason = aggregate(files)
        fuzzed = _with_fuzz(step, read) if status == CONFLICT and step.tool == "patch" else None
        if fuzzed is not None:
            files, status, reason = fuzzed
        where = f"{step.source} (run.sh line {step.line})"
        steps.append({**step.to_dict(), "status": status, "reason": reason, "files": [f.to_dict() for f in files]})
        statuses.append(status)
        if status in (OK, OK_OFFSET):
            for f in files:
                if f.changes:
                    originals.setdefault(f.path, f.before)
                    overlay[f.path] = f.after
            continue
        if status == APPLIED and step.batch and not step.guarded:
            return CommunityResult(mod.name, source.version, CONFLICT, None,
                                   f"{where}: already in this vLLM, and GNU patch -t takes it for a reversed "
                                   f"patch and undoes it", steps=steps)
        why = reason or "already in this vLLM"
        if step.tolerated:
            if status != APPLIED:
                skipped.append(f"{where}: {why}{_half_written(step, files)}; run.sh goes on ({step.tolerated})")
            continue
        tool = f"`{step.tool}` exits 1 on it" if status == APPLIED else ""
        done = f" after changing {', '.join(sorted(overlay))}" if overlay else ""
        return CommunityResult(mod.name, source.version, CONFLICT if status == APPLIED else status, None,
                               f"{where}: {why}{_half_written(step, files)}; {tool + ' and ' if tool else ''}"
                               f"run.sh stops{done}", steps=steps)
    if skipped:
        return CommunityResult(mod.name, source.version, SKIPPED, None, "skipped silently: " + "; ".join(skipped),
                               steps=steps)
    if all(s == APPLIED for s in statuses):
        return CommunityResult(mod.name, source.version, APPLIED, None, "", steps=steps)
    fuzzy = "; ".join(f"{s['file']}: {s['reason']}" for s in steps if "fuzz" in s["reason"])
    result = CommunityResult(mod.name, source.version, OK_OFFSET if OK_OFFSET in statuses else OK, None, fuzzy,
                             [FileResult(p, OK, before=originals[p], after=overlay[p]) for p in sorted(overlay)],
                             steps=steps)
    verdict = drift_status(source, result)
    if verdict is not None:
        result.status, result.reason = verdict
    for f in result.files if not keep_bytes else ():
        f.before = f.after = None  # only the decision needed the bytes
    return result


def judge_all(mods: Sequence[CommunityMod], sources: Sequence[VllmSource], jobs: int = SOURCE_JOBS) -> List[List[CommunityResult]]:
    """Rows per source (in order), a not-checkable row for each mod that cannot be judged."""

    def one(source: VllmSource) -> List[CommunityResult]:
        try:
            return [judge(m, source) if m.checkable else not_checkable(m, source.version) for m in mods]
        finally:
            release = getattr(source, "release", None)
            if release is not None:
                release()

    with gcpause.paused(), ThreadPoolExecutor(max_workers=max(1, min(jobs, len(sources)))) as pool:
        return list(pool.map(one, sources))
