"""Find the vLLM installation a mod should patch, without importing vLLM.

Importing vllm inside a container pulls in torch and CUDA and can take a minute or fail on
a machine without a GPU, so we look for the files instead: `vllm/__init__.py` on the
interpreter's path, the version from the `vllm-*.dist-info` METADATA next to it (or
`vllm/_version.py`). `PYTHON_ROOT` (a site-packages folder, or a prefix holding one) wins
when set. No path such as dist-packages is ever assumed.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional

__all__ = ["LocateError", "Installation", "find_vllm", "read_version"]


class LocateError(RuntimeError):
    """vLLM could not be found or its version read."""


@dataclass(frozen=True)
class Installation:
    site: Path  # the folder that holds vllm/
    version: str


def _site_dirs_under(prefix: Path) -> List[Path]:
    found = []
    for pattern in ("lib/python3*/site-packages", "lib/python3*/dist-packages",
                    "local/lib/python3*/dist-packages", "local/lib/python3*/site-packages"):
        found.extend(sorted(prefix.glob(pattern)))
    return found


def _candidates(python_root: Optional[str]) -> Iterable[Path]:
    if python_root:
        root = Path(python_root)
        yield root
        yield from _site_dirs_under(root)
        return
    for entry in sys.path:
        if entry:
            yield Path(entry)


def _version_from_dist_info(site: Path) -> Optional[str]:
    versions = []
    for dist in sorted(site.glob("vllm-*.dist-info")):
        meta = dist / "METADATA"
        if not meta.is_file():
            continue
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                versions.append(line.split(":", 1)[1].strip())
                break
            if not line.strip():
                break
    if len(set(versions)) > 1:
        raise LocateError(
            f"{site}: several vllm dist-info folders ({', '.join(versions)}); remove the stale one"
        )
    return versions[0] if versions else None


def _version_from_module(site: Path) -> Optional[str]:
    path = site / "vllm" / "_version.py"
    if not path.is_file():
        return None
    # setuptools-scm writes e.g. `__version__ = version = '0.18.0'` (chained, maybe annotated).
    match = re.search(r"""^(?:__version__|version)\s*(?::\s*\w+\s*)?=\s*(?:(?:__version__|version)\s*=\s*)?['"]([^'"]+)['"]""",
                      path.read_text(encoding="utf-8", errors="replace"), re.M)
    return match.group(1) if match else None


def read_version(site: Path) -> str:
    """The vLLM version installed in site (dist-info first, then vllm/_version.py)."""
    version = _version_from_dist_info(site) or _version_from_module(site)
    if not version:
        raise LocateError(f"{site}: found vllm/ but no vllm-*.dist-info/METADATA or vllm/_version.py to read its version")
    return version


def find_vllm(python_root: Optional[str] = None) -> Installation:
    """Locate vllm; python_root defaults to $PYTHON_ROOT, then the interpreter's sys.path."""
    if python_root is None:
        python_root = os.environ.get("PYTHON_ROOT") or None
    seen = set()
    for site in _candidates(python_root):
        key = str(site.resolve()) if site.exists() else str(site)
        if key in seen:
            continue
        seen.add(key)
        if (site / "vllm" / "__init__.py").is_file():
            return Installation(site.resolve(), read_version(site))
    where = f"PYTHON_ROOT={python_root}" if python_root else f"the path of {sys.executable}"
    raise LocateError(f"vllm is not installed in {where} (set PYTHON_ROOT to the site-packages that holds vllm/)")
