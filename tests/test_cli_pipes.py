"""A reader that leaves early (`sparkmods check | head -2`) is not an error: no BrokenPipeError
traceback, and the exit code is the one the command would have returned with every line read.

Real processes and real pipes: the read end is closed before the command writes a byte, so every
write meets a closed pipe, whatever the timing; and the documented `| head -2` runs under bash.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path
from typing import List

import pytest

from clirun import SPARKMODS
from modfactory import make_mod, make_site

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def world(tmp_path: Path) -> dict:
    mods = tmp_path / "mods"
    for name in ("alpha", "beta", "gamma"):
        make_mod(mods, name)
    good, bad = make_site(tmp_path / "good", "0.19.1"), make_site(tmp_path / "bad", "0.22.0")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(textwrap.dedent('''\
        recipe_version: "1"
        name: Pipe test
        container: pipe-test-image-not-pulled
        mods: [mods/alpha]
        command: vllm serve /models/m --no-enable-prefix-caching
        '''))
    return {"mods": mods, "good": f"dir:{good}", "bad": f"dir:{bad}", "recipe": recipe}


def into_closed_pipe(args: List[str]) -> "tuple[int, str]":
    """(exit code, stderr) of sparkmods ARGS whose stdout pipe has no reader from the start."""
    proc = subprocess.Popen([str(SPARKMODS), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=60), err


@pytest.mark.parametrize("fmt", [[], ["--json"]])
@pytest.mark.parametrize("target, code", [("good", 0), ("bad", 1)])
def test_check_into_a_closed_pipe_keeps_its_exit_code(world, fmt, target, code):
    got, err = into_closed_pipe(["check", "--mods-dir", str(world["mods"]), "--vllm", world[target], *fmt])
    assert (got, err) == (code, "")


def test_launch_json_into_a_closed_pipe(world):
    got, err = into_closed_pipe(["launch", str(world["recipe"]), "--solo", "--vllm", world["good"], "--json",
                                 "--launch-cluster", str(FIXTURES / "launch-cluster.sh")])
    assert (got, err) == (0, "")


def test_head_two_as_documented(world):
    command = f"{SPARKMODS} check --mods-dir {world['mods']} --vllm {world['bad']} | head -2"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # a pipe: one line per row
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=60,
                          env=env)
    assert done.returncode == 1 and done.stderr == ""  # 1: the mods do not apply to 0.22.0
    header, first = done.stdout.splitlines()
    assert header.split() == ["mod", "vllm", "target", "variant", "status", "detail"]
    assert first.split()[:5] == ["alpha", "0.22.0", world["bad"], "-", "no-variant"]
