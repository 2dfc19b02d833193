"""`sparkmods launch --vllm-pr FILE`: a PR diff the launcher applies beside the recipe's mods; and a
recipe whose env names SPARKMODS_VLLM_BASE, the release run.sh then picks variants by.

The demo mod changes vllm/model_executor/layers/demo.py. A PR that changes another file is no
problem; one that changes the same file away from the mod's lines is a warning (the mod still
applies after it); one that changes the lines the mod needs is an error, and no script is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

from launchrepo import RECIPE, Repo, launch
from modfactory import ORIGINAL, TARGET, unified
from sparkmods.gitdiff import blob_id
from sparkmods.launch.plan import LaunchOptions, build_plan
from sparkmods.launch.recipe import load_recipe
from sparkmods.launch.rules import validate
from sparkmods.launch.vllmopen import check_with_engine


def _git_diff(path: str, old: str, new: str) -> str:
    """A diff as `git diff` writes it for one changed file."""
    ids = f"{blob_id(old.encode())[:9]}..{blob_id(new.encode())[:9]}"
    return f"diff --git a/{path} b/{path}\nindex {ids} 100644\n" + unified(path, old, new)


def _pr(tmp_path: Path, name: str, old: str, new: str, path: str = TARGET) -> Path:
    diff = tmp_path / name
    diff.write_text(_git_diff(path, old, new) + _git_diff("tests/test_demo.py", "a\n", "b\n"))
    return diff


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path / "recipe repo")


def _problems(repo: Repo, prs: List[Path]) -> List[str]:
    plan = build_plan(load_recipe(repo.recipe), LaunchOptions(vllm_prs=tuple(prs)))
    return [f"{p.severity}: {p.message}" for p in validate(plan, repo.facts(), check_with_engine).problems
            if p.rule == "vllm-pr"]


def test_a_pr_diff_beside_the_mods(repo: Repo, tmp_path: Path, capsys) -> None:
    elsewhere = _pr(tmp_path, "elsewhere.diff", "x = 1\n", "x = 2\n", "vllm/other.py")
    (repo.site / "vllm/other.py").write_text("x = 1\n")
    assert _problems(repo, [elsewhere]) == []
    apart = _pr(tmp_path, "apart.diff", ORIGINAL, ORIGINAL.replace("import torch\n", "import torch  # pr\n"))
    assert _problems(repo, [apart]) == [
        f"warning: mod demo and apart.diff both change {TARGET}: the mod still applies after the PR (variant v1), "
        "so pass --apply-vllm-pr before --apply-mod"]
    clash = _pr(tmp_path, "clash.diff", ORIGINAL, ORIGINAL.replace("y = x * 2", "y = x * 3"))
    [line] = _problems(repo, [clash])
    assert line.startswith(f"error: mod demo and clash.diff both change {TARGET}: after the PR the mod is conflict on ")
    out = tmp_path / "launch.sh"
    assert launch(repo, "--solo", "--vllm-pr", str(clash), out=out) == 1
    assert not out.exists()
    assert f"clash.diff both change {TARGET}" in capsys.readouterr().err
    assert launch(repo, "--solo", "--vllm-pr", str(apart), out=out) == 0 and out.exists()


def test_a_pr_diff_that_does_not_apply_or_does_not_parse(repo: Repo, tmp_path: Path, capsys) -> None:
    stale = _pr(tmp_path, "stale.diff", ORIGINAL.replace("import torch", "import numpy"), ORIGINAL)
    [line] = _problems(repo, [stale])
    assert line.startswith(f"error: mod demo and stale.diff both change {TARGET}, and stale.diff does not apply to ")
    broken = tmp_path / "broken.diff"
    broken.write_text("diff --git a/vllm/x.py b/vllm/x.py\nindex zzz\n")
    assert launch(repo, "--solo", "--vllm-pr", str(broken)) == 2
    assert "broken.diff: line 2: bad index line" in capsys.readouterr().err


@pytest.mark.parametrize("base, refused", [("0.21.0", False), ("0.17.0", True)])
def test_a_recipe_naming_the_vllm_base(tmp_path: Path, base: str, refused: bool) -> None:
    repo = Repo(tmp_path / "recipe repo", RECIPE.replace("DEMO_MODE: fast", f'SPARKMODS_VLLM_BASE: "{base}"'))
    plan = build_plan(load_recipe(repo.recipe), LaunchOptions())
    found = [f"{p.severity}: {p.message}" for p in validate(plan, repo.facts(), check_with_engine).problems
             if p.rule == "vllm-base"]
    if not refused:
        assert found == []
        return
    where = f"vLLM 0.21.0 ({repo.target})"
    assert found == [f"error: mod demo on {where}: SPARKMODS_VLLM_BASE=0.17.0: no variant covers vLLM 0.17.0; "
                     "variants: v1 (>=0.18.0; verified on 0.21.0); vLLM reports 0.21.0",
                     f"error: mod template on {where}: SPARKMODS_VLLM_BASE=0.17.0: no variant covers vLLM 0.17.0; "
                     "variants: any (>=0.18.0; verified on 0.21.0); vLLM reports 0.21.0"]
