"""Does this mod apply to this vLLM? The one decision, shared by host and container.

`sparkmods check` calls `check_mod` with a remote or local vLLM tree; run.sh calls it with the
installed site-packages. Same code, same answer: a green matrix cell means run.sh applies.
"""

from __future__ import annotations

import os
import stat

from .basics import Record
from .engine import APPLIED, CONFLICT, EXACT, MISSING_FILE, OK, OK_OFFSET, FileResult, HunkResult, UnsafePath, confine, plan
from .manifest import ManifestError, Upstream
from .pep440 import InvalidVersion, Version
from .udiff import PatchParseError, parse_patch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Union

    from .fsops import StrPath
    from .manifest import Install, Manifest, Variant
    from .udiff import FilePatch

    Reader = Callable[[str], Optional[bytes]]

__all__ = ["UPSTREAM", "NO_VARIANT", "DRIFT", "GREEN", "STATUSES", "ModResult", "ModInputs", "aggregate", "check_mod",
           "mod_inputs", "decide", "variant_patches", "mod_file", "install_sources", "install_results"]

UPSTREAM, NO_VARIANT = "upstream", "no-variant"
# Set only on the host (sparkmods check): the patch applies, but the patched code would not
# work on that release. Reading other vLLM modules for it needs more than this stdlib runtime.
DRIFT = "drift"
STATUSES = (OK, OK_OFFSET, APPLIED, UPSTREAM, NO_VARIANT, CONFLICT, MISSING_FILE, DRIFT)
GREEN = frozenset({OK, OK_OFFSET, APPLIED, UPSTREAM})


class ModResult(Record):
    """The decision for one mod on one vLLM, with every file's result."""

    __slots__ = ("mod", "version", "status", "variant", "reason", "files")

    def __init__(self, mod: str, version: str, status: str, variant: Optional[str] = None, reason: str = "",
                 files: Optional[List[FileResult]] = None) -> None:
        self.mod, self.version, self.status, self.variant, self.reason = mod, version, status, variant, reason
        self.files = [] if files is None else files

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


class ModInputs(Record):
    """What deciding needs from the mod folder for one vLLM version, read and checked once: the
    variant the version selects (`chosen`) with its patches parsed and its install sources
    read, or the upstream section, or (chosen None) the reason no variant applies. run.sh
    decides before it takes the tree's lock, under it, and after its change: on one read of
    the mod (parsing the patches was the larger part of each decision)."""

    __slots__ = ("manifest", "version", "chosen", "patches", "sources", "reason")

    def __init__(self, manifest: Manifest, version: str, chosen: Union[Variant, Upstream, None],
                 patches: Optional[List[FilePatch]] = None, sources: Optional[List[bytes]] = None,
                 reason: str = "") -> None:
        self.manifest, self.version, self.chosen = manifest, version, chosen
        self.patches = [] if patches is None else patches
        self.sources = [] if sources is None else sources
        self.reason = reason

    def paths(self) -> List[str]:
        """The vLLM files deciding reads (each patch target, site install and upstream check)."""
        if isinstance(self.chosen, Upstream):
            return [d.file for d in self.chosen.detect]
        if self.chosen is None:
            return []
        return [fp.path for fp in self.patches] + [item.name for item in self.chosen.install if item.site]


def mod_inputs(manifest: Manifest, mod_dir: StrPath, version: str) -> ModInputs:
    """Read and check what the mod gives for this vLLM version; bad mod input is a ManifestError."""
    try:
        chosen = manifest.select(version)
    except InvalidVersion:
        return ModInputs(manifest, version, None, reason=f"vLLM version {version!r} is not PEP 440")
    if chosen is None:
        return ModInputs(manifest, version, None, reason=f"no variant covers vLLM {Version(version).public}; "
                                                         f"variants: {manifest.describe_variants()}")
    if isinstance(chosen, Upstream):
        return ModInputs(manifest, version, chosen)
    patches = variant_patches(mod_dir, chosen)
    sources = install_sources(mod_dir, chosen)
    twice = {fp.path for fp in patches} & {item.name for item in chosen.install if item.site}
    if twice:
        raise ManifestError(f"{manifest.source}: variant {chosen.label!r} both patches and installs {sorted(twice)[0]}")
    return ModInputs(manifest, version, chosen, patches, sources)


def decide(inputs: ModInputs, read: Reader) -> ModResult:
    """The status of the mod on one vLLM tree (read: package path -> bytes or None)."""
    manifest, version, chosen = inputs.manifest, inputs.version, inputs.chosen
    if chosen is None:
        return ModResult(manifest.name, version, NO_VARIANT, None, inputs.reason)
    if isinstance(chosen, Upstream):
        return _check_upstream(manifest, chosen, version, read)
    files = plan(inputs.patches, read) + _site_installs(chosen, inputs.sources, read)
    status, reason = aggregate(files)
    return ModResult(manifest.name, version, status, chosen.label, reason, files)


def check_mod(manifest: Manifest, mod_dir: StrPath, version: str, read: Reader) -> ModResult:
    """Decide the status of one mod on one vLLM tree (read: package path -> bytes or None)."""
    return decide(mod_inputs(manifest, mod_dir, version), read)
