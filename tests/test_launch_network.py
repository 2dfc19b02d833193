"""Launch validation against real vLLM releases read from PyPI (range requests, cached).

What the rules learn from the target's own files must match what those releases really hold:
speculative method names, KV-cache dtypes (TurboQuant arrived in 0.20.0), and the 0.20.x refusal
of TurboQuant on hybrid models that 0.21.0 lifted. Then the shipped recipes go through the whole
`sparkmods launch` on the releases they are meant for.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparkmods.cli import main
from sparkmods.launch.vllmfacts import VllmFacts
from sparkmods.sources import open_targets

pytestmark = pytest.mark.network

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "launch" / "recipes"
STAND_IN = REPO / "tests" / "fixtures" / "launch-cluster.sh"


def facts(version: str) -> VllmFacts:
    found = VllmFacts(open_targets(f"pypi:{version}")[0])
    found.prefetch()
    return found


def test_speculative_methods_come_from_the_release_itself():
    old, new = facts("0.18.0").speculative_methods(), facts("0.33.0").speculative_methods()
    assert {"mtp", "qwen3_5_mtp", "qwen3_next_mtp", "ngram", "eagle3"} <= old & new
    assert "medusa" in old and "medusa" not in new  # dropped between the two: read, not guessed


def test_turboquant_cache_dtypes_and_the_hybrid_refusal_follow_the_release():
    before, first, lifted = facts("0.19.1"), facts("0.20.0"), facts("0.21.0")
    assert not any(d.startswith("turboquant_") for d in before.cache_dtypes())
    assert "turboquant_k3v4_nc" in first.cache_dtypes() and "turboquant_k3v4_nc" in lifted.cache_dtypes()
    assert first.refuses_turboquant_on_hybrid() and not lifted.refuses_turboquant_on_hybrid()


def test_only_025_and_026_shape_turboquant_layers_as_auto():
    """What the H100 showed (0.26.0 cannot start any TurboQuant cache), read from each release."""
    assert [facts(v).shapes_turboquant_as_auto() for v in ("0.24.0", "0.25.0", "0.26.0", "0.27.0", "0.29.0")] == [
        False, True, True, False, False]


def launch(recipe: Path, version: str, *args: str) -> int:
    return main(["launch", str(recipe), "--vllm", version, "--launch-cluster", str(STAND_IN),
                 "--image", "sparkmods-no-such-image:0", *args])


def flags_only(tmp_path: Path, stem: str) -> Path:
    """The shipped recipe's command and env with only the chat-template mod: the flag rules alone."""
    data = yaml.safe_load((RECIPES / f"{stem}.yaml").read_text())
    data["mods"] = ["mods/chat-template"]
    (tmp_path / "mods").symlink_to(REPO / "mods")
    path = tmp_path / f"{stem}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_turboquant_recipe_is_refused_before_021(capsys, tmp_path):
    recipe = flags_only(tmp_path, "qwen3.5-122b-a10b-turboquant")
    assert launch(recipe, "0.20.0", "--solo") == 1
    err = capsys.readouterr().err
    assert "kv-cache-dtype: vLLM 0.20.0" in err and "refuses TurboQuant KV caches on hybrid models" in err
    assert launch(recipe, "0.19.1", "--solo") == 1
    assert "has no KV-cache dtype 'turboquant_k3v4_nc'" in capsys.readouterr().err
    assert launch(recipe, "0.21.0", "--solo", "-o", str(tmp_path / "l.sh")) == 0
    assert launch(recipe, "0.26.0", "--solo") == 1
    assert "kv-cache-dtype: vLLM 0.26.0" in capsys.readouterr().err


def test_turboquant_recipe_with_its_mod_launches_on_026(capsys, tmp_path):
    shipped = RECIPES / "qwen3.5-122b-a10b-turboquant.yaml"
    assert launch(shipped, "0.26.0", "--solo", "-o", str(tmp_path / "l.sh")) == 0, capsys.readouterr().err


def test_mtp_recipe_across_two_nodes_needs_ray(capsys, tmp_path):
    recipe, out = flags_only(tmp_path, "qwen3.5-122b-a10b-hybrid-mtp2"), tmp_path / "l.sh"
    assert launch(recipe, "0.33.0", "--nodes", "10.0.0.1,10.0.0.2", "--no-ray") == 1
    assert "error: mtp-no-ray: " in capsys.readouterr().err
    assert launch(recipe, "0.33.0", "--nodes", "10.0.0.1,10.0.0.2", "-o", str(out)) == 0
    assert "--tensor-parallel-size 2" in out.read_text()


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES.glob("*.yaml")))
def test_every_shipped_recipe_launches_on_the_newest_release(recipe, tmp_path):
    assert launch(RECIPES / f"{recipe}.yaml", "0.33.0", "--solo", "-o", str(tmp_path / "l.sh")) == 0
