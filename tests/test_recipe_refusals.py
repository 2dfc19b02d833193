"""Recipes that used to launch something other than what they say (issue 30, item 8): a key
given twice (PyYAML keeps the last one silently), a default holding a NUL or a line break
(written raw into the script), a placeholder with a format spec or conversion (`{port:1500000000}`
wrote a 1.5 GB script). Each is one line naming the file and the key, exit 2, nothing written,
from `launch` and `recipe check` alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from clirun import one_line_error, sparkmods
from launchrepo import RECIPE, STAND_IN, Repo
from sparkmods.cli import main
from sparkmods.launch.recipe import RecipeError, load_recipe


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path / "recipe repo")


TWICE = [
    ("command", RECIPE + "command: vllm serve other\n", "command: given twice (lines 14 and 21)"),
    ("name", RECIPE.replace("container: test-image", "name: Other\ncontainer: test-image"),
     "name: given twice (lines 2 and 3)"),
    ("defaults.port", RECIPE.replace("  host: 0.0.0.0", "  host: 0.0.0.0\n  port: 9000"),
     "port: given twice (lines 8 and 10)"),
    ("env", RECIPE.replace("  DEMO_MODE: fast", "  DEMO_MODE: fast\n  DEMO_MODE: slow"),
     "DEMO_MODE: given twice (lines 13 and 14)"),
    ("quoted", RECIPE + '"command": vllm serve other\n', "command: given twice (lines 14 and 21)"),
]


@pytest.mark.parametrize("text, message", [(t, m) for _, t, m in TWICE], ids=[i for i, _, _ in TWICE])
def test_a_key_given_twice_is_refused(repo, text, message):
    path = repo.write_recipe("twice.yaml", text)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert str(err.value) == f"{path}: {message}; keep one"


def test_a_merged_key_may_be_overridden(repo):
    """`<<:` merges a mapping whose keys the recipe may then override: YAML allows that."""
    text = RECIPE.replace("defaults:\n", "defaults: &d\n").replace("env:\n", "env:\n  <<: *d\n  port: 9000\n")
    assert load_recipe(repo.write_recipe("merge.yaml", text)).env_map["port"] == "9000"


BAD_DEFAULTS = [
    ("line break", 'host: "0.0.0.0\\necho pwned"', "defaults.host: holds a line break"),
    ("NUL", 'host: "0.0.0.0\\0x"', "defaults.host: holds a NUL byte"),
    ("carriage return", 'host: "0.0.0.0\\r"', "defaults.host: holds a carriage return"),
    ("escape", 'host: "0.0.0.0\\e[2J"', "defaults.host: holds a control character"),
    ("block scalar", "host: |\n    0.0.0.0\n    echo pwned", "defaults.host: holds a line break"),
]


@pytest.mark.parametrize("value, message", [(v, m) for _, v, m in BAD_DEFAULTS], ids=[i for i, _, _ in BAD_DEFAULTS])
def test_a_default_that_is_not_one_line_is_refused_and_nothing_is_written(repo, tmp_path, value, message, capsys):
    path = repo.write_recipe("bad.yaml", RECIPE.replace("host: 0.0.0.0", value))
    out = tmp_path / "launch.sh"
    code = main(["launch", str(path), "--solo", "--vllm", repo.target, "--launch-cluster", str(STAND_IN),
                 "-o", str(out)])
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err == f"sparkmods: error: {path}: {message}; a value is one line of text\n"


def test_a_nul_in_an_env_value_is_refused(repo):
    path = repo.write_recipe("env.yaml", RECIPE.replace("DEMO_MODE: fast", 'DEMO_MODE: "fa\\0st"'))
    with pytest.raises(RecipeError, match=r"env\.DEMO_MODE: holds a NUL byte; a value is one line of text$"):
        load_recipe(path)


def test_a_set_value_with_a_line_break_is_refused(repo, tmp_path, capsys):
    out = tmp_path / "launch.sh"
    code = main(["launch", str(repo.recipe), "--solo", "--vllm", repo.target, "--launch-cluster", str(STAND_IN),
                 "--set", "host=0.0.0.0\necho pwned", "-o", str(out)])
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err == ("sparkmods: error: --set host: the value holds a line break; "
                                       "a value is one line of text\n")


SPECS = [
    ("width", "{port:1500000000}", "{port:1500000000}"),
    ("fill", "{port:>20}", "{port:>20}"),
    ("conversion", "{port!r}", "{port!r}"),
    ("both", "{port!s:9}", "{port!s:9}"),
    ("nested width", "{port:{port}}", "{port:{port}}"),
]


@pytest.mark.parametrize("field, shown", [(f, s) for _, f, s in SPECS], ids=[i for i, _, _ in SPECS])
def test_a_placeholder_with_a_format_spec_is_refused_quickly(repo, tmp_path, field, shown):
    path = repo.write_recipe("spec.yaml", RECIPE.replace("--port {port}", f"--port {field}"))
    out = tmp_path / "launch.sh"
    done, seconds = sparkmods("launch", str(path), "--solo", "--vllm", repo.target, "--launch-cluster", str(STAND_IN),
                              "-o", str(out), timeout=60)
    assert one_line_error(done) == (f"sparkmods: error: {path}: command: placeholder {shown} has a conversion or "
                                    "format spec; write {port} (the value is used as it is)")
    assert not out.exists() and seconds < 20
    done, _ = sparkmods("recipe", "check", str(path), timeout=60)
    assert done.returncode == 1 and "command: placeholder" in done.stdout


def test_literal_braces_are_still_fine(repo):
    """`{{` and `}}` are literal braces, not placeholders: the shipped recipes' JSON needs them."""
    assert "num_speculative_tokens" in load_recipe(repo.recipe).command
