"""vLLM site-packages trees that the repository's real mods apply to, for crash and kill tests.

Two kinds, one layout (`vllm/...` plus `vllm-<version>.dist-info/METADATA`):
  synthesized_site  every file a mod's variant patches, rebuilt from the patch's own old side
                    (context and removed lines at the stated line numbers, unique filler
                    lines elsewhere): no network, milliseconds, and the real patches apply
                    with every hunk exact;
  release_site      the same files read out of a real vLLM wheel on PyPI (cached after the
                    first run) for the `network` tier and ci/bench/bench_kill.py.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from sparkmods.runtime import applier
from sparkmods.runtime.fsops import TMP_SUFFIX
from sparkmods.runtime.journal import STATE_DIR
from sparkmods.runtime.manifest import Manifest, Variant, load_manifest
from sparkmods.runtime.modcheck import variant_patches
from sparkmods.runtime.udiff import FilePatch

REPO_MODS = Path(__file__).resolve().parents[1] / "mods"


def repo_mods() -> List[Path]:
    """Every mod of the repository (the ones a user installs)."""
    return sorted(p.parent for p in REPO_MODS.glob("*/mod.toml"))


def newest_verified(manifest: Manifest) -> str:
    """The newest release the mod's newest variant was verified on."""
    return manifest.variants[-1].verified[-1]


def _chosen(mod_dir: Path, version: str) -> Variant:
    chosen = load_manifest(mod_dir).select(version)
    assert isinstance(chosen, Variant), f"{mod_dir.name}: no variant for {version}"
    return chosen


def _old_side(fp: FilePatch) -> bytes:
    length = max(h.old_start - 1 + len(h.old_lines) for h in fp.hunks) + 3
    lines = [f"# filler line {n} of {fp.path}" for n in range(length)]
    for h in fp.hunks:
        lines[h.old_start - 1:h.old_start - 1 + len(h.old_lines)] = h.old_lines
        if not h.old_eof_newline:
            del lines[h.old_start - 1 + len(h.old_lines):]
            return "\n".join(lines).encode()
    return ("\n".join(lines) + "\n").encode()


def write_site(root: Path, version: str, files: Dict[str, bytes]) -> Path:
    """A site-packages folder holding these vllm files and the dist-info of `version`."""
    tree = {"vllm/__init__.py": b""}
    tree.update(files)
    for rel, data in tree.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    dist = root / f"vllm-{version}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n\n")
    return root


def synthesized_site(root: Path, mods: Iterable[Path], version: Optional[str] = None) -> Path:
    """A tree every given mod applies to; version defaults to each mod's newest verified one."""
    files: Dict[str, bytes] = {}
    versions = set()
    for mod_dir in mods:
        v = version or newest_verified(load_manifest(mod_dir))
        versions.add(v)
        for fp in variant_patches(mod_dir, _chosen(mod_dir, v)):
            if not fp.is_new:
                files[fp.path] = _old_side(fp)
    assert len(versions) == 1, f"these mods need different vLLM versions: {sorted(versions)}"
    return write_site(root, versions.pop(), files)


def release_site(root: Path, mods: Iterable[Path], version: str, label: Optional[str] = None) -> Path:
    """The files these mods touch (and vllm/__init__.py) from the real vLLM wheel of `version`;
    label: the version its metadata claims instead (a fork's `0.1.dev19043+g1a2b3c4`), which
    makes the mods choose by content, so every file any variant or upstream check reads is kept."""
    from sparkmods.checking.batch import paths_needed
    from sparkmods.sources import open_targets

    (source,) = open_targets(f"pypi:{version}")
    wanted = {"vllm/__init__.py"}
    for mod_dir in mods:
        wanted |= paths_needed(load_manifest(mod_dir), mod_dir, label or version)
    source.prefetch(sorted(wanted))
    found = {rel: source.read(rel) for rel in sorted(wanted)}
    return write_site(root, label or version, {rel: data for rel, data in found.items() if data is not None})


def snapshot(site: Path) -> Dict[str, str]:
    """sha256 of every file in the tree outside the state folder (symlinks as their target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(site):
        dirnames[:] = [d for d in dirnames if d != STATE_DIR or Path(dirpath) != site]
        for name in filenames:
            path = Path(dirpath) / name
            out[path.relative_to(site).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def strays(site: Path, mods: Sequence[str]) -> List[str]:
    """Files no finished run may leave: our temps anywhere, a journal, debris in the state folder.

    Allowed in `.sparkmods/`: the lock file and, per applied mod, state.json, orig/ copies and
    run.sh's stamp (runtime/stamp.py).
    """
    out = [p.relative_to(site).as_posix() for p in site.rglob(f"*{TMP_SUFFIX}")]
    state = site / STATE_DIR
    if state.is_dir():
        for entry in sorted(state.iterdir()):
            if entry.name == ".lock":
                continue
            if entry.name not in mods or not (entry / "state.json").is_file():
                out.append(entry.relative_to(site).as_posix())
                continue
            out += [p.relative_to(site).as_posix() for p in sorted(entry.iterdir())
                    if p.name not in ("state.json", "orig", "stamp")]
    return out


def copy_tree(src: Path, dest: Path) -> Path:
    """A fresh copy of a prepared tree (symlinks kept as symlinks)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, symlinks=True)
    return dest


GOAL = {"apply": "applied", "revert": "pristine"}
START = {"apply": "pristine", "revert": "applied"}
OPPOSITE = {"apply": "revert", "revert": "apply"}


def run_quietly(action: str, mod: Path, site: Path, workspace: Path) -> Tuple[int, str]:
    """run.sh's entry point in this process; (exit code, what it printed)."""
    out = io.StringIO()
    rc = applier.run(action, mod, site, workspace, False, applier.Printer(mod.name, out))
    return rc, out.getvalue()


class Trees:
    """Per mod: a pristine and an applied tree (and workspace) to copy, with their snapshots."""

    def __init__(self, base: Path, mod: Path, site_factory: Callable[[Path, List[Path]], Path]) -> None:
        self.mod = mod
        self.base = base
        self.pristine = site_factory(base / "pristine", [mod])
        self.applied = copy_tree(self.pristine, base / "applied")
        (base / "ws-pristine").mkdir()
        copy_tree(base / "ws-pristine", base / "ws-applied")
        rc, out = run_quietly("apply", mod, self.applied, base / "ws-applied")
        assert rc == 0, out
        self.snap = {"pristine": snapshot(self.pristine), "applied": snapshot(self.applied)}

    def fresh(self, start: str) -> Tuple[Path, Path]:
        """Copies of the start tree and workspace at base/work and base/ws."""
        site = copy_tree(self.pristine if start == "pristine" else self.applied, self.base / "work")
        return site, copy_tree(self.base / f"ws-{start}", self.base / "ws")

    def at(self, site: Path, state: str) -> bool:
        """Is the tree byte-identical to `state` ("pristine" or "applied")?"""
        return snapshot(site) == self.snap[state]

    def state_of(self, site: Path) -> Optional[str]:
        """"pristine" or "applied" when the tree is byte-identical to one of them, else None."""
        return next((name for name in self.snap if self.at(site, name)), None)

    def leftovers(self, site: Path, workspace: Path) -> List[str]:
        """strays() for the tree's state, plus our temps in the workspace."""
        found = strays(site, [self.mod.name] if self.state_of(site) == "applied" else [])
        return found + [p.name for p in workspace.glob(f".*{TMP_SUFFIX}")]

    def assert_at(self, site: Path, workspace: Path, state: str) -> None:
        assert self.at(site, state), f"tree is not {state}"
        assert self.leftovers(site, workspace) == []
