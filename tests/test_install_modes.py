"""File modes after run.sh: installs copy like `cp` (source bits filtered by the umask), patched
vLLM files keep their own mode. A vLLM run by another user must be able to read what a mod put
there, and nothing may be more open than the umask allows."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from modfactory import ORIGINAL, TARGET, make_mod, make_site, unified
from sparkmods.sync import sync

REPO = Path(__file__).resolve().parent.parent
UMASKS = [0o022, 0o077]


def run_sh(mod: Path, site: Path, workspace: Path, mask: int, *args: str) -> subprocess.CompletedProcess:
    """run.sh under a given umask, the way a container shell would start it."""
    env = {"PATH": os.environ["PATH"], "PYTHON_ROOT": str(site), "SPARKMODS_PYTHON": sys.executable,
           "WORKSPACE_DIR": str(workspace)}
    out = subprocess.run(["bash", "-c", f'umask {mask:04o} && exec bash "$0" "$@"', str(mod / "run.sh"), *args],
                         env=env, text=True, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", UMASKS)
def test_chat_template_is_installed_with_the_sources_mode_under_the_umask(tmp_path, mask):
    mod = REPO / "mods" / "chat-template"
    source = mod / "files" / "qwen3.5-sparkmods.jinja"
    site = make_site(tmp_path / "site")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    run_sh(mod, site, workspace, mask)
    installed = workspace / "qwen3.5-sparkmods.jinja"
    assert installed.read_bytes() == source.read_bytes()
    assert mode(installed) == mode(source) & ~mask
    assert mode(installed) & stat.S_IRUSR


@pytest.mark.parametrize("mask", UMASKS)
def test_workspace_and_site_installs_copy_like_cp_and_patched_files_keep_their_mode(tmp_path, mask):
    new_rel = "vllm/model_executor/layers/created.py"
    patch = unified(TARGET, ORIGINAL, ORIGINAL + "# demo\n") + unified(new_rel, "", "X = 1\n").replace(
        f"--- a/{new_rel}", "--- /dev/null")
    mod = make_mod(tmp_path / "mods", name="modes", patch=patch, toml_extra=(
        'install = [{ src = "files/t.jinja", dest = "workspace:t.jinja" },'
        ' { src = "files/helper.py", dest = "site:vllm/sparkmods_helper.py" }]\n'))
    (mod / "files").mkdir()
    for name, bits in (("t.jinja", 0o754), ("helper.py", 0o751)):
        (mod / "files" / name).write_text(f"# {name}\n")
        (mod / "files" / name).chmod(bits)
    sync(mod)
    site = make_site(tmp_path / "site")
    (site / TARGET).chmod(0o640)
    workspace = tmp_path / "ws"
    workspace.mkdir()

    out = run_sh(mod, site, workspace, mask)
    assert "installed vllm/sparkmods_helper.py" in out.stdout and f"patched {new_rel}" in out.stdout
    assert mode(workspace / "t.jinja") == 0o754 & ~mask
    assert mode(site / "vllm" / "sparkmods_helper.py") == 0o751 & ~mask
    assert mode(site / new_rel) == 0o666 & ~mask
    assert mode(site / TARGET) == 0o640  # the umask never changes a patched file's mode
    assert (site / TARGET).read_text().endswith("# demo\n")

    run_sh(mod, site, workspace, mask, "revert")
    assert (site / TARGET).read_text() == ORIGINAL and mode(site / TARGET) == 0o640
    assert not (site / new_rel).exists() and not (site / "vllm" / "sparkmods_helper.py").exists()
