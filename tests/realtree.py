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
import os
import shutil
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

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


def release_site(root: Path, mods: Iterable[Path], version: str) -> Path:
    """The files these mods touch (and vllm/__init__.py) from the real vLLM wheel of `version`."""
    from sparkmods.check import paths_needed
    from sparkmods.sources import open_targets

    (source,) = open_targets(f"pypi:{version}")
    wanted = {"vllm/__init__.py"}
    for mod_dir in mods:
        wanted |= paths_needed(load_manifest(mod_dir), mod_dir, version)
    source.prefetch(sorted(wanted))
    found = {rel: source.read(rel) for rel in sorted(wanted)}
    return write_site(root, version, {rel: data for rel, data in found.items() if data is not None})


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

    Allowed in `.sparkmods/`: the lock file and, per applied mod, state.json and orig/ copies.
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
                    if p.name not in ("state.json", "orig")]
    return out


def copy_tree(src: Path, dest: Path) -> Path:
    """A fresh copy of a prepared tree (symlinks kept as symlinks)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, symlinks=True)
    return dest
