"""Does this mod apply to this vLLM? The one decision, shared by host and container.

`sparkmods check` calls `check_mod` with a remote or local vLLM tree; run.sh calls it with the
installed site-packages. Same code, same answer: a green matrix cell means run.sh applies.

A published release picks its variant by version (the variant ranges). Any other build (a dev
or nightly build, a local version, a fork such as `0.1.dev19043+g1a2b3c4` whose clone has no
release tags) is judged by its files instead: the upstream detect rule first, then the variant
whose patches apply best (`_by_content` states the rule). $SPARKMODS_VLLM_BASE names the
release a build is based on and picks by that version; if that variant does not apply, the
decision is an error (BaseMismatch), never a silent apply of something else.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Union

from .engine import (
    APPLIED,
    CONFLICT,
    EXACT,
    MISSING_FILE,
    OK,
    OK_OFFSET,
    FileResult,
    HunkResult,
    UnsafePath,
    confine,
    plan,
)
from .fsops import StrPath
from .manifest import Install, Manifest, ManifestError, Upstream, Variant
from .pep440 import InvalidVersion, Version
from .udiff import FilePatch, PatchParseError, parse_patch

Reader = Callable[[str], Optional[bytes]]

__all__ = ["UPSTREAM", "NO_VARIANT", "DRIFT", "GREEN", "STATUSES", "BASE_ENV", "BaseMismatch", "ModResult", "ModInputs",
           "aggregate", "check_mod", "by_version", "mod_inputs", "settle", "decide", "variant_patches", "mod_file",
           "install_sources", "install_results"]

UPSTREAM, NO_VARIANT = "upstream", "no-variant"
# Set only on the host (sparkmods check): the patch applies, but the patched code would not
# work on that release. Reading other vLLM modules for it needs more than this stdlib runtime.
DRIFT = "drift"
STATUSES = (OK, OK_OFFSET, APPLIED, UPSTREAM, NO_VARIANT, CONFLICT, MISSING_FILE, DRIFT)
GREEN = frozenset({OK, OK_OFFSET, APPLIED, UPSTREAM})
# The release a build is based on, for builds whose version does not say (launch-cluster.sh
# passes run.sh no arguments, but its `-e NAME=VALUE` reaches the container's environment).
BASE_ENV = "SPARKMODS_VLLM_BASE"
# How a variant was chosen (ModInputs.by).
BY_VERSION, BY_CONTENT, BY_BASE = "version", "content", "base"


class BaseMismatch(ValueError):
    """$SPARKMODS_VLLM_BASE names a release whose variant does not apply to this vLLM."""


@dataclass
class ModResult:
    """The decision for one mod on one vLLM, with every file's result."""

    mod: str
    version: str
    status: str
    variant: Optional[str] = None
    reason: str = ""
    files: List[FileResult] = field(default_factory=list)
    how: str = ""  # why this variant, when the version alone did not pick it (one line)

    @property
    def green(self) -> bool:
        return self.status in GREEN

    def changes(self) -> Dict[str, Optional[bytes]]:
        """path -> new bytes (None: delete) for every file the mod would change."""
        return {f.path: f.after for f in self.files if f.changes}

    def to_dict(self) -> dict:
        out: dict = {"mod": self.mod, "vllm": self.version, "status": self.status, "variant": self.variant}
        if self.reason:
            out["reason"] = self.reason
        if self.how:
            out["chosen_by"] = self.how
        out["files"] = [f.to_dict() for f in self.files]
        return out


def mod_file(mod_dir: StrPath, rel: str, what: str) -> bytes:
    """The bytes of a regular file inside the mod; anything else is a one-line ManifestError.

    Checked with stat before opening: a FIFO is never opened (reading one blocks forever), and
    a symlink may not lead out of the mod folder.
    """
    path = os.path.join(mod_dir, rel)
    base = os.path.realpath(mod_dir)
    try:
        real = os.path.realpath(path)  # a symlink loop stays a loop: os.stat below says so
        if real != base and not real.startswith(base.rstrip("/") + "/"):
            raise ManifestError(f"{path}: {what} leads outside the mod folder (to {real}); refusing to read it")
        if not stat.S_ISREG(os.stat(real).st_mode):
            raise ManifestError(f"{path}: {what} is not a regular file")
        with open(real, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None


def variant_patches(mod_dir: StrPath, variant: Variant) -> List[FilePatch]:
    """Parse every patch file of a variant; a bad patch is a ManifestError naming the file.

    Patches must be UTF-8 text inside the mod, and may change only files inside vllm/.
    """
    patches: List[FilePatch] = []
    seen: Dict[str, str] = {}
    for rel in variant.patches:
        path = os.path.join(mod_dir, rel)
        try:
            text = mod_file(mod_dir, rel, f"patch of variant {variant.label!r}").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ManifestError(f"{path}: not UTF-8 text (byte {exc.start}): a binary file is not a patch") from None
        try:
            parsed = parse_patch(text)
            for fp in parsed:
                confine(fp.path)
        except (PatchParseError, UnsafePath) as exc:
            raise ManifestError(f"{path}: {exc}") from None
        for fp in parsed:
            if fp.path in seen:
                raise ManifestError(f"{path}: {fp.path} is also patched by {seen[fp.path]}: merge them into one patch")
            seen[fp.path] = rel
        patches.extend(parsed)
    return patches


def install_sources(mod_dir: StrPath, variant: Variant) -> List[bytes]:
    """The bytes of every install source of a variant, in order; a bad one is a ManifestError."""
    return [mod_file(mod_dir, item.src, f"install source of variant {variant.label!r}") for item in variant.install]


def install_results(mod_dir: StrPath, variant: Variant, read: Reader) -> List[FileResult]:
    """Check every install source; plan the `site:` installs like new-file patches."""
    return _site_installs(variant, install_sources(mod_dir, variant), read)


def _site_installs(variant: Variant, sources: List[bytes], read: Reader) -> List[FileResult]:
    return [_site_install(item, data, read(item.name)) for item, data in zip(variant.install, sources) if item.site]


def _site_install(item: Install, data: bytes, current: Optional[bytes]) -> FileResult:
    if current is None:
        return FileResult(item.name, OK, [HunkResult(1, EXACT, 0, 1)], before=None, after=data)
    if current == data:
        return FileResult(item.name, APPLIED, [HunkResult(1, APPLIED, 0, 1)], before=current)
    return FileResult(item.name, CONFLICT, [HunkResult(1, CONFLICT, 0, reason="file already exists with other content")],
                      reason=f"installing {item.src}: the file already exists with other content", before=current)


def aggregate(files: List[FileResult]) -> "tuple[str, str]":
    statuses = [f.status for f in files]
    if not files:
        return OK, ""
    for status in (CONFLICT, MISSING_FILE):
        if status in statuses:
            bad = [f"{f.path}: {f.reason}" if f.reason else f.path for f in files if f.status == status]
            return status, "; ".join(bad)
    if all(s == APPLIED for s in statuses):
        return APPLIED, ""
    if APPLIED in statuses:
        done = [f.path for f in files if f.status == APPLIED]
        return CONFLICT, "partly applied: " + ", ".join(done) + " already patched, the rest not"
    return (OK_OFFSET if OK_OFFSET in statuses else OK), ""


def _check_upstream(manifest: Manifest, upstream: Upstream, version: str, read: Reader) -> ModResult:
    missing = []
    for det in upstream.detect:
        data = read(det.file)
        if data is None or det.contains.encode("utf-8") not in data:
            missing.append(f"{det.file} lacks {det.contains!r}")
    if missing:
        return ModResult(manifest.name, version, NO_VARIANT, None,
                         f"vLLM {version} is past upstream.since {upstream.since} but the upstream fix is not "
                         f"detected ({'; '.join(missing)})")
    return ModResult(manifest.name, version, UPSTREAM, None, f"vLLM includes it since {upstream.since}: {upstream.evidence}")


@dataclass
class ModInputs:
    """What deciding needs from the mod folder for one vLLM version, read and checked once: the
    variant the version selects (`chosen`) with its patches parsed and its install sources
    read, or the upstream section, or (chosen None) the reason no variant applies. run.sh
    decides before it takes the tree's lock, under it, and after its change: on one read of
    the mod (parsing the patches was the larger part of each decision).

    `by` says what picks the variant: the version, $SPARKMODS_VLLM_BASE (`base`), or the
    content; for content, `options` holds these inputs for every variant and `settle` picks."""

    manifest: Manifest
    version: str
    chosen: Union[Variant, Upstream, None]
    patches: List[FilePatch] = field(default_factory=list)
    sources: List[bytes] = field(default_factory=list)
    reason: str = ""
    by: str = BY_VERSION
    base: str = ""
    options: List[ModInputs] = field(default_factory=list)

    @property
    def variant(self) -> Variant:
        """The chosen variant; a ValueError when these inputs chose none, or the upstream section."""
        if self.chosen is None or isinstance(self.chosen, Upstream):
            raise ValueError(f"{self.manifest.name}: no variant chosen for vLLM {self.version}")
        return self.chosen

    def paths(self) -> List[str]:
        """The vLLM files deciding reads (each patch target, site install and upstream check)."""
        if self.by == BY_CONTENT:
            seen: Dict[str, None] = {}
            upstream = self.manifest.upstream
            for rel in ([d.file for d in upstream.detect] if upstream is not None else []):
                seen[rel] = None
            for option in self.options:
                seen.update((rel, None) for rel in option.paths())
            return list(seen)
        if isinstance(self.chosen, Upstream):
            return [d.file for d in self.chosen.detect]
        if self.chosen is None:
            return []
        return [fp.path for fp in self.patches] + [item.name for item in self.chosen.install if item.site]


def by_version(version: str) -> bool:
    """Whether the version alone picks the variant: a published release or pre-release. A dev
    build, a local version (`+g...`: built from source) or no PEP 440 version at all says
    nothing reliable about the files, so those are judged by content."""
    try:
        return not Version(version).is_devbuild
    except InvalidVersion:
        return False


def mod_inputs(manifest: Manifest, mod_dir: StrPath, version: str, base: Optional[str] = None) -> ModInputs:
    """Read and check what the mod gives for this vLLM (base: $SPARKMODS_VLLM_BASE, the release
    the build is based on); bad mod input is a ManifestError, a base that is no release a
    BaseMismatch."""
    if base:
        try:
            parsed = Version(base)
        except InvalidVersion:
            parsed = None
        if parsed is None or parsed.is_devbuild:
            raise BaseMismatch(f"{BASE_ENV}={base}: not a vLLM release (write one such as 0.30.0); "
                               f"vLLM reports {version}")
        inputs = _selected(manifest, mod_dir, version, base)
        inputs.by, inputs.base = BY_BASE, base
        if inputs.chosen is None:
            raise BaseMismatch(f"{BASE_ENV}={base}: {inputs.reason}; vLLM reports {version}")
        return inputs
    if by_version(version):
        return _selected(manifest, mod_dir, version, version)
    options = [_variant_inputs(manifest, mod_dir, version, variant) for variant in manifest.variants]
    return ModInputs(manifest, version, None, by=BY_CONTENT, options=options)


def _selected(manifest: Manifest, mod_dir: StrPath, version: str, key: str) -> ModInputs:
    """The inputs of the variant (or upstream section) that the version `key` selects."""
    try:
        chosen = manifest.select(key)
    except InvalidVersion:
        return ModInputs(manifest, version, None, reason=f"vLLM version {key!r} is not PEP 440")
    if chosen is None:
        return ModInputs(manifest, version, None, reason=f"no variant covers vLLM {Version(key).public}; "
                                                         f"variants: {manifest.describe_variants()}")
    if isinstance(chosen, Upstream):
        return ModInputs(manifest, version, chosen)
    return _variant_inputs(manifest, mod_dir, version, chosen)


def _variant_inputs(manifest: Manifest, mod_dir: StrPath, version: str, chosen: Variant) -> ModInputs:
    patches = variant_patches(mod_dir, chosen)
    sources = install_sources(mod_dir, chosen)
    twice = {fp.path for fp in patches} & {item.name for item in chosen.install if item.site}
    if twice:
        raise ManifestError(f"{manifest.source}: variant {chosen.label!r} both patches and installs {sorted(twice)[0]}")
    return ModInputs(manifest, version, chosen, patches, sources)


def _decide_one(inputs: ModInputs, read: Reader) -> ModResult:
    """The status of the one variant (or upstream section) the inputs hold."""
    manifest, version, chosen = inputs.manifest, inputs.version, inputs.chosen
    if chosen is None:
        return ModResult(manifest.name, version, NO_VARIANT, None, inputs.reason)
    if isinstance(chosen, Upstream):
        return _check_upstream(manifest, chosen, version, read)
    files = plan(inputs.patches, read) + _site_installs(chosen, inputs.sources, read)
    status, reason = aggregate(files)
    return ModResult(manifest.name, version, status, chosen.label, reason, files)


# Content ranks, best first: the mod already on, then a variant that applies (with what the
# message says of it, and the verb for the others that tie).
_RANKS = {APPLIED: (0, "are already applied", "are"), OK: (1, "apply exactly", "do"),
          OK_OFFSET: (1, "apply at an offset", "do")}


def settle(inputs: ModInputs, read: Reader) -> "tuple[ModInputs, ModResult]":
    """The decision on one vLLM tree (read: package path -> bytes or None), and the inputs of
    the variant it chose (what apply and revert work from)."""
    if inputs.by == BY_CONTENT:
        return _by_content(inputs, read)
    result = _decide_one(inputs, read)
    if inputs.by == BY_BASE:
        what = f"variant {result.variant}" if result.variant else "the upstream check"
        if not result.green:
            detail = f" ({result.reason})" if result.reason else ""
            raise BaseMismatch(f"{BASE_ENV}={inputs.base} selects {what}, which does not apply to this vLLM "
                               f"(it reports {inputs.version}): {result.status}{detail}; unset {BASE_ENV} or name "
                               "the release this build is based on")
        words = f"the {result.variant} patches {_RANKS[result.status][1]}" if result.variant else \
            "every upstream detect matches"
        result.how = f"by {BASE_ENV}={inputs.base}: {words}; vLLM reports {inputs.version}"
    return inputs, result


def _by_content(inputs: ModInputs, read: Reader) -> "tuple[ModInputs, ModResult]":
    """The variant chosen by the files. The upstream section wins when every detect matches
    (vLLM carries the change); else, of the variants whose patches are already applied, or
    else of those that apply, the one whose hunks sit fewest lines from where its patches say
    (variants of neighbouring releases often differ only there); of equals, the one whose
    range holds the reported version, else the newest. With none that applies: what the
    version selects (its conflict says why), else no-variant."""
    manifest, version = inputs.manifest, inputs.version
    reports = f"vLLM reports {version}"
    upstream = manifest.upstream
    carried = _check_upstream(manifest, upstream, version, read) if upstream is not None else None
    if upstream is not None and carried is not None and carried.status == UPSTREAM:
        carried.how = f"by content: every upstream detect matches (vLLM carries it since {upstream.since}); {reports}"
        return ModInputs(manifest, version, upstream), carried
    decided = [(option, _decide_one(option, read)) for option in inputs.options]
    fits = [(_RANKS[r.status][0], option, r) for option, r in decided if r.status in _RANKS]
    if not fits:
        return _none_fits(inputs, decided, carried)
    best = min((rank, _moved(option, r)) for rank, option, r in fits)
    tied = [(option, r) for rank, option, r in fits if (rank, _moved(option, r)) == best]
    holds = [(option, r) for option, r in tied if _holds(option.variant, version)]
    option, result = (holds or tied)[-1]
    _, verb, also = _RANKS[result.status]
    if option.paths():
        words = f"by content: the {result.variant} patches {verb}"
    else:
        words = f"by content: variant {result.variant} changes no vLLM file"
    others = [f"{r.variant}'s" for _, r in tied if r is not result]
    if others:
        why = f"its range holds {Version(version).public}" if holds else "the newest variant wins"
        words += f" (as {also} {', '.join(others)}; {why})"
    further = [f"{r.variant}'s" for rank, option, r in fits if rank == best[0] and all(r is not t for _, t in tied)]
    if further:
        words += f" (so {also} {', '.join(further)}, further from the lines they state; the nearest wins)"
    result.how = f"{words}; {reports}"
    return option, result


def _moved(option: ModInputs, result: ModResult) -> int:
    """How many lines, in all, the hunks were found from where the patches say (an applied
    hunk: from its new side's line)."""
    stated = {fp.path: fp.hunks for fp in option.patches}
    total = 0
    for f in result.files:
        hunks = stated.get(f.path, [])
        for h in f.hunks if hunks else ():
            if h.line is not None:
                hunk = hunks[h.index - 1]
                total += abs(h.line - (hunk.new_start if h.outcome == APPLIED else hunk.old_start))
    return total


def _holds(variant: Variant, version: str) -> bool:
    try:
        return variant.vllm.contains(Version(version))
    except InvalidVersion:
        return False


def _none_fits(inputs: ModInputs, decided: "List[tuple[ModInputs, ModResult]]", carried: Optional[ModResult]
               ) -> "tuple[ModInputs, ModResult]":
    """No variant applies by content: the decision for what the version selects (a conflict
    there names the lines that differ), else no-variant."""
    manifest, version = inputs.manifest, inputs.version
    tried = ", ".join(f"{r.variant} {r.status}" for _, r in decided)
    how = f"by content: no variant applies ({tried}); if you know the release this build is based on, set {BASE_ENV}"
    try:
        selected = manifest.select(version)
    except InvalidVersion:
        selected = None
    for option, result in decided:
        if option.chosen is selected:
            result.how = f"{how}; shown: variant {result.variant}, which {version} selects by version"
            return option, result
    if isinstance(selected, Upstream) and carried is not None:
        carried.how = f"{how}; shown: the upstream check, which {version} selects by version"
        return ModInputs(manifest, version, selected), carried
    result = ModResult(manifest.name, version, NO_VARIANT, None, f"no variant applies to these files ({tried}); "
                       f"vLLM reports {version}", how=how)
    return ModInputs(manifest, version, None, reason=result.reason), result


def decide(inputs: ModInputs, read: Reader) -> ModResult:
    """The status of the mod on one vLLM tree (read: package path -> bytes or None)."""
    return settle(inputs, read)[1]


def check_mod(manifest: Manifest, mod_dir: StrPath, version: str, read: Reader, base: Optional[str] = None
              ) -> ModResult:
    """Decide the status of one mod on one vLLM tree (read: package path -> bytes or None)."""
    return decide(mod_inputs(manifest, mod_dir, version, base), read)
