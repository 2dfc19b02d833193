"""Overlapping runs on one vLLM take turns: every message is true when printed, the tree stays whole."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

import realtree
from modfactory import run_sh

MTP = next(m for m in realtree.repo_mods() if m.name == "mtp-weights")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return realtree.synthesized_site(tmp_path / "site", [MTP])


def hold_lock(site: Path) -> int:
    (site / ".sparkmods").mkdir(exist_ok=True)
    fd = os.open(site / ".sparkmods" / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def start(site: Path, cwd: Path, *args: str, timeout: str = "120") -> subprocess.Popen:
    env = {"PATH": os.environ["PATH"], "PYTHON_ROOT": str(site), "SPARKMODS_PYTHON": sys.executable,
           "SPARKMODS_LOCK_TIMEOUT": timeout}
    return subprocess.Popen(["bash", str(MTP / "run.sh"), *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_a_held_lock_times_out_with_a_clear_message(site: Path, tmp_path: Path) -> None:
    before = realtree.snapshot(site)
    fd = hold_lock(site)
    try:
        proc = start(site, tmp_path, timeout="0.5")
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(fd)
    assert proc.returncode == 1, out
    assert "waiting for another sparkmods run" in out and "has held" in out and "SPARKMODS_LOCK_TIMEOUT" in out
    assert realtree.snapshot(site) == before


def test_a_waiting_apply_decides_on_the_tree_it_finds_when_it_gets_the_lock(site: Path, tmp_path: Path) -> None:
    """While we hold the lock another run applies the mod; the waiting run then says so truly."""
    fd = hold_lock(site)
    try:
        waiting = start(site, tmp_path)
        time.sleep(1.0)
        assert waiting.poll() is None  # it waits
        os.close(fd)
        fd = -1
        first = run_sh(MTP, site, tmp_path)
    finally:
        if fd >= 0:
            os.close(fd)
    out, _ = waiting.communicate(timeout=60)
    assert first.returncode == 0 and waiting.returncode == 0, first.stdout + out
    said = [("applied variant" in first.stdout), ("applied variant" in out)]
    assert sorted(said) == [False, True], (first.stdout, out)  # exactly one applied, the other saw it
    assert "already applied" in (out if said[0] else first.stdout)


def test_interleaved_applies_and_reverts_serialize(site: Path, tmp_path: Path) -> None:
    """Eight overlapping runs, apply and revert alternating: the messages form one serial history."""
    pristine = realtree.snapshot(site)
    procs: List[subprocess.Popen] = [start(site, tmp_path, *(["revert"] if i % 2 else [])) for i in range(8)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    applied = sum(o.count("] applied variant") for o in outs)
    reverted = sum(o.count("] reverted") for o in outs)
    net = applied - reverted
    assert net in (0, 1), outs  # each apply found a pristine tree, each revert an applied one
    snap = realtree.snapshot(site)
    if net == 1:
        assert snap != pristine and realtree.strays(site, ["mtp-weights"]) == []
        assert run_sh(MTP, site, tmp_path, "revert").returncode == 0
    assert realtree.snapshot(site) == pristine and realtree.strays(site, []) == []


@pytest.mark.parametrize("module_left", [False, True])
def test_revert_after_vllm_was_reinstalled_under_the_mod(site: Path, tmp_path: Path, module_left: bool) -> None:
    """Reinstalled vLLM: the edited files are pristine again; the module the mod added may remain
    (pip removes only what its RECORD lists). Revert removes what is left and the stale state."""
    pristine = realtree.copy_tree(site, tmp_path / "pristine-copy")
    assert run_sh(MTP, site, tmp_path).returncode == 0
    for rel in realtree.snapshot(pristine):  # "pip install --force-reinstall vllm"
        (site / rel).write_bytes((pristine / rel).read_bytes())
    module = site / "vllm/model_executor/model_loader/sparkmods_mtp.py"
    if not module_left:
        module.unlink()
    out = run_sh(MTP, site, tmp_path, "revert")
    assert out.returncode == 0, out.stdout
    if module_left:
        assert "removed vllm/model_executor/model_loader/sparkmods_mtp.py" in out.stdout, out.stdout
    else:
        assert "nothing to revert: vLLM is pristine; removed the stale saved state" in out.stdout, out.stdout
    assert realtree.snapshot(site) == realtree.snapshot(pristine) and realtree.strays(site, []) == []
    assert "applied variant" in run_sh(MTP, site, tmp_path).stdout
