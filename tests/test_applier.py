"""run.sh and `sparkmods apply`: the container flow on a real folder tree, through bash."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from modfactory import ORIGINAL, PATCHED, TARGET, edit_runtime, make_mod, make_site, make_template_mod, run_sh
from sparkmods.cli import main
from sparkmods.sync import stale_files


def test_run_sh_applies_then_says_already_applied(tmp_path):
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    first = run_sh(mod, site, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (site / TARGET).read_text() == PATCHED
    assert all(line.startswith("[demo] ") for line in first.stdout.splitlines())
    assert "applied variant v1 to vLLM 0.19.1" in first.stdout
    second = run_sh(mod, site, tmp_path)
    assert second.returncode == 0 and "already applied" in second.stdout
    assert (site / TARGET).read_text() == PATCHED


def test_run_sh_no_variant_changes_nothing_and_names_versions(tmp_path):
    site = make_site(tmp_path / "site", version="0.22.0")
    mod = make_mod(tmp_path / "mods")
    out = run_sh(mod, site, tmp_path)
    assert out.returncode == 1
    assert "0.22.0" in out.stdout and out.stdout.count("v1 (>=0.19.0,<0.21; verified on 0.19.1)") == 1
    assert "nothing was changed" in out.stdout
    assert (site / TARGET).read_text() == ORIGINAL


def test_run_sh_conflict_reports_hunk_and_changes_nothing(tmp_path):
    site = make_site(tmp_path / "site", files={TARGET: ORIGINAL.replace("y = x * 2", "y = x * 3")})
    before = (site / TARGET).read_text()
    mod = make_mod(tmp_path / "mods")
    out = run_sh(mod, site, tmp_path)
    assert out.returncode == 1
    assert f"{TARGET}: hunk 1" in out.stdout and "expected 'y = x * 2', found 'y = x * 3'" in out.stdout
    assert (site / TARGET).read_text() == before
    assert [p.name for p in (site / ".sparkmods").iterdir()] == [".lock"]  # the tree's lock, no state


def test_dev_build_version_selects_the_variant_before_it(tmp_path):
    site = make_site(tmp_path / "site", version="0.19.1rc1.dev15+g50cd5674b.d20260403")
    mod = make_mod(tmp_path / "mods", vllm=">=0.19.0,<0.19.1", verified='["0.19.0"]')
    out = run_sh(mod, site, tmp_path)
    assert out.returncode == 0, out.stdout
    assert "vLLM 0.19.1rc1.dev15+g50cd5674b.d20260403" in out.stdout


def test_revert_restores_pristine_files_and_refuses_after_local_edit(tmp_path):
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    assert run_sh(mod, site, tmp_path).returncode == 0
    state = json.loads((site / ".sparkmods" / "demo" / "state.json").read_text())
    assert state["variant"] == "v1" and TARGET in state["files"]
    (site / TARGET).write_text(PATCHED + "# local edit\n")
    refused = run_sh(mod, site, tmp_path, "revert")
    assert refused.returncode == 1 and "changed since" in refused.stdout
    (site / TARGET).write_text(PATCHED)
    out = run_sh(mod, site, tmp_path, "revert")
    assert out.returncode == 0 and (site / TARGET).read_text() == ORIGINAL
    assert not (site / ".sparkmods" / "demo").exists()


def test_revert_without_state_uses_reverse_patch(tmp_path):
    site = make_site(tmp_path / "site", files={TARGET: PATCHED})
    mod = make_mod(tmp_path / "mods")
    out = run_sh(mod, site, tmp_path, "revert")
    assert out.returncode == 0 and (site / TARGET).read_text() == ORIGINAL


def test_host_apply_dry_run_and_revert(tmp_path, capsys):
    site = make_site(tmp_path / "site")
    make_mod(tmp_path / "mods")
    args = ["apply", "demo", "--mods-dir", str(tmp_path / "mods"), "--vllm", f"dir:{site}"]
    assert main(args + ["--dry-run"]) == 0
    assert (site / TARGET).read_text() == ORIGINAL
    assert "would patch" in capsys.readouterr().out
    assert main(args) == 0 and (site / TARGET).read_text() == PATCHED
    assert main(args + ["--revert"]) == 0 and (site / TARGET).read_text() == ORIGINAL
    assert main(["apply", "demo", "--mods-dir", str(tmp_path / "mods"), "--vllm", "pypi:0.19.1"]) == 2


def test_workspace_install_is_idempotent_and_prints_notes(tmp_path):
    site = make_site(tmp_path / "site")
    mod = make_template_mod(tmp_path / "mods")
    ws = tmp_path / "ws"
    ws.mkdir()
    out = run_sh(mod, site, tmp_path, env_extra={"WORKSPACE_DIR": str(ws)})
    assert out.returncode == 0 and (ws / "t.jinja").read_text() == "{{ messages }}"
    assert "--chat-template t.jinja" in out.stdout
    again = run_sh(mod, site, tmp_path, env_extra={"WORKSPACE_DIR": str(ws)})
    assert "already installed" in again.stdout


def test_missing_vllm_is_a_clear_error(tmp_path):
    mod = make_mod(tmp_path / "mods")
    out = run_sh(mod, tmp_path / "nowhere", tmp_path)
    assert out.returncode == 2 and "vllm is not installed in PYTHON_ROOT=" in out.stdout


def test_sync_check_detects_drift(tmp_path, capsys):
    mod = make_mod(tmp_path / "mods")
    assert stale_files(mod) == []
    edit_runtime(mod, "engine", lambda text: text + "# edited by hand\n")
    (mod / "run.sh").chmod(0o644)
    problems = stale_files(mod)
    assert "_sparkmods.py differs from what sparkmods sync generates" in problems
    assert "run.sh is not executable" in problems
    assert main(["sync", "--check", "--mods-dir", str(tmp_path / "mods")]) == 1
    assert main(["sync", "--mods-dir", str(tmp_path / "mods")]) == 0
    assert stale_files(mod) == []


def test_committed_mods_are_in_sync():
    repo_mods = Path(__file__).resolve().parents[1] / "mods"
    for mod in sorted(p.parent for p in repo_mods.glob("*/mod.toml")):
        assert stale_files(mod) == [], f"{mod.name}: run `sparkmods sync {mod.name}`"


def test_runtime_is_stdlib_only_and_python39_syntax():
    runtime = Path(__file__).resolve().parents[1] / "tools" / "sparkmods" / "runtime"
    allowed = set(sys.stdlib_module_names)
    import ast
    for path in runtime.glob("*.py"):
        tree = ast.parse(path.read_text(), feature_version=(3, 9))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                # tomli: the host's TOML reader on 3.10
                assert top in allowed or top == "tomli", f"{path.name} imports {name}"
