"""Apply, check or revert one mod on an installed vLLM; the entry point of every run.sh.

Inside the container this is all that runs: stdlib only, Python >= 3.9. On the host the same
functions back `sparkmods apply MOD --vllm dir:PATH`.

Originals are kept recoverable: before the first byte of vLLM is replaced, the pristine
files are saved under `<site-packages>/.sparkmods/<mod>/` with a state file recording what
was written; `revert` puts them back (or, with no state, applies the reverse patch when the
mod is fully applied).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .engine import APPLIED, CONFLICT, OK, OK_OFFSET, UnsafePath, commit, plan, safe_target
from .locate import LocateError, find_vllm, read_version
from .manifest import Manifest, ManifestError, Variant, load_manifest
from .modcheck import GREEN, UPSTREAM, ModResult, check_mod, variant_patches
from .udiff import reverse

__all__ = ["main", "apply_mod", "revert_mod", "STATE_DIR"]

STATE_DIR = ".sparkmods"
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class Printer:
    """Every line goes out prefixed with `[<mod>]` so cluster logs show who said it."""

    def __init__(self, mod: str, stream=None) -> None:
        self.prefix = f"[{mod}]"
        self.stream = stream or sys.stdout

    def __call__(self, message: str) -> None:
        print(f"{self.prefix} {message}", file=self.stream, flush=True)


def _sha256(data: Optional[bytes]) -> Optional[str]:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _reader(site: Path):
    def read(rel: str) -> Optional[bytes]:
        target = safe_target(site, rel)
        return target.read_bytes() if target.is_file() else None
    return read


def _explain_failure(say: Printer, manifest: Manifest, result: ModResult) -> None:
    say(f"ERROR: cannot apply to vLLM {result.version}: {result.status}"
        + (f" (variant {result.variant})" if result.variant else ""))
    if result.reason:
        say(f"  reason: {result.reason}")
    for f in result.files:
        for h in f.hunks:
            if h.outcome != CONFLICT:
                continue
            say(f"  {f.path}: hunk {h.index} (stated line {h.stated_line}): {h.reason}")
            if h.near is not None:
                say(f"    closest match at line {h.near.line}: {h.near.matching}/{h.near.total} lines equal")
                for line, expected, found in h.near.differing[:5]:
                    say(f"    line {line}: expected {expected.strip()!r}, found {found.strip()!r}")
    say(f"  variants: {manifest.describe_variants()}")
    say("  nothing was changed; pin a vLLM a variant was verified on, or rebase the mod "
        "(sparkmods rebase MOD --onto VERSION)")


def _install_files(say: Printer, mod_dir: Path, variant: Variant, workspace: Path, dry_run: bool) -> None:
    for item in variant.install:
        src = safe_target(mod_dir, item.src)
        data = src.read_bytes()
        dest = workspace / item.name
        if dest.is_file() and dest.read_bytes() == data:
            say(f"{item.name} already installed in {workspace}")
            continue
        if dry_run:
            say(f"would install {item.name} into {workspace}")
            continue
        _atomic_write(dest, data)
        say(f"installed {item.name} into {workspace}")


def _save_state(state_dir: Path, manifest: Manifest, result: ModResult) -> None:
    """Save pristine copies and the record of what we are about to write, atomically."""
    parent = state_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{manifest.name}.", dir=parent))
    try:
        files = {}
        for f in result.files:
            if not f.changes:
                continue
            if f.before is not None:
                orig = staging / "orig" / f.path
                orig.parent.mkdir(parents=True, exist_ok=True)
                orig.write_bytes(f.before)
            files[f.path] = {"before": _sha256(f.before), "after": _sha256(f.after)}
        state = {"mod": manifest.name, "variant": result.variant, "vllm": result.version, "files": files}
        (staging / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
        if state_dir.exists():
            shutil.rmtree(state_dir)
        os.replace(staging, state_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def apply_mod(mod_dir: Path, site: Path, workspace: Path, dry_run: bool = False, say: Optional[Printer] = None) -> int:
    """Apply the variant that fits the vLLM in site; returns the exit code."""
    manifest = load_manifest(mod_dir)
    say = say or Printer(manifest.name)
    version = read_version(site)
    result = check_mod(manifest, mod_dir, version, _reader(site))
    if result.status not in GREEN:
        _explain_failure(say, manifest, result)
        return EXIT_FAIL
    if result.status == UPSTREAM:
        say(f"not needed: {result.reason}")
        return EXIT_OK
    variant = next(v for v in manifest.variants if v.label == result.variant)
    if result.status == APPLIED:
        say(f"already applied (variant {variant.label}) to vLLM {version}")
    elif dry_run:
        for f in result.files:
            say(f"would patch {f.path}: {f.status}")
        say(f"dry run: variant {variant.label} applies cleanly to vLLM {version}; nothing written")
    else:
        _save_state(site / STATE_DIR / manifest.name, manifest, result)
        try:
            commit(result.changes(), site)
        except BaseException:
            shutil.rmtree(site / STATE_DIR / manifest.name, ignore_errors=True)
            raise
        for f in result.files:
            if f.changes:
                moved = [h for h in f.hunks if h.offset]
                extra = f" ({len(moved)} hunk(s) at an offset)" if moved else ""
                say(f"patched {f.path}{extra}")
        say(f"applied variant {variant.label} to vLLM {version} in {site}")
    _install_files(say, mod_dir, variant, workspace, dry_run)
    if variant.notes:
        say(variant.notes)
    return EXIT_OK


def revert_mod(mod_dir: Path, site: Path, dry_run: bool = False, say: Optional[Printer] = None) -> int:
    """Restore the pristine files of a mod applied to site."""
    manifest = load_manifest(mod_dir)
    say = say or Printer(manifest.name)
    state_dir = site / STATE_DIR / manifest.name
    state_file = state_dir / "state.json"
    read = _reader(site)
    if state_file.is_file():
        state = json.loads(state_file.read_text(encoding="utf-8"))
        changes: Dict[str, Optional[bytes]] = {}
        for rel, sums in sorted(state["files"].items()):
            current = read(rel)
            if _sha256(current) != sums["after"]:
                say(f"ERROR: {rel} changed since the mod was applied; not reverting anything "
                    f"(originals are kept in {state_dir / 'orig'})")
                return EXIT_FAIL
            orig = safe_target(state_dir / "orig", rel)
            changes[rel] = orig.read_bytes() if sums["before"] is not None else None
    else:
        version = read_version(site)
        chosen = manifest.select(version)
        if not isinstance(chosen, Variant):
            say(f"nothing to revert: no variant of this mod for vLLM {version}")
            return EXIT_OK
        forward = check_mod(manifest, mod_dir, version, read)
        if forward.status != APPLIED:
            say(f"nothing to revert: the mod is not applied to vLLM {version} ({forward.status})")
            return EXIT_OK if forward.status in (OK, OK_OFFSET) else EXIT_FAIL
        files = plan([reverse(fp) for fp in variant_patches(mod_dir, chosen)], read)
        if any(f.status not in (OK, OK_OFFSET) for f in files):
            say("ERROR: no saved originals and the reverse patch does not apply cleanly; reinstall vLLM")
            return EXIT_FAIL
        changes = {f.path: f.after for f in files}
    if dry_run:
        for rel in changes:
            say(f"would restore {rel}")
        return EXIT_OK
    commit(changes, site)
    shutil.rmtree(state_dir, ignore_errors=True)
    for rel in changes:
        say(f"restored {rel}")
    say("reverted")
    return EXIT_OK


def main(argv: Optional[Sequence[str]] = None, mod_dir: Optional[Path] = None) -> int:
    parser = argparse.ArgumentParser(prog="run.sh", description="Apply this mod to the installed vLLM.")
    parser.add_argument("action", nargs="?", default="apply", choices=["apply", "check", "revert"])
    parser.add_argument("--dry-run", action="store_true", help="say what would change, write nothing")
    parser.add_argument("--site", help="site-packages holding vllm/ (default: $PYTHON_ROOT, then python3's path)")
    parser.add_argument("--workspace", help="where installed files go (default: $WORKSPACE_DIR, then the cwd)")
    args = parser.parse_args(argv)
    mod_dir = mod_dir or Path(__file__).resolve().parent.parent
    name = mod_dir.name
    say = Printer(name)
    try:
        site = Path(args.site).resolve() if args.site else find_vllm().site
        if args.action == "revert":
            return revert_mod(mod_dir, site, args.dry_run, say)
        workspace = Path(args.workspace or os.environ.get("WORKSPACE_DIR") or os.getcwd())
        return apply_mod(mod_dir, site, workspace, args.dry_run or args.action == "check", say)
    except (LocateError, ManifestError, UnsafePath) as exc:
        say(f"ERROR: {exc}")
        return EXIT_USAGE
    except OSError as exc:
        say(f"ERROR: {exc.filename or ''}: {exc.strerror or exc}; nothing was changed")
        return EXIT_FAIL
