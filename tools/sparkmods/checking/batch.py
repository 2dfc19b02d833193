"""Check mods against vLLM sources: the host side of the shared `modcheck` decision.

For each source we first collect every path the chosen variants will read and prefetch them
together (one batch of parallel range requests per wheel), then run the same `check_mod`
that run.sh runs in the container. A row that applies is then checked for semantic drift
(drift.py): it turns `drift` when the patched code cannot work on that release, so a green
row means both "run.sh applies it" and "nothing we can read says it breaks".

A row is a pure function of its inputs, so rows already checked come from the result cache
(resultcache.py) without reading the source at all; only the others are checked and stored.
"""

from __future__ import annotations

import contextlib
import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from sparkmods.checking import cpuslots, resultcache
from sparkmods.checking.fingerprints import checker_fingerprint, code_fingerprint, mod_fingerprint
from sparkmods.checking.rows import CheckRow
from sparkmods.gitdiff import Change, plan_changes
from sparkmods.modsdir import load
from sparkmods.pyindex import gcpause
from sparkmods.runtime.manifest import Manifest, Upstream, Variant
from sparkmods.runtime.modcheck import (
    BASE_ENV,
    BaseMismatch,
    ModResult,
    aggregate,
    by_version,
    check_mod,
    variant_patches,
)
from sparkmods.runtime.pep440 import InvalidVersion
from sparkmods.runtime.udiff import FilePatch

if TYPE_CHECKING:
    from sparkmods.sources.base import VllmSource

# The drift checks as check_source calls them (checking.drift.drift_status, loaded when a row is checked).
DriftStatus = Callable[["VllmSource", ModResult, Optional[Sequence[FilePatch]]], Optional[Tuple[str, str]]]


def paths_needed(manifest: Manifest, mod_dir: Path, version: str, content: Optional[str] = None) -> Set[str]:
    """Every vLLM path the mod's decision for this version will read (content: see _patches):
    for a build chosen by content (modcheck.by_version), every variant's and the upstream checks'."""
    if not by_version(version):
        wanted = {d.file for d in manifest.upstream.detect} if manifest.upstream is not None else set()
        for variant in manifest.variants:
            wanted |= {fp.path for fp in _patches(mod_dir, variant, content)}
            wanted |= {item.name for item in variant.install if item.site}
        return wanted
    try:
        chosen = manifest.select(version)
    except InvalidVersion:
        return set()
    if isinstance(chosen, Variant):
        return {fp.path for fp in _patches(mod_dir, chosen, content)}
    if isinstance(chosen, Upstream):
        return {d.file for d in chosen.detect}
    return set()


def check_source(mods: Sequence["tuple[Path, Manifest]"], source: VllmSource,
                 hashes: Optional[Dict[str, str]] = None) -> List[CheckRow]:
    """All mods on one source (anything with version, read(), prefetch()), in order.

    hashes: mod name -> fingerprint (computed when not given). Rows are taken from the active
    result cache where stored; the source is read only for the rest, and released after.
    """
    cache = resultcache.active()
    hashes = hashes if hashes is not None else {m.name: mod_fingerprint(d) for d, m in mods}
    cached = {m.name: cache.get(hashes[m.name], source, m.name) for _, m in mods}
    results = {name: result for name, result in cached.items() if result is not None}
    todo = [(d, m) for d, m in mods if m.name not in results]
    try:
        if todo:
            wanted: Set[str] = set()
            for mod_dir, manifest in todo:
                wanted |= paths_needed(manifest, mod_dir, source.version, hashes[manifest.name])
            # The drift checks (ast and the Python index) load only when a row is checked, and
            # before the fetch below, whose network wait hides the import.
            from sparkmods.checking.drift import drift_status

            source.prefetch(sorted(wanted))
            with cpuslots.checking():
                for mod_dir, manifest in todo:
                    result = _checked(manifest, mod_dir, source, hashes[manifest.name], drift_status)
                    cache.put(hashes[manifest.name], source, result)
                    results[manifest.name] = _without_bytes(result)
    finally:
        _release(source)
    return [CheckRow(source.label, source.commit, source.sha256, results[m.name]) for _, m in mods]


def _checked(manifest: Manifest, mod_dir: Path, source: VllmSource, content: str, drift_status: DriftStatus) -> ModResult:
    """check_mod, then the drift checks (drift.drift_status) for a variant that applies."""
    result = check_mod(manifest, mod_dir, source.version, source.read)
    if result.green and result.variant is not None:
        chosen = next(v for v in manifest.variants if v.label == result.variant)
        verdict = drift_status(source, result, _patches(mod_dir, chosen, content))
        if verdict is not None:
            result.status, result.reason = verdict
            if result.how:
                result.reason += _drift_free(manifest, mod_dir, source, content, chosen, drift_status)
    return result


def _drift_free(manifest: Manifest, mod_dir: Path, source: VllmSource, content: str, chosen: Variant,
                drift_status: DriftStatus) -> str:
    """For a variant chosen by content that drifts: another variant that applies without drift,
    as the override that makes run.sh choose it (run.sh cannot run the drift checks)."""
    for variant in reversed(manifest.variants):
        if variant is chosen or not variant.verified:
            continue
        base = variant.verified[-1]
        try:
            other = check_mod(manifest, mod_dir, source.version, source.read, base)
        except BaseMismatch:
            continue
        if drift_status(source, other, _patches(mod_dir, variant, content)) is None:
            return f"; variant {variant.label} applies without drift: set {BASE_ENV}={base} for run.sh to choose it"
    return ""


def _patches(mod_dir: Path, variant: Variant, content: Optional[str]) -> List[FilePatch]:
    """variant_patches, read and parsed once per process for a mod whose content hash is given
    (it covers every file a variant reads, so equal hashes mean equal patches): this module would
    otherwise resolve, read and parse the same patch files twice more per mod and release.
    Errors are not kept: a bad patch raises every time."""
    if content is None:
        return variant_patches(mod_dir, variant)
    return list(_parsed_patches(mod_dir, variant.label, content))


@functools.lru_cache(maxsize=64)
def _parsed_patches(mod_dir: Path, label: str, content: str) -> "tuple[FilePatch, ...]":
    """The parse behind _patches, keyed by what is hashable (a Variant holds lists)."""
    chosen = next(v for v in load(mod_dir).variants if isinstance(v, Variant) and v.label == label)
    return tuple(variant_patches(mod_dir, chosen))


def check_patch_source(name: str, subject: str, changes: Sequence[Change], source: VllmSource) -> CheckRow:
    """A loose diff (no manifest; git's renames, modes and binary changes read as `git apply`
    reads them, gitdiff.py) on one source: the plan, then the drift checks; reused from the
    result cache under `subject` (fingerprints.patch_fingerprint) when stored."""
    cache = resultcache.active()
    result = cache.get(subject, source, name)
    if result is None:
        from sparkmods.checking.drift import drift_status  # see check_source

        try:
            source.prefetch(sorted({path for c in changes for path in c.paths}))
            files = plan_changes(list(changes), source.read)
            status, reason = aggregate(files)
            result = ModResult(name, source.version, status, None, reason, files)
            verdict = drift_status(source, result, [c.patch for c in changes if c.patch is not None])
            if verdict is not None:
                result.status, result.reason = verdict
            cache.put(subject, source, _without_bytes(result))
        finally:
            _release(source)
    return CheckRow(source.label, source.commit, source.sha256, result)


def _without_bytes(result: ModResult) -> ModResult:
    """The row as stored: the files' contents before and after the patch, which only the
    decision needed, are dropped (a run over many builds would otherwise keep them all), so a
    fresh row is exactly what the result cache gives back."""
    for f in result.files:
        f.before = f.after = None
    return result


def _release(source: VllmSource) -> None:
    """source.release() for sources that hold state (VllmSource); duck-typed ones may not."""
    release = getattr(source, "release", None)
    if release is not None:
        release()


# Sources in flight at once (check, matrix, community judge), each holding its wheel's central
# directory and fetched bytes until released; of those, at most cpuslots.CHECK_SLOTS run their
# checks at a time (check_source), the others fetch (the community judge takes no slot).
# More sources cost memory and no longer time (ci/bench/results/host-constants-any-cpu.md).
SOURCE_JOBS = 6


# Sources whose central directories are fetched ahead at once (warming).
WARM_JOBS = 4


@contextlib.contextmanager
def warming(sources: Sequence) -> Iterator[None]:
    """While the block checks the sources, fetch their central directories ahead, in order
    (RemoteWheel.warm; other sources have nothing to warm): a source's own fetches then take
    one round trip instead of two, and the sources in flight keep the checks busy. What has
    not started when the block ends is dropped. A failure is left for the check's own read of
    that source to report."""
    warms = [warm for warm in (getattr(s, "warm", None) for s in sources) if warm is not None]
    if not warms:
        yield
        return
    with ThreadPoolExecutor(max_workers=WARM_JOBS, thread_name_prefix="sparkmods-warm") as pool:
        futures = [pool.submit(_quietly, warm) for warm in warms]
        try:
            yield
        finally:
            for future in futures:
                future.cancel()


def _quietly(action: Callable[[], None]) -> None:
    try:
        action()
    except Exception:  # noqa: BLE001 - a failure is left for the check's own read of the source (warming)
        pass


def check_mods(mod_dirs: Iterable[Path], sources: Sequence, jobs: int = SOURCE_JOBS) -> List[CheckRow]:
    """Every mod on every source; sources are checked in parallel, results keep input order."""
    with warming(sources):
        mods = [(d, load(d)) for d in mod_dirs]
        hashes = {m.name: mod_fingerprint(d) for d, m in mods}
        # Every worker's result-cache key needs these; made here once, not by each thread at once.
        code_fingerprint()
        checker_fingerprint()
        with gcpause.paused(), ThreadPoolExecutor(max_workers=max(1, min(jobs, len(sources)))) as pool:
            per_source = list(pool.map(lambda s: check_source(mods, s, hashes), sources))
    return [row for rows in per_source for row in rows]
