"""Real vLLM releases from PyPI in cached virtual environments, for `vllm_runtime` tests.

A vLLM install is minutes and gigabytes, so each release gets one environment that every
later run reuses: `$SPARKMODS_VENV_DIR/vllm-<version>` (default
`~/.cache/sparkmods/venvs/vllm-<version>`). A file lock per release lets parallel tests
(pytest-xdist, several helpers) share it: the first one installs, the others wait. An
environment counts as ready only once its marker file is written, so an interrupted install
is wiped and redone on the next call.

Installs use `uv` (next to the running interpreter or on PATH): its cache hardlinks the
wheels that environments share (torch and the CUDA libraries are most of the size), so many
releases fit in a few tens of GB where pip would copy everything each time.

The cached environments stay pristine. A test that patches vLLM does so on `overlay()`: a
private folder of hardlinks to the release's `vllm/` and its dist-info. Mods write
atomically (temp file + rename), which replaces a link without touching the cached file;
running the environment's python with that folder first on `PYTHONPATH` imports the
patched copy.

API: `vllm_env(version) -> VllmEnv`; `VllmEnv.overlay(dest)`; `VllmEnv.run(args, ...)`;
`run_sh(mod_dir, site, workspace)` applies a mod the way the launcher does, with its run.sh.

The nightly heal (sparkmods.heal) runs a mod's runtime tests on one vLLM and on the mods it is
proposing: `runtime_mods()` is the folder holding the mods under test ($SPARKMODS_RUNTIME_MODS,
else the repository's) and `runtime_releases(default)` the releases to test ([$SPARKMODS_RUNTIME_VLLM]
when set). A version PyPI does not have (a nightly, another index's release) comes with its
wheel ($SPARKMODS_RUNTIME_WHEEL): its environment is the PyPI release $SPARKMODS_RUNTIME_DEPS,
and its overlay holds the wheel's own vllm/ and dist-info instead of that release's.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Mapping, Optional, Sequence

__all__ = ["VllmEnv", "VllmEnvError", "run_sh", "runtime_mods", "runtime_releases", "venvs_dir", "vllm_env"]

ENV_DIR_VAR = "SPARKMODS_VENV_DIR"
# The names sparkmods.heal sets (ENV_MODS, ENV_VLLM, ENV_WHEEL, ENV_DEPS there).
MODS_VAR, VLLM_VAR, WHEEL_VAR, DEPS_VAR = ("SPARKMODS_RUNTIME_MODS", "SPARKMODS_RUNTIME_VLLM",
                                           "SPARKMODS_RUNTIME_WHEEL", "SPARKMODS_RUNTIME_DEPS")
MARKER = "sparkmods-venv.json"
INSTALL_TIMEOUT_S = 45 * 60

# Per release, requirements that replace every requirement on that package (uv --override);
# say why next to each. An environment built with other overrides is brought up to date.
OVERRIDES = {
    "0.33.0": (
        # vllm asks for certifi>=2026.10.19, newer than any certifi on the index; certifi
        # is only the CA bundle, so the newest one there does.
        "certifi>=2026.1.4",
        # Left alone, the resolver pairs cuda-bindings 13.5 with the old all-in-one
        # cuda-python 12.6, which overwrites cuda/bindings with 12.x files; importing the
        # Qwen3.5 model module then fails in nvidia-cutlass-dsl (no cudaLibrary_t).
        "cuda-python>=13",
    ),
}


class VllmEnvError(RuntimeError):
    """An environment could not be created; the message names the release and the step."""


@dataclass(frozen=True)
class VllmEnv:
    """One installed vLLM release."""

    version: str
    root: Path
    install_seconds: float
    wheel: Optional[Path] = None  # overlays take vllm/ from this wheel instead of the environment

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def site(self) -> Path:
        """The site-packages folder that holds vllm/."""
        found = sorted(self.root.glob("lib/python3*/site-packages"))
        if not found:
            raise VllmEnvError(f"{self.root}: no lib/python3*/site-packages")
        return found[0]

    def overlay(self, dest: Path) -> Path:
        """Hardlink vllm/ and its dist-info into dest (created); returns dest, a site dir.
        With a wheel, its vllm/ and dist-info are extracted there instead."""
        dest.mkdir(parents=True, exist_ok=True)
        if self.wheel is not None:
            with zipfile.ZipFile(self.wheel) as zf:
                zf.extractall(dest, [n for n in zf.namelist() if n.split("/", 1)[0] == "vllm"
                                     or (n.startswith("vllm-") and n.split("/", 1)[0].endswith(".dist-info"))])
            return dest
        for src in [self.site / "vllm", *self.site.glob("vllm-*.dist-info")]:
            shutil.copytree(src, dest / src.name, copy_function=os.link, symlinks=True)
        return dest

    def run(
        self,
        args: Sequence[str],
        *,
        pythonpath: Optional[Path] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout: float = 600,
        cwd: Optional[Path] = None,
    ) -> "subprocess.CompletedProcess[str]":
        """Run this environment's python with args; pythonpath (an overlay) is searched first.

        Bytecode writing is left on even where the caller's environment turns it off: torch and
        the other libraries then compile once into the environment (atomic writes, safe in
        parallel) instead of on every run.
        """
        dropped = ("PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")
        full_env = {k: v for k, v in os.environ.items() if k not in dropped}
        if pythonpath is not None:
            full_env["PYTHONPATH"] = str(pythonpath)
        full_env.update(env or {})
        return subprocess.run(
            [str(self.python), *args], env=full_env, cwd=cwd, timeout=timeout,
            capture_output=True, text=True, check=False,
        )


def venvs_dir() -> Path:
    """Where the environments live: $SPARKMODS_VENV_DIR, else ~/.cache/sparkmods/venvs."""
    configured = os.environ.get(ENV_DIR_VAR)
    return Path(configured) if configured else Path.home() / ".cache" / "sparkmods" / "venvs"


def _uv() -> str:
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.is_file() else shutil.which("uv")
    if not found:
        raise VllmEnvError("uv is needed to install vLLM test environments: pip install uv")
    return found


def _check(cmd: Sequence[str], version: str, step: str) -> None:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
        raise VllmEnvError(f"vllm=={version}: {step} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def _install(root: Path, version: str) -> None:
    """Create or bring up to date (uv pip install is idempotent) the environment at root."""
    uv = _uv()
    _check([uv, "venv", "-q", "--allow-existing", "--python", sys.executable, str(root)], version, "uv venv")
    cmd = [uv, "pip", "install", "-q", "--python", str(root / "bin" / "python"), f"vllm=={version}"]
    overrides = OVERRIDES.get(version)
    if overrides:
        override_file = root / "sparkmods-overrides.txt"
        override_file.write_text("\n".join(overrides) + "\n", encoding="utf-8")
        cmd += ["--override", str(override_file)]
    _check(cmd, version, "uv pip install")
    # Bytecode for vLLM itself: probes import it from an overlay of hardlinks, whose .pyc are
    # then these files (same inode, same mtime: valid). Without them every probe compiled
    # several hundred vLLM modules again (they are written into the overlay, then deleted),
    # about half of a probe's CPU time. A file this Python cannot compile just stays without.
    env = VllmEnv(version=version, root=root, install_seconds=0.0)
    subprocess.run([str(env.python), "-m", "compileall", "-q", "-j", "0", str(env.site / "vllm")],
                   capture_output=True, timeout=INSTALL_TIMEOUT_S, check=False)


def _marker(root: Path) -> Optional[dict]:
    marker = root / MARKER
    return json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() else None


def _load(root: Path, version: str) -> Optional[VllmEnv]:
    data = _marker(root)
    if data is None or data.get("overrides", []) != list(OVERRIDES.get(version, ())) or not data.get("bytecode"):
        return None
    return VllmEnv(version=version, root=root, install_seconds=float(data["install_seconds"]))


def runtime_mods() -> Path:
    """The folder holding the mods the runtime tests apply."""
    configured = os.environ.get(MODS_VAR)
    return Path(configured) if configured else Path(__file__).resolve().parents[1] / "mods"


def runtime_releases(default: Callable[[], List[str]]) -> List[str]:
    """The releases to test: the one the heal names, else default() (read only then)."""
    configured = os.environ.get(VLLM_VAR)
    return [configured] if configured else default()


def vllm_env(version: str) -> VllmEnv:
    """The environment holding vllm==version, installed on first use (minutes, GBs); for the
    heal's version with a wheel, the dependencies' release with that wheel for overlays."""
    wheel, deps = os.environ.get(WHEEL_VAR), os.environ.get(DEPS_VAR)
    if wheel and deps and version == os.environ.get(VLLM_VAR):
        env = vllm_env(deps)
        return VllmEnv(version=version, root=env.root, install_seconds=env.install_seconds, wheel=Path(wheel))
    base = venvs_dir()
    base.mkdir(parents=True, exist_ok=True)
    root = base / f"vllm-{version}"
    ready = _load(root, version)
    if ready:
        return ready
    with open(base / f"vllm-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = _load(root, version)
        if ready:
            return ready
        if root.exists() and _marker(root) is None:
            shutil.rmtree(root)  # an interrupted install: no marker was written
        start = time.monotonic()
        try:
            _install(root, version)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        seconds = round(time.monotonic() - start, 1)
        tmp = root / f".{MARKER}.tmp"
        record = {"vllm": version, "install_seconds": seconds, "overrides": list(OVERRIDES.get(version, ())),
                  "bytecode": True}
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, root / MARKER)
        return VllmEnv(version=version, root=root, install_seconds=seconds)


def applied_overlay(mod_dir: Path, version: str, tmp: Path, variant: str) -> "tuple[VllmEnv, Path]":
    """The release's venv and an overlay of its site-packages with the mod applied by its own
    run.sh, which must say it applied `variant` (the test's premise)."""
    env = vllm_env(version)
    site = env.overlay(tmp / "site")
    applied = run_sh(mod_dir, site, tmp / "workspace")
    assert applied.returncode == 0 and f"applied variant {variant} " in applied.stdout, applied.stdout + applied.stderr
    return env, site


def run_sh(mod_dir: Path, site: Path, workspace: Path, *args: str) -> "subprocess.CompletedProcess[str]":
    """Run the mod's run.sh (args as given, e.g. "revert") on the vLLM in site.

    A mod whose run.sh is not generated yet (`sparkmods sync`) is synced into a copy next
    to workspace first, so tests run the exact script the launcher would.
    """
    if not (mod_dir / "run.sh").is_file():
        copy = workspace.parent / "synced-mods" / mod_dir.name
        if not copy.exists():
            shutil.copytree(mod_dir, copy)
            sparkmods = Path(sys.executable).parent / "sparkmods"
            subprocess.run([str(sparkmods), "sync", "--mods-dir", str(copy.parent), mod_dir.name],
                           check=True, capture_output=True, text=True)
        mod_dir = copy
    workspace.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHON_ROOT": str(site), "WORKSPACE_DIR": str(workspace)}
    return subprocess.run(["bash", str(mod_dir / "run.sh"), *args], cwd=workspace, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


RAY_VERSION = "2.60.0"


def ray_site() -> Path:
    """Ray installed with uv --target into the test cache, once (a file lock for xdist)."""
    base = venvs_dir()
    base.mkdir(parents=True, exist_ok=True)
    site = base / f"ray-{RAY_VERSION}"
    with open(base / f"ray-{RAY_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (site / "ray" / "__init__.py").is_file():
            subprocess.run([_uv(), "pip", "install", "-q", "--python", sys.executable, "--target", str(site),
                            f"ray=={RAY_VERSION}"], check=True)
    return site
