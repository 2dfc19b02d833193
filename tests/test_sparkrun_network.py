"""This repository as a sparkrun registry, with the real sparkrun from PyPI (issue 13, item 2).

sparkrun (tests/sparkrunenv.py: the release from PyPI in a cached environment) adds a git
repository holding this working tree's .sparkrun/, launch/ and mods/ exactly as a user adds ours
(`sparkrun registry add`), lists the recipes, validates each with --strict (warnings fail), and
plans each launch with --dry-run: the plan must copy and run every mod of the recipe from the
registry's mods/ folder, the way `--apply-mod` does, and serve the command `sparkmods launch`
would (the model folder under sparkrun's HF_HOME). Nothing runs a container; sparkrun's own
configuration lives in a temporary HOME; the model hub is not asked (HF_HUB_OFFLINE).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest
import yaml

from sparkmods.launch.plan import LaunchOptions, build_plan
from sparkmods.launch.recipe import load_recipe
from sparkmods.launch.sparkrun import HF_MOUNT
from sparkrunenv import SPARKRUN_VERSION, sparkrun_env

pytestmark = pytest.mark.network

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted((REPO / "launch" / "recipes").glob("*.yaml"))
REGISTRY = yaml.safe_load((REPO / ".sparkrun" / "registry.yaml").read_text())["registries"][0]["name"]


class Sparkrun:
    def __init__(self, exe: Path, home: Path) -> None:
        self.exe, self.home = exe, home

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "HOME": str(self.home), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1",
               "XDG_CONFIG_HOME": str(self.home / ".config"), "XDG_CACHE_HOME": str(self.home / ".cache")}
        return subprocess.run([str(self.exe), *args], env=env, capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def sparkrun(tmp_path_factory) -> Sparkrun:
    exe = sparkrun_env()
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True).stdout
    assert SPARKRUN_VERSION in version
    # The registry as users get it: a git repository with what this working tree holds.
    repo = tmp_path_factory.mktemp("registry") / "spark-vllm-mods"
    repo.mkdir()
    for part in (".sparkrun", "launch", "mods"):
        shutil.copytree(REPO / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-C", str(repo), "-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "registry"]):
        subprocess.run(git + step, check=True, capture_output=True)
    run = Sparkrun(exe, tmp_path_factory.mktemp("home"))
    added = run("registry", "add", "--trust", f"file://{repo}")
    assert added.returncode == 0 and "Added 1 registry" in added.stdout, added.stdout + added.stderr
    return run


def test_the_registry_lists_every_recipe(sparkrun):
    done = sparkrun("recipe", "list", "--registry", REGISTRY, "--json")
    assert done.returncode == 0, done.stderr
    listed = {entry["file"]: entry for entry in json.loads(done.stdout)}
    assert sorted(listed) == sorted(p.stem for p in SOURCES)
    for entry in listed.values():
        assert entry["builder"] == "eugr" and entry["runtime"].startswith("vllm") and entry["tp"] == 1


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_each_recipe_validates_strictly_without_warnings(sparkrun, source):
    done = sparkrun("recipe", "validate", f"@{REGISTRY}/{source.stem}", "--strict", "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["errors"] == 0 and report["warnings"] == 0, report["issues"]


def _serve_command(output: str) -> List[str]:
    """The argv of the "Serve command:" block sparkrun's dry run prints."""
    block = output.split("Serve command:", 1)[1].split("\n\n", 1)[0]
    return shlex.split(block.replace("\\\n", " "))


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_a_planned_launch_applies_our_mods_and_serves_our_command(sparkrun, source):
    done = sparkrun("-v", "run", f"@{REGISTRY}/{source.stem}", "--hosts", "127.0.0.1", "--dry-run",
                    "--no-auto-detect")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    recipe = load_recipe(source)
    names = [Path(m).name for m in recipe.mods]
    assert f"Resolved {len(names)} mod(s) into pre_exec entries" in out
    copies = re.findall(r"pre_exec\[\d+\] copy (\S+) -> \S+:/workspace/mods/(\S+) on", out)
    assert [(Path(src).parent.name, Path(src).name, dest) for src, dest in copies] == \
        [("mods", n, n) for n in names]
    for name in names:
        assert f"cd /workspace/mods/{name} && chmod +x run.sh && ./run.sh" in out
    ours = build_plan(recipe, LaunchOptions()).serve.argv()
    theirs = [word.replace("$HF_HOME", HF_MOUNT) for word in _serve_command(out)]
    assert theirs == ours
