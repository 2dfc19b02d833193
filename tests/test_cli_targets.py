"""`--vllm` is repeatable on `recipe check` and `launch` as on every command (each vLLM named is
checked, none silently dropped), and `--mods-dir` finds the mods of a recipe kept outside any
collection. Fast and offline: two `dir:` site-packages trees, one a mod covers and one it does not.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import List

import pytest

from modfactory import make_mod, make_site
from sparkmods.cli import main

FIXTURES = Path(__file__).resolve().parent / "fixtures"
STAND_IN = FIXTURES / "launch-cluster.sh"
COVERED, UNCOVERED = "0.19.1", "0.22.0"  # make_mod's default range is >=0.19.0,<0.21

RECIPE = textwrap.dedent('''\
    recipe_version: "1"
    name: Targets test
    container: targets-test-image-not-pulled
    mods:
      - mods/demo
    defaults:
      port: 8000
    command: |
      vllm serve /models/m --port {port} --no-enable-prefix-caching
    ''')


@pytest.fixture
def world(tmp_path: Path) -> dict:
    """A collection (mods/demo), a recipe outside it, and one site per version."""
    make_mod(tmp_path / "collection" / "mods", "demo")
    away = tmp_path / "elsewhere"
    away.mkdir()
    (away / "my.yaml").write_text(RECIPE)
    sites = {v: f"dir:{make_site(tmp_path / f'site-{v}', v)}" for v in (COVERED, UNCOVERED)}
    return {"mods": tmp_path / "collection" / "mods", "recipe": away / "my.yaml", "sites": sites}


def recipe_check(world: dict, *versions: str) -> List[str]:
    args = ["recipe", "check", str(world["recipe"]), "--mods-dir", str(world["mods"])]
    for version in versions:
        args += ["--vllm", world["sites"][version]]
    return args


@pytest.mark.parametrize("order", [(COVERED, UNCOVERED), (UNCOVERED, COVERED)])
def test_recipe_check_checks_every_vllm_in_either_order(world, order, capsys):
    assert main(recipe_check(world, *order)) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "1 recipes checked on 2 vLLMs, 0 ok, 1 with errors"
    errors = [line for line in lines if ": error: " in line]
    assert len(errors) == 1, lines
    assert "error: mods: mod demo is no-variant" in errors[0] and f"(on vLLM {UNCOVERED} ({world['sites'][UNCOVERED]}))" in errors[0]


def test_recipe_check_one_target_keeps_its_plain_output(world, capsys):
    assert main(recipe_check(world, COVERED)) == 0
    assert capsys.readouterr().out == "1 recipes checked, 1 ok, 0 with errors\n"


def launch(world: dict, out: Path, *versions: str) -> int:
    args = ["launch", str(world["recipe"]), "--solo", "--mods-dir", str(world["mods"]),
            "--launch-cluster", str(STAND_IN), "-o", str(out)]
    for version in versions:
        args += ["--vllm", world["sites"][version]]
    return main(args)


@pytest.mark.parametrize("order", [(COVERED, UNCOVERED), (UNCOVERED, COVERED)])
def test_launch_refuses_when_any_named_vllm_cannot_run_it(world, order, tmp_path, capsys):
    out = tmp_path / "launch.sh"
    assert launch(world, out, *order) == 1
    assert not out.exists()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("my.yaml: error: mods: mod demo is no-variant") and UNCOVERED in err[0], err


def test_launch_script_header_names_every_vllm_checked(world, tmp_path):
    second = make_site(tmp_path / "site-0.20.0", "0.20.0")
    out = tmp_path / "launch.sh"
    code = main(["launch", str(world["recipe"]), "--solo", "--mods-dir", str(world["mods"]),
                 "--launch-cluster", str(STAND_IN), "-o", str(out),
                 "--vllm", world["sites"][COVERED], "--vllm", f"dir:{second}"])
    assert code == 0
    checked = [line for line in out.read_text().splitlines() if line.startswith("# Checked against")]
    assert checked == [f"# Checked against vLLM {COVERED} ({world['sites'][COVERED]}): mods demo=ok.",
                       f"# Checked against vLLM 0.20.0 (dir:{second}): mods demo=ok."]


def test_recipe_outside_a_collection_uses_the_environments_mods(world, monkeypatch, capsys):
    monkeypatch.chdir(world["recipe"].parent)
    monkeypatch.setenv("SPARKMODS_MODS_DIR", str(world["mods"]))
    assert main(["recipe", "check", str(world["recipe"]), "--vllm", world["sites"][COVERED]]) == 0
    assert capsys.readouterr().out == "1 recipes checked, 1 ok, 0 with errors\n"


def test_a_mods_dir_without_the_mod_says_where_it_looked(world, tmp_path, capsys):
    empty = tmp_path / "empty-mods"
    empty.mkdir()
    assert main(["recipe", "check", str(world["recipe"]), "--mods-dir", str(empty)]) == 1
    (line,) = capsys.readouterr().out.splitlines()[:-1]
    assert line == (f"{world['recipe']}: error: schema: mods[0]: 'mods/demo' is not a mod folder in {empty} "
                    f"(no run.sh or mod.toml in {empty.resolve() / 'demo'}); say where the mods are with "
                    f"--mods-dir DIR")


def test_a_missing_mods_dir_is_an_input_error(world, tmp_path, capsys):
    assert main(["recipe", "check", str(world["recipe"]), "--mods-dir", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"sparkmods: error: mods folder {tmp_path / 'nope'} does not exist\n"
