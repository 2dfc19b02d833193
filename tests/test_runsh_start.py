"""run.sh's start-up: it reads the generated manifest.json (no TOML parser) and runs the
runtime's source as _sparkmods.py holds it, writing no compiled code anywhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

import realtree
from modfactory import PATCHED, TARGET, edit_runtime, make_mod, make_site, run_sh


def test_run_sh_reads_the_generated_manifest_not_mod_toml(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    (mod / "mod.toml").write_text("this is [not TOML\n")  # the host's file; run.sh never parses it
    out = run_sh(mod, site, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (site / TARGET).read_text() == PATCHED


def test_no_compiled_code_is_written_to_the_mod_the_tree_or_the_home(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    home = tmp_path / "home"
    home.mkdir()
    mod_before = realtree.snapshot(mod)
    site_before = realtree.snapshot(site)
    out = run_sh(mod, site, tmp_path, "check", env_extra={"HOME": str(home), "XDG_CACHE_HOME": ""})
    assert out.returncode == 0, out.stdout + out.stderr
    assert realtree.snapshot(mod) == mod_before and realtree.snapshot(site) == site_before
    assert not list(home.iterdir())


def test_an_edited_runtime_runs_as_edited(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    assert run_sh(mod, site, tmp_path, "check").returncode == 0
    edit_runtime(mod, "applier", lambda text: text + "\nraise SystemExit(42)\n")
    assert run_sh(mod, site, tmp_path, "check").returncode == 42


def test_the_interpreter_start_up_still_decides_where_vllm_is(tmp_path: Path) -> None:
    """run.sh starts Python with -S and the runtime runs the site start-up itself: what it adds
    to sys.path (here a sitecustomize, as .pth files do in vLLM's images) is searched for vllm/."""
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    startup = tmp_path / "startup"
    startup.mkdir()
    (startup / "sitecustomize.py").write_text(f"import sys\nsys.path.append({str(site)!r})\n")
    env = {"PATH": os.environ["PATH"], "SPARKMODS_PYTHON": sys.executable, "PYTHONPATH": str(startup)}
    out = subprocess.run(["bash", str(mod / "run.sh")], cwd=tmp_path, env=env, text=True, capture_output=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (site / TARGET).read_text() == PATCHED


@pytest.mark.skipif(shutil.which("dash") is None, reason="no dash here (Debian's /bin/sh)")
@pytest.mark.parametrize("command", [["dash", "run.sh", "check"], ["dash", "mods/demo/run.sh"]])
def test_sh_run_sh_says_in_one_line_to_use_bash(tmp_path: Path, command: List[str]) -> None:
    """`sh run.sh` on Debian is dash, which would stop at `set -o pipefail` with its own words."""
    mod = make_mod(tmp_path / "mods")
    cwd = mod if command[1] == "run.sh" else tmp_path
    out = subprocess.run(command, cwd=cwd, text=True, capture_output=True, timeout=60)
    script = command[1]
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == f"{script}: needs bash, not sh: run it as bash {script} (or ./run.sh)\n"
