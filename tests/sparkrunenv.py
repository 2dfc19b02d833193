"""The real sparkrun (spark-arena's launcher, from PyPI) in a cached virtual environment.

sparkrun needs Python >= 3.12 while the project runs on 3.11, so the environment is built with
`uv` on the newest interpreter >= 3.12 found on this machine (PATH, then pyenv's versions);
`uv` never downloads one (UV_PYTHON_DOWNLOADS=never). One environment per release under
`$SPARKMODS_VENV_DIR` (default ~/.cache/sparkmods/venvs) as `sparkrun-<version>`, shared by
parallel tests through a file lock and counted ready only once its marker is written, as
tests/vllmenv.py does for vLLM. An install is a few seconds from the package index.

The `sparkrun` fixture (registered in conftest.py) is that sparkrun with this working tree's
registry added, as users add it.
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional

import pytest
import yaml

from vllmenv import _uv, venvs_dir

__all__ = ["SOURCES", "SPARKRUN_VERSION", "Sparkrun", "SparkrunEnvError", "registry", "serve_command", "sparkrun",
           "sparkrun_env"]

SPARKRUN_VERSION = "0.4.2"
MARKER = "sparkmods-sparkrun.txt"
_MIN = (3, 12)


class SparkrunEnvError(RuntimeError):
    """No environment could be made; the message says which step failed."""


def _version_of(python: str) -> Optional[tuple]:
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return None
    parts = out.stdout.split()
    return (int(parts[0]), int(parts[1])) if out.returncode == 0 and len(parts) == 2 else None


def find_python() -> Optional[str]:
    """The newest interpreter >= 3.12 here, or None."""
    candidates: List[str] = [p for p in (shutil.which(f"python3.{m}") for m in range(20, 11, -1)) if p]
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += [str(p) for p in sorted(pyenv_root.glob("3.*/bin/python3"), reverse=True)]
    found = [(v, c) for c in candidates if (v := _version_of(c)) and v >= _MIN]
    return max(found)[1] if found else None


def sparkrun_env(version: str = SPARKRUN_VERSION) -> Path:
    """The `sparkrun` executable of an environment holding sparkrun==version (installed once)."""
    if not re.fullmatch(r"[0-9][0-9a-z.]*", version):
        raise SparkrunEnvError(f"sparkrun version {version!r} is not a release number")
    base = venvs_dir()
    base.mkdir(parents=True, exist_ok=True)
    root = base / f"sparkrun-{version}"
    exe = root / "bin" / "sparkrun"
    with open(base / f"sparkrun-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / MARKER).is_file() and exe.is_file():
            return exe
        shutil.rmtree(root, ignore_errors=True)
        python = find_python()
        if python is None:
            raise SparkrunEnvError("sparkrun needs Python >= 3.12 and none was found on PATH or in pyenv")
        env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
        for step in ([_uv(), "venv", "-q", "--python", python, str(root)],
                     [_uv(), "pip", "install", "-q", "--python", str(root / "bin" / "python"), f"sparkrun=={version}"]):
            done = subprocess.run(step, env=env, capture_output=True, text=True, timeout=900, check=False)
            if done.returncode != 0:
                shutil.rmtree(root, ignore_errors=True)
                raise SparkrunEnvError(f"sparkrun=={version}: {step[1]} {step[2]} failed: "
                                       + (done.stderr or done.stdout).strip()[-800:])
        (root / MARKER).write_text(version + "\n", encoding="utf-8")
        return exe


REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted((REPO / "launch" / "recipes").glob("*.yaml"))


@functools.lru_cache(maxsize=1)
def registry() -> str:
    """The name our .sparkrun/registry.yaml gives the recipe registry (read when a test asks: conftest
    imports this module for every test, also in trees without .sparkrun/)."""
    return yaml.safe_load((REPO / ".sparkrun" / "registry.yaml").read_text())["registries"][0]["name"]


class Sparkrun:
    def __init__(self, exe: Path, home: Path) -> None:
        self.exe, self.home = exe, home

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "HOME": str(self.home), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1",
               "XDG_CONFIG_HOME": str(self.home / ".config"), "XDG_CACHE_HOME": str(self.home / ".cache")}
        return subprocess.run([str(self.exe), *args], env=env, capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def sparkrun(tmp_path_factory) -> Sparkrun:
    exe = sparkrun_env()
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True).stdout
    assert SPARKRUN_VERSION in version
    # The registry as users get it: a git repository with what this working tree holds.
    repo = tmp_path_factory.mktemp("registry") / "spark-vllm-mods"
    repo.mkdir()
    for part in (".sparkrun", "launch", "mods"):
        shutil.copytree(REPO / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-C", str(repo), "-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "registry"]):
        subprocess.run(git + step, check=True, capture_output=True)
    run = Sparkrun(exe, tmp_path_factory.mktemp("home"))
    added = run("registry", "add", "--trust", f"file://{repo}")
    assert added.returncode == 0 and "Added 1 registry" in added.stdout, added.stdout + added.stderr
    return run


def serve_command(output: str) -> List[str]:
    """The argv of the "Serve command:" block sparkrun's dry run prints."""
    block = output.split("Serve command:", 1)[1].split("\n\n", 1)[0]
    return shlex.split(block.replace("\\\n", " "))
