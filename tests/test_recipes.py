"""The shipped recipes (launch/recipes/) and the recipe schema check.

The recipes must stay runnable by run-recipe.sh and sparkrun as they are, so besides our own
schema check we fill each command exactly as run-recipe.sh does (str.format over the defaults,
then bash word splitting) and compare with what `sparkmods launch` would run.
"""

from __future__ import annotations

import copy
import json
import shlex
import shutil
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from sparkmods.cli import main
from sparkmods.launch.plan import LaunchOptions, build_plan
from sparkmods.launch.recipe import RecipeError, format_value, load_recipe
from sparkmods.launch.servecmd import ServeCommand

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "launch" / "recipes").glob("*.yaml"))
BIG = "qwen3.5-122b-a10b"


def recipe(stem: str) -> Path:
    return REPO / "launch" / "recipes" / f"{stem}.yaml"


def serve(stem: str) -> ServeCommand:
    """The recipe's command filled with its defaults (no mods needed: this is about the text)."""
    loaded = load_recipe(recipe(stem))
    return ServeCommand.parse(loaded.command, {k: format_value(v) for k, v in loaded.defaults})


def raw(stem: str) -> Dict:
    return yaml.safe_load(recipe(stem).read_text())


def test_the_stacks_are_all_there():
    assert sorted(p.stem for p in RECIPES) == sorted([
        f"{BIG}-int4-autoround", f"{BIG}-hybrid-int4-fp8", f"{BIG}-hybrid-mtp1", f"{BIG}-hybrid-mtp2",
        f"{BIG}-hybrid-mtp2-int8-lmhead", f"{BIG}-turboquant", "qwen3.5-35b-a3b-int4-autoround"])


def test_recipe_check_passes_on_every_shipped_recipe(capsys):
    code = main(["recipe", "check", *map(str, RECIPES)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.strip().endswith(f"{len(RECIPES)} recipes checked, {len(RECIPES)} ok, 0 with errors")


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_run_recipe_sh_would_run_the_same_command(path):
    """run-recipe.sh: command.format(**defaults), written into a bash script: bash splits it."""
    data = yaml.safe_load(path.read_text())
    pasted = data["command"].format(**data["defaults"]).replace("\\\n", " ")
    assert shlex.split(pasted) == serve(path.stem).argv()


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_keeps_prefix_caching_off_and_uses_the_chat_template(path):
    data = raw(path.stem)
    cmd = serve(path.stem)
    assert cmd.names().count("--no-enable-prefix-caching") == 1 and not cmd.has("--enable-prefix-caching")
    assert "mods/chat-template" in data["mods"] and cmd.get("--chat-template") == "qwen3.5-sparkmods.jinja"
    assert cmd.get("--reasoning-parser") == "qwen3" and cmd.get("--tool-call-parser") == "qwen3_coder"
    assert data["recipe_version"] == "1" and data["model"].startswith("Intel/Qwen3.5-")


def test_each_step_adds_to_the_previous_one():
    steps = ["int4-autoround", "hybrid-int4-fp8", "hybrid-mtp1", "hybrid-mtp2", "hybrid-mtp2-int8-lmhead", "turboquant"]
    mods = [set(raw(f"{BIG}-{s}")["mods"]) for s in steps]
    assert mods[0] == {"mods/chat-template"}
    assert mods[1] == mods[0] | {"mods/hybrid-int4-fp8"}
    assert mods[2] == mods[3] == mods[1] | {"mods/mtp-weights"}
    assert mods[4] == mods[3] | {"mods/int8-lm-head"}
    assert mods[5] == mods[4] | {"mods/turboquant"}
    # the int8-lm-head mod's on/off switch is spelled out where the mod is used, and only there
    assert [raw(f"{BIG}-{s}").get("env") for s in steps] == [None] * 4 + [{"SPARKMODS_INT8_LM_HEAD": "1"}] * 2
    assert serve(f"{BIG}-int4-autoround").model == "Intel/Qwen3.5-122B-A10B-int4-AutoRound"
    for step in steps[1:]:
        assert "hybrid-int4-fp8" in serve(f"{BIG}-{step}").model


@pytest.mark.parametrize("stem, tokens", [(f"{BIG}-hybrid-mtp1", 1), (f"{BIG}-hybrid-mtp2", 2),
                                          (f"{BIG}-hybrid-mtp2-int8-lmhead", 2), (f"{BIG}-turboquant", 2)])
def test_mtp_recipes_pass_valid_json_with_the_token_count(stem, tokens):
    config = json.loads(serve(stem).get("--speculative-config"))
    assert config == {"method": "mtp", "num_speculative_tokens": tokens}


def test_turboquant_uses_vllms_own_cache_dtype_without_flashinfer():
    cmd = serve(f"{BIG}-turboquant")
    assert cmd.get("--kv-cache-dtype") == "turboquant_k3v4_nc"
    assert cmd.get("--attention-backend") is None
    assert all(serve(f"{BIG}-{s}").get("--attention-backend") == "FLASHINFER"
               for s in ("int4-autoround", "hybrid-int4-fp8", "hybrid-mtp2"))


def test_two_nodes_set_tensor_parallel_2():
    path = recipe(f"{BIG}-hybrid-mtp2")
    two = build_plan(load_recipe(path), LaunchOptions(nodes=("10.0.0.1", "10.0.0.2")))
    assert two.serve.get("--tensor-parallel-size") == "2"
    assert build_plan(load_recipe(path), LaunchOptions()).serve.get("--tensor-parallel-size") == "1"


# --- the schema check -------------------------------------------------------------------------

GOOD = {
    "recipe_version": "1", "name": "x", "container": "img", "mods": ["mods/m"],
    "defaults": {"port": 8000, "flag": True},
    "command": "vllm serve model --port {port} --trust-remote-code={flag}\n",
}


def write(tmp_path: Path, data: Dict) -> Path:
    (tmp_path / "mods" / "m").mkdir(parents=True, exist_ok=True)
    (tmp_path / "mods" / "m" / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "recipes").mkdir(exist_ok=True)
    path = tmp_path / "recipes" / "r.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def changed(**edits) -> Dict:
    data = copy.deepcopy(GOOD)
    for key, value in edits.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    return data


def test_good_recipe_loads_and_fills_booleans_the_vllm_way(tmp_path):
    path = write(tmp_path, GOOD)
    plan = build_plan(load_recipe(path), LaunchOptions())
    assert plan.serve.argv() == ["vllm", "serve", "model", "--port", "8000", "--trust-remote-code=true"]
    assert plan.mod_dirs == [(tmp_path / "mods" / "m").resolve()]


@pytest.mark.parametrize("data, fragment", [
    (changed(name=None), "name: missing (required)"),
    (changed(recipe_version=1), 'recipe_version: must be the string "1"'),
    (changed(colour="red"), "colour: unknown key"),
    (changed(mods=["../outside"]), "mods[0]: '../outside' must be relative to the recipe repository root"),
    (changed(mods="mods/m"), "mods: must be a list"),
    (changed(env={"A B": "x"}), "env.A B: keys must be identifiers"),
    (changed(defaults={"port": [1]}), "defaults.port: must be a string, number or boolean"),
    (changed(command="vllm serve m --port {port} --x {missing}"), "placeholder {missing} has no value in defaults"),
    (changed(command="vllm serve m --sc '{\"method\": \"mtp\"}'"), "write literal braces as {{ and }}"),
    (changed(cluster_only=True, solo_only=True), "cannot both be true"),
    (changed(cluster_only="yes"), "cluster_only: must be true or false"),
])
def test_schema_errors_are_one_line_naming_file_and_key(tmp_path, data, fragment):
    path = write(tmp_path, data)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and fragment in message and "\n" not in message


def test_unknown_mod_and_bad_yaml(tmp_path):
    path = write(tmp_path, changed(mods=["mods/missing"]))
    with pytest.raises(RecipeError, match=r"mods\[0\]: 'mods/missing' is not a mod folder"):
        build_plan(load_recipe(path), LaunchOptions())
    path.write_text("name: [unclosed\n")
    with pytest.raises(RecipeError, match=r"\(syntax\): not valid YAML at line"):
        load_recipe(path)


def test_recipe_check_cli_reports_each_bad_recipe_and_exits_1(tmp_path, capsys):
    good = write(tmp_path, GOOD)
    bad = tmp_path / "recipes" / "bad.yaml"
    bad.write_text(yaml.safe_dump(changed(command="vllm serve Qwen3.5-x --enable-prefix-caching")))
    assert main(["recipe", "check", str(good), str(bad)]) == 1
    lines: List[str] = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith(f"{bad}: error: prefix-caching: ")
    assert lines[-1] == "2 recipes checked, 1 ok, 1 with errors"


# --- the sparkrun twins (launch/sparkrun/, generated) ------------------------------------------

def test_the_sparkrun_twins_are_up_to_date(capsys):
    assert main(["recipe", "sparkrun", "--check"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_a_twin_fills_to_the_command_run_recipe_sh_fills(path):
    """sparkrun's placeholders are plain `{name}` in an otherwise literal text; run-recipe.sh's
    are str.format's. Filled with the same values, both must give the same text."""
    from sparkmods.launch.sparkrun import HF_MOUNT

    v1 = yaml.safe_load(path.read_text())
    twin = yaml.safe_load((REPO / "launch" / "sparkrun" / path.name).read_text())
    assert twin["recipe_version"] == "2" and "name" not in twin and "{{" not in twin["command"]
    assert (twin["runtime"], twin["builder"], twin["mods"]) == ("vllm", "eugr", v1["mods"])
    assert twin["defaults"]["tensor_parallel"] == 1 and v1["defaults"]["tensor_parallel"] == 2
    filled = twin["command"]
    for key, value in twin["defaults"].items():
        filled = filled.replace(f"{{{key}}}", str(value).replace("$HF_HOME", HF_MOUNT))
    assert filled == v1["command"].format(**{**v1["defaults"], "tensor_parallel": 1})


def test_a_stale_or_orphan_twin_is_reported_then_rewritten(tmp_path, monkeypatch, capsys):
    shutil.copytree(REPO / "launch", tmp_path / "launch")
    monkeypatch.chdir(tmp_path)
    twin = tmp_path / "launch" / "sparkrun" / RECIPES[0].name
    twin.write_text(twin.read_text().replace("tensor_parallel: 1", "tensor_parallel: 4"))
    orphan = tmp_path / "launch" / "sparkrun" / "gone.yaml"
    orphan.write_text("model: x\n")
    assert main(["recipe", "sparkrun", "--check"]) == 1
    out = capsys.readouterr().out
    assert f"{twin}: stale" in out and f"{orphan}: no recipe gone.yaml" in out
    assert main(["recipe", "sparkrun"]) == 0 and not orphan.exists()
    assert twin.read_text() == (REPO / "launch" / "sparkrun" / RECIPES[0].name).read_text()
    assert main(["recipe", "sparkrun", "--check"]) == 0


def test_two_nodes_as_run_recipe_sh_is_typed_use_both_and_solo_uses_one():
    """run-recipe.sh -n A,B takes tensor_parallel from the defaults; --solo forces 1."""
    for path in RECIPES:
        data = yaml.safe_load(path.read_text())
        two = shlex.split(data["command"].format(**data["defaults"]).replace("\\\n", " "))
        solo = shlex.split(data["command"].format(**{**data["defaults"], "tensor_parallel": 1}).replace("\\\n", " "))
        assert two[two.index("--tensor-parallel-size") + 1] == "2", path.name
        assert solo[solo.index("--tensor-parallel-size") + 1] == "1", path.name
