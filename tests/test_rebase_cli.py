"""`sparkmods rebase-patch` end to end on vLLM trees in folders (dir: targets): exit codes,
the output file, the report, conflict-marked files and drift."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modfactory import ORIGINAL, PATCHED, TARGET, make_site, unified
from sparkmods.cli import main

HELPERS = "vllm/model_executor/layers/helpers.py"
HELPERS_V1 = "def scale(x, factor):\n    return x * factor\n"
HELPERS_V2 = "def scale(x, by):\n    return x * by\n"
ONTO_OK = "# a header comment\n" + ORIGINAL + "\n    def extra(self):\n        return 1\n"
ONTO_CONFLICT = ORIGINAL.replace("y = x * 2", "y = x * 3").replace("return y\n", "return y.float()\n")


@pytest.fixture
def trees(tmp_path: Path):
    def make(version: str, text: str, helpers: str = HELPERS_V1) -> str:
        return "dir:" + str(make_site(tmp_path / version, version, {TARGET: text, HELPERS: helpers}))

    patch = tmp_path / "demo.patch"
    patch.write_text(unified(TARGET, ORIGINAL, PATCHED))
    return make, patch


def run(capsys, *argv: str) -> "tuple[int, str, str]":
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_clean_rebase_writes_an_exact_patch(trees, tmp_path, capsys):
    make, patch = trees
    base, onto = make("0.19.1", ORIGINAL), make("0.20.0", ONTO_OK)
    out_file = tmp_path / "out.patch"
    code, out, _ = run(capsys, "rebase-patch", str(patch), "--base", base, "--onto", onto, "-o", str(out_file))
    assert code == 0 and "every hunk exact" in out
    code, out, _ = run(capsys, "check-patch", str(out_file), "--vllm", onto, "--json")
    assert code == 0 and json.loads(out)["results"][0]["status"] == "ok"
    code, out, _ = run(capsys, "rebase-patch", str(patch), "--base", base, "--onto", onto)
    assert code == 0 and out == out_file.read_text()  # without -o: the patch on stdout


def test_conflict_exits_1_writes_nothing_and_marks_conflicts(trees, tmp_path, capsys):
    make, patch = trees
    base, onto = make("0.19.1", ORIGINAL), make("0.20.0", ONTO_CONFLICT)
    out_file = tmp_path / "out.patch"
    out_file.write_text("previous\n")
    conflicts = tmp_path / "conflicts"
    code, out, _ = run(capsys, "rebase-patch", str(patch), "--base", base, "--onto", onto, "-o", str(out_file),
                       "--conflicts", str(conflicts))
    assert code == 1
    assert out_file.read_text() == "previous\n"
    assert f"{TARGET}: conflict" in out and "hunk 1, base line 10: " in out
    marked = (conflicts / TARGET).read_text()
    assert "<<<<<<< onto" in marked and "y = y + 1  # demo mod" in marked and ">>>>>>> patch" in marked
    code, out, _ = run(capsys, "rebase-patch", str(patch), "--base", base, "--onto", onto, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["clean"] is False and "patch" not in doc
    assert doc["files"][0]["edits"][0]["outcome"] == "conflict"


def test_drift_exits_1_even_when_every_hunk_applies(trees, tmp_path, capsys):
    make, _ = trees
    patched = ("from vllm.model_executor.layers.helpers import scale\n" + PATCHED).replace(
        "        y = y + 1  # demo mod\n", "        y = scale(y, factor=2)\n")
    patch = tmp_path / "scale.patch"
    patch.write_text(unified(TARGET, ORIGINAL, patched))
    base, onto = make("0.19.1", ORIGINAL), make("0.20.0", ORIGINAL, HELPERS_V2)
    code, out, _ = run(capsys, "rebase-patch", str(patch), "--base", base, "--onto", onto, "-o", str(tmp_path / "o"))
    assert code == 1 and not (tmp_path / "o").exists()
    assert "drift:" in out and "no parameter named 'factor'" in out and "required 'by'" in out
    same = make("0.19.2", ORIGINAL)
    code, _, _ = run(capsys, "rebase-patch", str(patch), "--base", base, "--onto", same, "-o", str(tmp_path / "o"))
    assert code == 0  # the same call against helpers that still take `factor`: no drift


def test_a_patch_onto_already_has_is_exit_0_with_nothing_to_carry(trees, tmp_path, capsys):
    make, patch = trees
    code, out, _ = run(capsys, "rebase-patch", str(patch), "--base", make("0.19.1", ORIGINAL),
                       "--onto", make("0.20.0", PATCHED), "-o", str(tmp_path / "o"))
    assert code == 0 and "nothing to carry" in out and not (tmp_path / "o").exists()


@pytest.mark.parametrize("case", ["no-file", "not-a-patch", "not-text", "wrong-base", "bad-target"])
def test_input_errors_exit_2_with_one_line(trees, tmp_path, capsys, case):
    make, patch = trees
    base, onto = make("0.19.1", ORIGINAL), make("0.20.0", ONTO_OK)
    if case == "no-file":
        patch = tmp_path / "missing.patch"
    elif case == "not-a-patch":
        patch.write_text("hello\n")
    elif case == "not-text":
        patch.write_bytes(b"--- a/x\n+++ b/x\n\xff\xfe\n")
    elif case == "wrong-base":
        base = make("0.18.0", ONTO_CONFLICT)
    else:
        onto = "dir:" + str(tmp_path / "nowhere")
    code, out, err = run(capsys, "rebase-patch", str(patch), "--base", base, "--onto", onto)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("sparkmods: error:")
    if case == "wrong-base":
        assert "does not apply to dir:" in err and TARGET in err
    if case == "not-text":
        assert f"{patch}: not UTF-8 text" in err
        assert main(["check-patch", str(patch), "--vllm", onto]) == 2
        assert f"{patch}: not UTF-8 text" in capsys.readouterr().err
