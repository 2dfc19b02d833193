"""Where the mods live on the host, and how a name on the command line becomes a mod folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Sequence

from sparkmods.errors import SparkmodsError
from sparkmods.runtime.manifest import MANIFEST_TOML, Manifest, ManifestError, load_manifest

ENV_MODS_DIR = "SPARKMODS_MODS_DIR"
_REPO_MODS = Path(__file__).resolve().parents[2] / "mods"


def mods_root(explicit: Optional[str] = None) -> Path:
    """--mods-dir, then $SPARKMODS_MODS_DIR, then ./mods, then the repository's mods/."""
    for candidate in (explicit, os.environ.get(ENV_MODS_DIR)):
        if candidate:
            path = Path(candidate)
            if not path.is_dir():
                why = "is not a folder" if path.exists() else "does not exist"
                raise SparkmodsError(f"mods folder {path} {why}")
            return path
    local = Path.cwd() / "mods"
    if local.is_dir():
        return local
    if _REPO_MODS.is_dir():
        return _REPO_MODS
    raise SparkmodsError("no mods folder found: pass --mods-dir or set SPARKMODS_MODS_DIR")


def mod_dirs(root: Path) -> List[Path]:
    """Every folder under root that has a mod.toml, sorted by name."""
    return sorted(p.parent for p in root.glob(f"*/{MANIFEST_TOML}"))


def resolve_mods(names: Sequence[str], root_arg: Optional[str] = None) -> List[Path]:
    """Mod names or folder paths -> mod folders; no names means every mod."""
    if not names:
        root = mods_root(root_arg)
        found = mod_dirs(root)
        if not found:
            raise SparkmodsError(f"{root}: no mods (folders with {MANIFEST_TOML})")
        return found
    out = []
    for name in names:
        path = Path(name)
        if not (path / MANIFEST_TOML).is_file():
            path = mods_root(root_arg) / name
        if not (path / MANIFEST_TOML).is_file():
            raise SparkmodsError(f"{name}: not a mod (no {MANIFEST_TOML}); known mods: "
                                 + ", ".join(p.name for p in mod_dirs(mods_root(root_arg))))
        out.append(path)
    return out


def load(mod_dir: Path) -> Manifest:
    """load_manifest with its errors turned into CLI errors (exit 2, one line)."""
    try:
        return load_manifest(mod_dir)
    except ManifestError as exc:
        raise SparkmodsError(str(exc)) from None
