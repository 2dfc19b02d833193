"""run.sh however it is reached, and a --site that names no vLLM (issue 30, item 9): through a
symbolic link (Python used to look for _sparkmods.py beside the link: a traceback), from a
folder whose path holds ':' (PYTHONPATH split it: a traceback), and `--site /` or a file (the
runtime said it "found vllm/" there). Each works, or is one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from modfactory import ORIGINAL, PATCHED, TARGET, make_mod, make_site


def run_sh(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env: Dict[str, str] = {"PATH": os.environ["PATH"], "SPARKMODS_PYTHON": sys.executable,
                           "SPARKMODS_CACHE_DIR": str(cwd / "cache"), "HOME": str(cwd)}
    return subprocess.run([str(script), *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=60)


def _links(tmp_path: Path, mod: Path) -> List[Path]:
    """An absolute link, a relative one, and a link to a link, in other folders."""
    (tmp_path / "bin").mkdir()
    absolute = tmp_path / "bin" / "demo-run"
    absolute.symlink_to(mod / "run.sh")
    relative = tmp_path / "bin" / "rel"
    relative.symlink_to(os.path.relpath(mod / "run.sh", relative.parent))
    chained = tmp_path / "chained"
    chained.symlink_to(relative)
    return [absolute, relative, chained]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["absolute link", "relative link", "link to a link"])
def test_run_sh_through_a_symbolic_link_applies_the_mod_it_points_to(tmp_path, which):
    site = make_site(tmp_path / "site", "0.19.1")
    mod = make_mod(tmp_path / "mods")
    link = _links(tmp_path, mod)[which]
    out = run_sh(link, "--site", str(site), cwd=tmp_path)
    assert out.returncode == 0 and (site / TARGET).read_text() == PATCHED, out.stdout + out.stderr
    assert "[demo] applied variant" in out.stdout
    out = run_sh(link, "revert", "--site", str(site), cwd=tmp_path)
    assert out.returncode == 0 and (site / TARGET).read_text() == ORIGINAL, out.stdout + out.stderr


@pytest.mark.parametrize("folder", ["a:b", "x:", ":lead", "sp ace:and=eq"])
def test_run_sh_in_a_folder_whose_path_holds_a_colon(tmp_path, folder):
    site = make_site(tmp_path / "site", "0.19.1")
    mod = make_mod(tmp_path / folder / "mods")
    out = run_sh(mod / "run.sh", "--site", str(site), cwd=tmp_path)
    assert out.returncode == 0 and (site / TARGET).read_text() == PATCHED, out.stdout + out.stderr
    out = run_sh(mod / "run.sh", "check", "--site", str(site), cwd=tmp_path)
    assert out.returncode == 0 and "already applied" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("what, why", [("/", "no vllm/ in it"), ("file", "not a folder"),
                                       ("missing", "no such folder"), ("empty", "no vllm/ in it")])
@pytest.mark.parametrize("action", ["apply", "check", "revert"])
def test_a_site_that_holds_no_vllm_is_one_line(tmp_path, what, why, action):
    mod = make_mod(tmp_path / "mods")
    site = {"/": Path("/"), "file": tmp_path / "file", "missing": tmp_path / "missing", "empty": tmp_path / "empty"}[what]
    if what == "file":
        site.write_text("x")
    elif what == "empty":
        site.mkdir()
    out = run_sh(mod / "run.sh", action, "--site", str(site), cwd=tmp_path)
    assert (out.returncode, out.stderr) == (2, ""), out.stderr
    assert out.stdout == f"[demo] ERROR: --site {site}: {why}; name the site-packages folder that holds vllm/\n"
