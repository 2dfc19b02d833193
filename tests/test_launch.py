"""`sparkmods launch`: serve-command parsing, validation rules, and the launch-cluster.sh form run
against a stand-in launcher that enforces the real tool's grammar and records what it was given.

Fast and offline: the target vLLM is a `dir:` tree with small config modules of the same shape as
vLLM's (the real files are read in test_launch_network.py), the mods are real synced mods.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import List, Sequence

import pytest

from launchrepo import FIXTURES, RECIPE, SPECULATIVE_PY, STAND_IN, VERSION, Repo, calls, launch, run_script
from modfactory import make_mod
from sparkmods.cli import main
from sparkmods.launch.plan import CLUSTER, STANDALONE, LaunchOptions, build_plan
from sparkmods.launch.recipe import load_recipe
from sparkmods.launch.rules import validate
from sparkmods.launch.servecmd import ServeCommand, ServeCommandError
from sparkmods.launch.vllmfacts import literal_alias
from sparkmods.launch.vllmopen import check_with_engine

SECRET = "hf_test_secret_value_123"

ARG_UTILS_OLD = 'raise NotImplementedError("TurboQuant KV cache is not supported for hybrid (attention + Mamba) models.")\n'


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path / "recipe repo")


def values(args: Sequence[str], flag: str) -> List[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


# --- the serve command ------------------------------------------------------------------------

def test_serve_command_parses_like_bash_and_renders_back_on_one_line():
    text = ('vllm serve "/models/my model" \\\n  --port 8000 -tp 2 \\\n'
            '  --speculative-config \'{"method": "mtp", "num_speculative_tokens": 1}\' \\\n'
            '  --max_model_len=4096 --seed -1 --enable-auto-tool-choice\n')
    cmd = ServeCommand.parse(text)
    assert cmd.model == "/models/my model"
    assert cmd.get("--tensor-parallel-size") == "2" and cmd.get("-tp") == "2"
    assert cmd.get("--max-model-len") == "4096" and cmd.get("--seed") == "-1"
    assert json.loads(cmd.get("--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 1}
    assert cmd.has("--enable-auto-tool-choice") and cmd.get("--enable-auto-tool-choice") is None
    line = cmd.line()
    assert "\n" not in line and shlex.split(line) == cmd.argv()
    cmd.set("--tensor-parallel-size", "1")
    assert cmd.get("-tp") == "1" and "-tp" not in cmd.args


@pytest.mark.parametrize("text, fragment", [
    ("vllm serve m; rm -rf /", "shell operator ';'"),
    ("vllm serve m && echo hi", "shell operator '&&'"),
    ("vllm serve m\n  --port 1", "line break without a trailing backslash"),
    ("vllm serve m --port $PORT", "shell expansions"),
    ("python -m vllm serve m", "must start with `vllm serve`"),
    ("vllm serve --port 1", "needs the model"),
    ("vllm serve m --x 'open", "check the quotes"),
    ("vllm serve m # a comment", "comments"),
])
def test_serve_command_refuses_what_is_not_one_plain_invocation(text, fragment):
    with pytest.raises(ServeCommandError, match=None) as err:
        ServeCommand.parse(text)
    assert fragment in str(err.value)


def test_literal_alias_follows_nested_aliases_and_gives_up_on_unknown_names():
    assert literal_alias(SPECULATIVE_PY, "SpeculativeMethod") == {
        "ngram", "draft_model", "suffix", "eagle", "eagle3", "deepseek_mtp", "qwen3_next_mtp", "mtp"}
    assert literal_alias("from typing import Literal\nX = Literal['a', Other]\n", "X") is None
    assert literal_alias("A = Literal['a', B]\nB = Literal['b', A]\n", "A") is None  # a cycle, not a hang
    assert literal_alias("x = (", "x") is None


# --- validation -------------------------------------------------------------------------------

def test_a_good_recipe_has_no_problems(repo):
    assert repo.problems() == []
    assert repo.problems(LaunchOptions(nodes=("10.0.0.1", "10.0.0.2"), ray=True)) == []


@pytest.mark.parametrize("old, new, rule", [
    ('"method": "mtp"', '"method": "qwen3_5_mtpp"', "error:speculative-method"),
    ("--no-enable-prefix-caching", "--enable-prefix-caching", "error:prefix-caching"),
    ("--no-enable-prefix-caching \\", "--port 8000 \\", "error:prefix-caching"),
    ("-tp {tensor_parallel}", "-tp 4", "error:parallelism"),
    ("--chat-template tpl.jinja", "--chat-template other.jinja", "error:chat-template"),
    ("--port {port}", "--port {port} --kv-cache-dtype turboquant_k3v4_nc --attention-backend FLASHINFER",
     "error:turboquant-flashinfer"),
    ("--port {port}", "--port {port} --kv-cache-dtype fp9", "error:kv-cache-dtype"),
    ("--port {port}", "--port {port} --headless", "error:launcher-flags"),
    ("--port {port}", "--port {port} --compilation-config '{{\"level\": 3'", "error:json"),
    ("DEMO_MODE: fast", "HF_TOKEN: hf_abc", "error:secrets"),
    ("DEMO_MODE: fast", "DEMO_MODE: two words", "error:env"),
])
def test_each_known_bad_combination_is_one_error(repo, old, new, rule):
    assert old in RECIPE
    recipe = repo.write_recipe("bad.yaml", RECIPE.replace(old, new))
    assert repo.problems(recipe=recipe) == [rule]


def test_mtp_across_nodes_needs_ray(repo):
    assert repo.problems(LaunchOptions(nodes=("10.0.0.1", "10.0.0.2"), ray=False)) == ["error:mtp-no-ray"]


def test_env_with_spaces_is_fine_for_the_standalone_form_but_line_breaks_never_are(repo):
    recipe = repo.write_recipe("spaces.yaml", RECIPE.replace("DEMO_MODE: fast", "DEMO_MODE: two words"))
    assert repo.problems(LaunchOptions(form=STANDALONE), recipe=recipe) == []
    recipe = repo.write_recipe("lines.yaml", RECIPE.replace("DEMO_MODE: fast", 'DEMO_MODE: "two\\nlines"'))
    assert repo.problems(LaunchOptions(form=STANDALONE), recipe=recipe) == ["error:env"]


def test_turboquant_on_hybrid_qwen_is_refused_where_vllm_refuses_it(tmp_path):
    text = RECIPE.replace("--port {port}", "--port {port} --kv-cache-dtype turboquant_k3v4_nc")
    old = Repo(tmp_path / "old", text, arg_utils=ARG_UTILS_OLD)
    assert old.problems() == ["error:kv-cache-dtype"]
    assert Repo(tmp_path / "new", text).problems() == []


def test_a_mod_that_does_not_apply_is_an_error_naming_it(tmp_path):
    repo = Repo(tmp_path / "r")
    make_mod(repo.root / "mods", "demo", vllm=">=0.18.0,<0.20", verified='["0.19.1"]')
    plan = build_plan(load_recipe(repo.recipe), LaunchOptions())
    problems = validate(plan, repo.facts(), check_with_engine).problems
    assert [p.rule for p in problems] == ["mods"]
    assert "mod demo is no-variant on vLLM 0.21.0" in problems[0].message


def test_tensor_parallel_follows_the_node_count_unless_set(repo):
    recipe = load_recipe(repo.recipe)
    two = LaunchOptions(nodes=("10.0.0.1", "10.0.0.2"))
    assert build_plan(recipe, two).serve.get("-tp") == "2"
    assert build_plan(recipe, LaunchOptions()).serve.get("-tp") == "1"
    plan = build_plan(recipe, LaunchOptions(nodes=two.nodes, sets=(("tensor_parallel", "1"),)))
    assert [p.rule for p in validate(plan, None, None).problems] == ["parallelism"]


# --- the launch-cluster.sh form, run against the stand-in -------------------------------------

def test_solo_script_calls_the_launcher_with_the_recipe(repo, tmp_path):
    out = tmp_path / "launch solo.sh"
    assert launch(repo, "--solo", out=out) == 0
    assert os.access(out, os.X_OK)
    record = tmp_path / "record"
    done = run_script(out, record)
    assert done.returncode == 0, done.stderr
    stop, start = calls(record)
    assert stop["args"] == ["--solo", "--name", "sparkmods-test", "-t", "test-image", "stop"]
    args = start["args"]
    assert args[:5] == ["--solo", "--name", "sparkmods-test", "-t", "test-image"]
    assert "--ray" not in args and "--no-ray" not in args
    assert values(args, "--apply-mod") == [str(repo.root / "mods" / "demo"), str(repo.root / "mods" / "template")]
    assert values(args, "-e") == ["DEMO_MODE=fast"]  # HF_TOKEN is not set: not passed
    lines = [line for line in start["script"].splitlines() if line.strip()]
    serve = shlex.split(lines[-1])
    assert serve[:3] == ["vllm", "serve", "/models/Qwen3.5-test model"]
    assert serve[serve.index("-tp") + 1] == "1"
    assert json.loads(serve[serve.index("--speculative-config") + 1]) == {"method": "mtp", "num_speculative_tokens": 2}
    assert not list(tmp_path.glob("sparkmods-serve.*")), "the temporary launch script was left behind"


def test_two_node_script_uses_ray_and_passes_secrets_by_name(repo, tmp_path):
    out = tmp_path / "launch.sh"
    assert launch(repo, "--nodes", "10.0.0.1,10.0.0.2", out=out) == 0
    text = out.read_text()
    record = tmp_path / "record"
    done = run_script(out, record, {"HF_TOKEN": SECRET})
    assert done.returncode == 0, done.stderr
    stop, start = calls(record)
    assert stop["args"][:5] == ["-n", "10.0.0.1,10.0.0.2", "--ray", "--name", "sparkmods-test"]
    args = start["args"]
    assert args[:3] == ["-n", "10.0.0.1,10.0.0.2", "--ray"] and start["mode"] == "ray"
    assert values(args, "-e") == ["DEMO_MODE=fast", "HF_TOKEN"]
    assert start["env"] == {"HF_TOKEN": SECRET}
    assert SECRET not in text and SECRET not in start["script"]
    serve = shlex.split(start["script"].splitlines()[-1])
    assert serve[serve.index("-tp") + 1] == "2" and "--distributed-executor-backend" not in serve


def test_a_failed_launch_fails_the_script_and_cleans_up(repo, tmp_path):
    out = tmp_path / "launch.sh"
    assert launch(repo, "--solo", out=out) == 0
    done = run_script(out, tmp_path / "record", {"LAUNCH_CLUSTER_FAIL": "1"})
    assert done.returncode == 1 and "simulated failure" in done.stderr
    assert not list(tmp_path.glob("sparkmods-serve.*"))


def test_the_stand_in_enforces_the_real_grammar(tmp_path, repo):
    record = {"LAUNCH_CLUSTER_RECORD": str(tmp_path / "r")}
    bad = [["--solo", "--ray", "-t", "x", "stop"], ["-t"], ["--ray", "--no-ray", "-n", "a,b"],
           ["--solo", "--apply-mod", "relative/mod"], ["--solo", "-e", "A=two words"], ["--solo", "--frobnicate"]]
    for args in bad:
        done = subprocess.run([str(STAND_IN), *args], env={**os.environ, **record}, capture_output=True, text=True)
        assert done.returncode == 1 and "error" in done.stderr, args
    ok = subprocess.run([str(STAND_IN), "--solo", "-t", "x", "stop"], env={**os.environ, **record})
    assert ok.returncode == 0


def test_validation_errors_write_nothing(repo, tmp_path, capsys):
    bad = repo.write_recipe("bad.yaml", RECIPE.replace("--no-enable-prefix-caching", "--enable-prefix-caching"))
    out = tmp_path / "never.sh"
    code = main(["launch", str(bad), "--solo", "--vllm", repo.target, "--launch-cluster", str(STAND_IN), "-o", str(out)])
    assert code == 1 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bad.yaml: error: prefix-caching: prefix caching is unreliable on the hybrid Qwen3.5 "
                   "architecture and --enable-prefix-caching is set: pass --no-enable-prefix-caching"]


def test_json_output_describes_plan_checks_and_script(repo, capsys):
    assert launch(repo, "--solo", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["mode"] == "solo" and doc["target"] == f"vLLM {VERSION} (dir:{repo.site}#{VERSION})"
    assert [(m["mod"], m["status"]) for m in doc["mods"]] == [("demo", "ok"), ("template", "ok")]
    assert doc["problems"] == [] and doc["script"].startswith("#!/usr/bin/env bash\n")


@pytest.mark.parametrize("args, fragment", [
    (["--solo", "--ray"], "--ray/--no-ray need --nodes"),
    (["--nodes", "10.0.0.1"], "one node is a solo launch"),
    (["--nodes", "10.0.0.1,10.0.0.1"], "lists a node twice"),
    (["--nodes", "10.0.0.1,host;rm"], "not an IP address"),
    (["--solo", "--set", "nope=1"], "has no {nope} placeholder"),
    (["--solo", "--pass-env", "BAD-NAME"], "not an environment variable name"),
])
def test_bad_command_lines_are_one_line_exit_2(repo, args, fragment, capsys):
    assert launch(repo, *args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and fragment in err


# --- shellcheck on every form and mode --------------------------------------------------------

@pytest.mark.parametrize("form", [CLUSTER, STANDALONE])
@pytest.mark.parametrize("layout", [["--solo"], ["--nodes", "10.0.0.1,10.0.0.2"],
                                    ["--nodes", "10.0.0.1,10.0.0.2,10.0.0.3", "--no-ray", "--set", "tensor_parallel=3"]])
def test_shellcheck_finds_nothing_in_generated_scripts(repo, tmp_path, form, layout):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck; ci/setup-docker.sh installs it)")
    recipe = repo.recipe
    if "--no-ray" in layout:  # MTP without Ray is refused, so check the no-Ray form without it
        recipe = repo.write_recipe("nospec.yaml", RECIPE.replace(
            " \\\n    --speculative-config '{{\"method\": \"mtp\", \"num_speculative_tokens\": 2}}'", ""))
    out = tmp_path / "script.sh"
    extra = ["--standalone"] if form == STANDALONE else []
    code = main(["launch", str(recipe), "--vllm", repo.target, "--launch-cluster", str(STAND_IN), *layout, *extra,
                 "-o", str(out)])
    assert code == 0
    done = subprocess.run(["shellcheck", "--severity=style", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_a_mod_whose_generated_files_drifted_is_an_error(repo):
    (repo.root / "mods" / "demo" / "run.sh").write_text("#!/bin/sh\necho stale\n")
    plan = build_plan(load_recipe(repo.recipe), LaunchOptions())
    problems = validate(plan, None, None).problems
    assert [p.rule for p in problems] == ["mod-files"]
    assert problems[0].message.startswith("mod demo is not synced (run.sh differs from what sparkmods sync generates)")


@pytest.mark.parametrize("name, secret", [("HF_TOKEN", True), ("HUGGING_FACE_HUB_TOKEN", True),
                                          ("OPENAI_API_KEY", True), ("DB_PASSWORD", True),
                                          ("TOKENIZERS_PARALLELISM", False), ("VLLM_KEYWORDS", False)])
def test_secret_names_are_recognised_by_whole_parts(repo, name, secret):
    recipe = repo.write_recipe("env.yaml", RECIPE.replace("DEMO_MODE: fast", f"{name}: value"))
    assert repo.problems(recipe=recipe) == (["error:secrets"] if secret else [])


def test_the_launcher_is_found_on_path_or_reported(repo, tmp_path, monkeypatch, capsys):
    out = tmp_path / "l.sh"
    monkeypatch.setenv("PATH", f"{FIXTURES}{os.pathsep}{os.environ['PATH']}")
    assert main(["launch", str(repo.recipe), "--vllm", repo.target, "--solo", "-o", str(out)]) == 0
    assert f"launch_cluster=${{SPARKMODS_LAUNCH_CLUSTER:-{STAND_IN}}}" in out.read_text()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert main(["launch", str(repo.recipe), "--vllm", repo.target, "--solo", "-o", str(tmp_path / "x.sh")]) == 2
    assert "launch-cluster.sh not found on PATH" in capsys.readouterr().err


@pytest.mark.docker
def test_without_the_image_or_vllm_the_target_is_unknown(repo, capsys, docker_engine):
    args = ["launch", str(repo.recipe), "--solo", "--image", "sparkmods-no-such-image:0", "--launch-cluster", str(STAND_IN)]
    assert main(args) == 2
    assert capsys.readouterr().err == (
        "sparkmods: error: image 'sparkmods-no-such-image:0' is not in the local Docker engine, so its vLLM cannot be "
        "read: pass --vllm VERSION (the vLLM inside that image), or get the image (the community image is built, "
        "not pulled: ./build-and-copy.sh -t sparkmods-no-such-image:0 in your spark-vllm-docker checkout)\n")


def test_without_an_engine_or_vllm_it_says_no_engine_and_a_release(repo, capsys, tmp_path, monkeypatch):
    """No engine answering is not the image being absent: the hint is a release number."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    args = ["launch", str(repo.recipe), "--solo", "--image", "vllm-node", "--launch-cluster", str(STAND_IN)]
    assert main(args) == 2
    assert capsys.readouterr().err == (
        "sparkmods: error: no Docker engine answers, so the vLLM inside image 'vllm-node' cannot be read: "
        "pass --vllm VERSION, the vLLM release the image holds (e.g. --vllm 0.21.0)\n")


def test_checking_an_image_without_an_engine_suggests_a_release(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    assert main(["check", "--vllm", "image:vllm-node"]) == 2
    assert capsys.readouterr().err == (
        "sparkmods: error: image:vllm-node: no Docker engine answers (DockerException); start Docker, or name "
        "the vLLM release the image holds instead (--vllm 0.21.0), or a dir:/wheel: target\n")
