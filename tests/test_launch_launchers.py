"""The launch-cluster.sh form against every launcher version in use (issue 13, item 1).

The generated script reads what the launcher offers from its --help when it runs, so one script
works with each version, or stops before starting anything. The launchers are the stand-ins in
tests/fixtures (launch-cluster-standin.bash: the real tool's grammar, usage text and refusals,
one file per version); the script itself runs for real, under bash, as a user would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

from launchrepo import FIXTURES, RECIPE, Repo, calls, launch, run_script

NODES = "10.0.0.1,10.0.0.2"
NEW = FIXTURES / "launch-cluster.sh"
MAY_2026 = FIXTURES / "launch-cluster-may2026.sh"
NORAY_ONLY = FIXTURES / "launch-cluster-noray-only.sh"
# Only the mode matters here: a recipe without MTP, so --no-ray is allowed across nodes.
PLAIN = "--speculative-config '{{\"method\": \"mtp\", \"num_speculative_tokens\": 2}}'"


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path / "recipe repo", RECIPE.replace(PLAIN, "--max-num-seqs 8"))


def script_for(repo: Repo, tmp_path: Path, *choice: str) -> Path:
    out = tmp_path / f"launch{'-'.join(choice)}.sh"
    assert launch(repo, *choice, out=out) == 0
    return out


def run_with(script: Path, launcher: Path, record: Path) -> subprocess.CompletedProcess:
    return run_script(script, record, {"SPARKMODS_LAUNCH_CLUSTER": str(launcher)})


def started(record: Path) -> List[Dict[str, object]]:
    return calls(record) if record.exists() else []


# (launcher, --ray/--no-ray choice) -> (backend flag passed, mode the launcher then runs)
RUNS = [
    (NEW, "--ray", "--ray", "ray"),
    (NEW, "--no-ray", "--no-ray", "no-ray"),
    (MAY_2026, "--ray", None, "ray"),
    (NORAY_ONLY, "--ray", None, "ray"),
    (NORAY_ONLY, "--no-ray", "--no-ray", "no-ray"),
]


@pytest.mark.parametrize("launcher,choice,flag,mode", RUNS, ids=[f"{r[0].stem}{r[1]}" for r in RUNS])
def test_the_script_passes_what_the_launcher_offers_and_gets_the_mode_asked_for(
        repo, tmp_path, launcher, choice, flag, mode):
    script = script_for(repo, tmp_path, "--nodes", NODES, choice)
    record = tmp_path / "record"
    done = run_with(script, launcher, record)
    assert done.returncode == 0, done.stderr
    stop, start = calls(record)
    for call in (stop, start):
        args = call["args"]
        assert args[:2] == ["-n", NODES]
        assert [a for a in args if a in ("--ray", "--no-ray")] == ([flag] if flag else [])
        assert args[args.index("--name") + 1] == "sparkmods-test"
    assert stop["args"][-1] == "stop"
    assert start["mode"] == mode
    assert start["script"] is not None and "--launch-script" in start["args"]


@pytest.mark.parametrize("launcher", [NEW, MAY_2026, NORAY_ONLY], ids=lambda p: p.stem)
def test_solo_works_with_every_launcher(repo, tmp_path, launcher):
    record = tmp_path / "record"
    done = run_with(script_for(repo, tmp_path, "--solo"), launcher, record)
    assert done.returncode == 0, done.stderr
    assert [c["mode"] for c in calls(record)] == ["solo", "solo"]


def test_no_ray_on_a_launcher_without_it_stops_before_starting_anything(repo, tmp_path):
    record = tmp_path / "record"
    done = run_with(script_for(repo, tmp_path, "--nodes", NODES, "--no-ray"), MAY_2026, record)
    assert done.returncode == 2
    assert started(record) == [], "the launcher was called for more than its --help"
    message = done.stderr.strip().splitlines()
    assert len(message) == 1 and str(MAY_2026) in message[0]
    assert "--no-ray" in message[0] and "git pull" in message[0] and "--ray" in message[0].split("or")[-1]
    assert not list(tmp_path.glob("sparkmods-serve.*"))


def test_a_launcher_too_old_for_launch_scripts_is_named_with_what_it_lacks(repo, tmp_path):
    # A version before --launch-script, --solo and -e existed: its usage lists none of them.
    old = tmp_path / "old launcher"
    old.mkdir()
    shutil.copy(FIXTURES / "launch-cluster-standin.bash", old)
    launcher = old / "launch-cluster.sh"
    launcher.write_text(MAY_2026.read_text().replace("standin_default=ray",
                                                     'standin_default=ray\nstandin_lacks="--launch-script --solo -e"'))
    launcher.chmod(0o755)
    record = tmp_path / "record"
    done = run_with(script_for(repo, tmp_path, "--solo"), launcher, record)
    assert done.returncode == 2 and started(record) == []
    assert "does not offer --launch-script -e --solo" in done.stderr


def test_the_launcher_is_asked_each_run_so_an_update_needs_no_new_script(repo, tmp_path):
    # Written once, run against the launcher of mid-May 2026, then against the one after `git pull`.
    script = script_for(repo, tmp_path, "--nodes", NODES, "--no-ray")
    launcher_dir = tmp_path / "spark-vllm-docker"
    launcher_dir.mkdir()
    shutil.copy(FIXTURES / "launch-cluster-standin.bash", launcher_dir)
    launcher = launcher_dir / "launch-cluster.sh"
    shutil.copy(MAY_2026, launcher)
    assert run_with(script, launcher, tmp_path / "before").returncode == 2
    shutil.copy(NEW, launcher)
    done = run_with(script, launcher, tmp_path / "after")
    assert done.returncode == 0, done.stderr
    assert calls(tmp_path / "after")[-1]["mode"] == "no-ray"


@pytest.mark.parametrize("launcher", [NEW, MAY_2026, NORAY_ONLY], ids=lambda p: p.stem)
def test_each_stand_in_refuses_what_its_version_refuses(tmp_path, launcher):
    env = {**os.environ, "LAUNCH_CLUSTER_RECORD": str(tmp_path / "r")}
    usage = subprocess.run([str(launcher), "--help"], env=env, capture_output=True, text=True)
    assert usage.returncode == 1 and "--apply-mod" in usage.stdout
    for flag in ("--ray", "--no-ray"):
        listed = f"  {flag} " in usage.stdout
        done = subprocess.run([str(launcher), "-n", NODES, flag, "-t", "x", "stop"], env=env,
                              capture_output=True, text=True)
        assert (done.returncode == 0) == listed, (flag, done.stderr)
        if not listed:
            assert f"Unknown argument or action: {flag}" in done.stderr
