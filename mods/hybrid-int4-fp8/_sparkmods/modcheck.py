"""Does this mod apply to this vLLM? The one decision, shared by host and container.

`sparkmods check` calls `check_mod` with a remote or local vLLM tree; run.sh calls it with the
installed site-packages. Same code, same answer: a green matrix cell means run.sh applies.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

from .engine import APPLIED, CONFLICT, EXACT, MISSING_FILE, OK, OK_OFFSET, FileResult, HunkResult, UnsafePath, confine, plan
from .manifest import Install, Manifest, ManifestError, Upstream, Variant
from .pep440 import InvalidVersion, Version
from .udiff import FilePatch, PatchParseError, parse_patch

__all__ = ["UPSTREAM", "NO_VARIANT", "DRIFT", "GREEN", "STATUSES", "ModResult", "aggregate", "check_mod", "variant_patches",
           "mod_file", "install_results"]

UPSTREAM, NO_VARIANT = "upstream", "no-variant"
# Set only on the host (sparkmods check): the patch applies, but the patched code would not
# work on that release. Reading other vLLM modules for it needs more than this stdlib runtime.
DRIFT = "drift"
STATUSES = (OK, OK_OFFSET, APPLIED, UPSTREAM, NO_VARIANT, CONFLICT, MISSING_FILE, DRIFT)
GREEN = frozenset({OK, OK_OFFSET, APPLIED, UPSTREAM})

Reader = Callable[[str], Optional[bytes]]


@dataclass
class ModResult:
    mod: str
    version: str
    status: str
    variant: Optional[str] = None
    reason: str = ""
    files: List[FileResult] = field(default_factory=list)

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


def mod_file(mod_dir: Path, rel: str, what: str) -> bytes:
    """The bytes of a regular file inside the mod; anything else is a one-line ManifestError.

    Checked with stat before opening: a FIFO is never opened (reading one blocks forever), and
    a symlink may not lead out of the mod folder.
    """
    path = mod_dir / rel
    base = mod_dir.resolve()
    try:
        real = path.resolve()
        if real != base and base not in real.parents:
            raise ManifestError(f"{path}: {what} leads outside the mod folder (to {real}); refusing to read it")
        if not stat.S_ISREG(os.stat(real).st_mode):
            raise ManifestError(f"{path}: {what} is not a regular file")
        return real.read_bytes()
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    except RuntimeError as exc:  # a symlink loop
        raise ManifestError(f"{path}: cannot read {what}: {exc}") from None


def variant_patches(mod_dir: Path, variant: Variant) -> List[FilePatch]:
    """Parse every patch file of a variant; a bad patch is a ManifestError naming the file.

    Patches must be UTF-8 text inside the mod, and may change only files inside vllm/.
    """
    patches: List[FilePatch] = []
    seen: Dict[str, str] = {}
    for rel in variant.patches:
        path = mod_dir / rel
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


def install_results(mod_dir: Path, variant: Variant, read: Reader) -> List[FileResult]:
    """Check every install source; plan the `site:` installs like new-file patches."""
    out = []
    for item in variant.install:
        data = mod_file(mod_dir, item.src, f"install source of variant {variant.label!r}")
        if item.site:
            out.append(_site_install(item, data, read(item.name)))
    return out


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


def check_mod(manifest: Manifest, mod_dir: Path, version: str, read: Reader) -> ModResult:
    """Decide the status of one mod on one vLLM tree (read: package path -> bytes or None)."""
    try:
        chosen = manifest.select(version)
    except InvalidVersion:
        return ModResult(manifest.name, version, NO_VARIANT, None, f"vLLM version {version!r} is not PEP 440")
    if isinstance(chosen, Upstream):
        return _check_upstream(manifest, chosen, version, read)
    if chosen is None:
        return ModResult(manifest.name, version, NO_VARIANT, None,
                         f"no variant covers vLLM {Version(version).public}; variants: {manifest.describe_variants()}")
    patches = variant_patches(mod_dir, chosen)
    installs = install_results(mod_dir, chosen, read)
    twice = {fp.path for fp in patches} & {f.path for f in installs}
    if twice:
        raise ManifestError(f"{manifest.source}: variant {chosen.label!r} both patches and installs {sorted(twice)[0]}")
    files = plan(patches, read) + installs
    status, reason = aggregate(files)
    return ModResult(manifest.name, version, status, chosen.label, reason, files)
