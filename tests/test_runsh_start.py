"""run.sh's start-up: it reads the generated manifest.json (no TOML parser), and runs the
runtime from compiled code kept in the user's cache, never written into the mod or vLLM's
tree, and used only when it was compiled from exactly the source this run would compile.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

import realtree
from modfactory import ORIGINAL, PATCHED, TARGET, edit_runtime, make_mod, make_site, run_sh


def _run(mod: Path, site: Path, tmp_path: Path, cache: Path, *args: str):
    return run_sh(mod, site, tmp_path, *args, env_extra={"SPARKMODS_CACHE_DIR": str(cache)})


def test_run_sh_reads_the_generated_manifest_not_mod_toml(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    (mod / "mod.toml").write_text("this is [not TOML\n")  # the host's file; run.sh never parses it
    out = _run(mod, site, tmp_path, tmp_path / "cache")
    assert out.returncode == 0, out.stdout + out.stderr
    assert (site / TARGET).read_text() == PATCHED


def test_compiled_code_lives_in_the_cache_only_and_is_reused(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    cache = tmp_path / "cache"
    mod_before = realtree.snapshot(mod)
    site_before = realtree.snapshot(site)
    assert _run(mod, site, tmp_path, cache, "check").returncode == 0
    entries = {p.name.split("-")[0] for p in (cache / "runtime-code").iterdir()}
    assert {"_sparkmods.applier", "_sparkmods.engine", "_sparkmods.manifest"} <= entries
    assert realtree.snapshot(mod) == mod_before and realtree.snapshot(site) == site_before
    assert not list(mod.rglob("__pycache__")) and not list(site.rglob("__pycache__"))

    # An entry is run when magic, path and source match: here one whose code exits 42.
    (entry,) = (cache / "runtime-code").glob("_sparkmods.applier-*.code")
    magic, path, source, _ = marshal.loads(entry.read_bytes())
    entry.write_bytes(marshal.dumps((magic, path, source, compile("raise SystemExit(42)", path, "exec"))))
    assert _run(mod, site, tmp_path, cache, "check").returncode == 42

    # ... and never once the source differs: the edited module is compiled afresh.
    edit_runtime(mod, "applier", lambda text: text + "\n# edited\n")
    out = _run(mod, site, tmp_path, cache)
    assert out.returncode == 0 and (site / TARGET).read_text() == PATCHED, out.stdout + out.stderr
    assert marshal.loads(entry.read_bytes())[2].endswith("\n# edited\n")  # the entry was replaced


def test_an_entry_from_another_interpreter_is_not_used(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    cache = tmp_path / "cache"
    assert _run(mod, site, tmp_path, cache, "check").returncode == 0
    (entry,) = (cache / "runtime-code").glob("_sparkmods.applier-*.code")
    magic, path, source, _ = marshal.loads(entry.read_bytes())
    other = bytes([magic[0] ^ 1]) + magic[1:]
    assert other != importlib.util.MAGIC_NUMBER
    entry.write_bytes(marshal.dumps((other, path, source, compile("raise SystemExit(42)", path, "exec"))))
    out = _run(mod, site, tmp_path, cache)
    assert out.returncode == 0 and (site / TARGET).read_text() == PATCHED, out.stdout + out.stderr


def test_a_cache_that_cannot_be_written_only_costs_the_compile(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be\n")
    out = _run(mod, site, tmp_path, blocked)
    assert out.returncode == 0 and out.stderr == "", out.stdout + out.stderr
    assert (site / TARGET).read_text() == PATCHED
    out = _run(mod, site, tmp_path, blocked, "revert")
    assert out.returncode == 0 and (site / TARGET).read_text() == ORIGINAL, out.stdout + out.stderr


def test_the_interpreter_start_up_still_decides_where_vllm_is(tmp_path: Path) -> None:
    """run.sh starts Python with -S and the runtime runs the site start-up itself: what it adds
    to sys.path (here a sitecustomize, as .pth files do in vLLM's images) is searched for vllm/."""
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    startup = tmp_path / "startup"
    startup.mkdir()
    (startup / "sitecustomize.py").write_text(f"import sys\nsys.path.append({str(site)!r})\n")
    env = {"PATH": os.environ["PATH"], "SPARKMODS_PYTHON": sys.executable, "PYTHONPATH": str(startup),
           "SPARKMODS_CACHE_DIR": str(tmp_path / "cache")}
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
