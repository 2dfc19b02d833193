"""run.sh on a tree the mod is already on answers from the stamp (runtime/stamp.py) without
the full decision (applier.py), prints exactly what the full path prints, and takes the full path the
moment any input of that decision differs or an interrupted run left something behind."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Tuple

import pytest

from modfactory import TARGET, edit_runtime, make_site, make_template_mod
from sparkmods.runtime import engine, journal, lock, stamp

FULL = {"SPARKMODS_LOCK_TIMEOUT": "120"}  # a setting only the full path reads: forces it


def run(mod: Path, site: Path, ws: Path, *args: str, env: Optional[Dict[str, str]] = None) -> Tuple[int, str, bool]:
    """(exit code, stdout, whether the full decision ran) of one run.sh."""
    full = {"PATH": os.environ["PATH"], "PYTHON_ROOT": str(site), "SPARKMODS_PYTHON": sys.executable,
            "WORKSPACE_DIR": str(ws), "SPARKMODS_CACHE_DIR": str(ws.parent / "cache"), "PYTHONPROFILEIMPORTTIME": "1"}
    full.update(env or {})
    out = subprocess.run(["bash", str(mod / "run.sh"), *args], cwd=ws, env=full, text=True, capture_output=True,
                         timeout=120)
    return out.returncode, out.stdout, "_sparkmods.applier" in out.stderr


@pytest.fixture
def applied(tmp_path: Path) -> Tuple[Path, Path, Path]:
    """A demo mod with a workspace install and notes, applied by run.sh."""
    site = make_site(tmp_path / "site")
    mod = make_template_mod(tmp_path / "mods")
    ws = tmp_path / "ws"
    ws.mkdir()
    rc, out, _ = run(mod, site, ws)
    assert rc == 0 and "applied variant" in out, out
    assert (site / journal.STATE_DIR / "tmpl" / stamp.STAMP_NAME).is_file()
    return mod, site, ws


def test_every_setting_of_the_full_path_sends_a_run_there() -> None:
    assert set(stamp._FULL_PATH_ENV) >= {lock.LOCK_TIMEOUT, "SPARKMODS_FAULT_AFTER", "SPARKMODS_FAULT_SIGNAL"}


@pytest.mark.parametrize("args", [(), ("apply",), ("check",), ("--dry-run",), ("apply", "--dry-run")])
def test_applied_tree_answers_without_the_full_decision_and_says_the_same(applied, args) -> None:
    mod, site, ws = applied
    quick = run(mod, site, ws, *args)
    full = run(mod, site, ws, *args, env=FULL)
    assert quick[0] == full[0] == 0
    assert quick[1] == full[1] and "already applied (variant v1) to vLLM 0.19.1" in quick[1], quick[1]
    assert "t.jinja already installed in" in quick[1] and "--chat-template t.jinja" in quick[1]
    assert not quick[2] and full[2]  # the stamp answered; the forced run decided


def test_revert_and_other_arguments_take_the_full_path(applied) -> None:
    mod, site, ws = applied
    assert run(mod, site, ws, "--help")[2]
    assert run(mod, site, ws, "apply", "--site", str(site))[2]
    rc, out, full_used = run(mod, site, ws, "revert")
    assert rc == 0 and "reverted" in out and full_used
    assert not (site / journal.STATE_DIR / "tmpl").exists()


@pytest.mark.parametrize("change", ["vllm file", "patch", "runtime", "workspace file", "version", "temp", "journal"])
def test_any_changed_input_or_leftover_takes_the_full_path(applied, change: str) -> None:
    mod, site, ws = applied
    if change == "vllm file":
        (site / TARGET).write_text((site / TARGET).read_text() + "# edited\n")
    elif change == "patch":
        patch = next((mod / "patches").rglob("*.patch"))
        patch.write_text(patch.read_text() + "\n")
    elif change == "runtime":
        edit_runtime(mod, "udiff", lambda text: text + "\n# edited\n")
    elif change == "workspace file":
        (ws / "t.jinja").write_text("other")
    elif change == "version":
        meta = next(site.glob("vllm-*.dist-info")) / "METADATA"
        meta.write_text(meta.read_text().replace("0.19.1", "0.19.2"))
    elif change == "temp":
        (site / TARGET).with_name(f".x.py{engine.TMP_SUFFIX}").write_text("left by a killed run")
    else:
        (site / journal.STATE_DIR / journal.JOURNAL_NAME).write_text("{not json")
    rc, out, full_used = run(mod, site, ws)
    assert full_used, out
    full = run(mod, site, ws, env=FULL)  # the full path's own answer, for the record
    if change in ("runtime", "patch", "version", "workspace file", "temp"):
        assert rc == 0 and full[0] == 0
    if change == "temp":
        assert not list(site.rglob(f"*{engine.TMP_SUFFIX}"))  # the full path swept it
    if change == "journal":
        assert rc != 0 and "journal" in out


def test_a_held_lock_is_waited_for_not_answered_around(applied) -> None:
    mod, site, ws = applied
    fd = os.open(site / journal.STATE_DIR / lock.LOCK_NAME, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    env = {"PATH": os.environ["PATH"], "PYTHON_ROOT": str(site), "SPARKMODS_PYTHON": sys.executable,
           "WORKSPACE_DIR": str(ws)}
    proc = subprocess.Popen(["bash", str(mod / "run.sh")], cwd=ws, env=env, text=True, stdout=subprocess.PIPE)
    try:
        first = proc.stdout.readline()
    finally:
        os.close(fd)
    rest, _ = proc.communicate(timeout=120)
    assert "waiting for another sparkmods run" in first
    assert proc.returncode == 0 and "already applied" in rest


def test_a_damaged_stamp_only_costs_the_full_path(applied) -> None:
    mod, site, ws = applied
    path = site / journal.STATE_DIR / "tmpl" / stamp.STAMP_NAME
    path.write_bytes(path.read_bytes()[:40])
    rc, out, full_used = run(mod, site, ws)
    assert rc == 0 and "already applied" in out and full_used
    rc, out, full_used = run(mod, site, ws)  # the full path wrote it again
    assert rc == 0 and "already applied" in out and not full_used
