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
import re
from pathlib import Path

import pytest

from sparkmods.launch.plan import LaunchOptions, build_plan
from sparkmods.launch.recipe import load_recipe
from sparkmods.launch.sparkrun import HF_MOUNT
from sparkrunenv import SOURCES, registry, serve_command

pytestmark = pytest.mark.network


def test_the_registry_lists_every_recipe(sparkrun):
    done = sparkrun("recipe", "list", "--registry", registry(), "--json")
    assert done.returncode == 0, done.stderr
    listed = {entry["file"]: entry for entry in json.loads(done.stdout)}
    assert sorted(listed) == sorted(p.stem for p in SOURCES)
    for entry in listed.values():
        assert entry["builder"] == "eugr" and entry["runtime"].startswith("vllm") and entry["tp"] == 1


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_each_recipe_validates_strictly_without_warnings(sparkrun, source):
    done = sparkrun("recipe", "validate", f"@{registry()}/{source.stem}", "--strict", "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["errors"] == 0 and report["warnings"] == 0, report["issues"]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_a_planned_launch_applies_our_mods_and_serves_our_command(sparkrun, source):
    done = sparkrun("-v", "run", f"@{registry()}/{source.stem}", "--hosts", "127.0.0.1", "--dry-run",
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
    theirs = [word.replace("$HF_HOME", HF_MOUNT) for word in serve_command(out)]
    assert theirs == ours
