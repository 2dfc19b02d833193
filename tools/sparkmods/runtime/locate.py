"""Find the vLLM installation a mod should patch, without importing vLLM.

Importing vllm inside a container pulls in torch and CUDA and can take a minute or fail on
a machine without a GPU, so we look for the files instead: `vllm/__init__.py` on the
interpreter's path, the version from the `vllm-*.dist-info` METADATA next to it (or
`vllm/_version.py`). `PYTHON_ROOT` (a site-packages folder, or a prefix holding one) wins
when set. No path such as dist-packages is ever assumed.
"""

from __future__ import annotations

import glob
import os
import re
import sys
from dataclasses import dataclass
from typing import Iterable, List, Optional

from .fsops import StrPath

__all__ = ["LocateError", "Installation", "find_vllm", "read_version"]


class LocateError(RuntimeError):
    """vLLM could not be found or its version read."""


@dataclass
class Installation:
    """Where vLLM is installed and which version it is."""

    site: str  # the folder that holds vllm/ (resolved)
    version: str


def _site_dirs_under(prefix: str) -> List[str]:
    found = []
    for pattern in ("lib/python3*/site-packages", "lib/python3*/dist-packages",
                    "local/lib/python3*/dist-packages", "local/lib/python3*/site-packages"):
        found.extend(sorted(glob.glob(os.path.join(glob.escape(prefix), pattern))))
    return found


def _candidates(python_root: Optional[str]) -> Iterable[str]:
    if python_root:
        yield python_root
        yield from _site_dirs_under(python_root)
        return
    for entry in sys.path:
        if entry:
            yield entry


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def _version_from_dist_info(site: str) -> Optional[str]:
    versions = []
    for name in sorted(os.listdir(site) if os.path.isdir(site) else ()):
        if not (name.startswith("vllm-") and name.endswith(".dist-info")):
            continue
        meta = os.path.join(site, name, "METADATA")
        if not os.path.isfile(meta):
            continue
        for line in _read_text(meta).splitlines():
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


def _version_from_module(site: str) -> Optional[str]:
    path = os.path.join(site, "vllm", "_version.py")
    if not os.path.isfile(path):
        return None
    # setuptools-scm writes e.g. `__version__ = version = '0.18.0'` (chained, maybe annotated).
    match = re.search(r"""^(?:__version__|version)\s*(?::\s*\w+\s*)?=\s*(?:(?:__version__|version)\s*=\s*)?['"]([^'"]+)['"]""",
                      _read_text(path), re.M)
    return match.group(1) if match else None


def read_version(site: StrPath) -> str:
    """The vLLM version installed in site (dist-info first, then vllm/_version.py)."""
    site = os.fspath(site)
    version = _version_from_dist_info(site) or _version_from_module(site)
    if not version:
        raise LocateError(f"{site}: found vllm/ but no vllm-*.dist-info/METADATA or vllm/_version.py to read its version")
    return version


def named_site(site: str) -> str:
    """run.sh's --site: a folder that holds vllm/ itself (a prefix is searched only through
    PYTHON_ROOT), else one line saying what it is instead."""
    if not os.path.isdir(site):
        what = "no such folder" if not os.path.lexists(site) else "not a folder"
        raise LocateError(f"--site {site}: {what}; name the site-packages folder that holds vllm/")
    if not os.path.isfile(os.path.join(site, "vllm", "__init__.py")):
        raise LocateError(f"--site {site}: no vllm/ in it; name the site-packages folder that holds vllm/")
    return site


def find_vllm(python_root: Optional[str] = None) -> Installation:
    """Locate vllm; python_root defaults to $PYTHON_ROOT, then the interpreter's sys.path."""
    if python_root is None:
        python_root = os.environ.get("PYTHON_ROOT") or None
    seen = set()
    for site in _candidates(python_root):
        key = os.path.realpath(site) if os.path.exists(site) else site
        if key in seen:
            continue
        seen.add(key)
        if os.path.isfile(os.path.join(site, "vllm", "__init__.py")):
            return Installation(os.path.realpath(site), read_version(site))
    where = f"PYTHON_ROOT={python_root}" if python_root else f"the path of {sys.executable}"
    raise LocateError(f"vllm is not installed in {where} (set PYTHON_ROOT to the site-packages that holds vllm/)")
