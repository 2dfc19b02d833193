"""Community mods (run.sh + diffs, no mod.toml) read without running them, judged the way
their run.sh behaves, listed as not checkable with the line that makes them so, and adopted.
The fixtures under tests/fixtures/community are our own, written in the forms community
run.sh files use; the network tier (test_community_network.py) runs them on real releases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

import pytest

from communitytree import FIXTURES, GLM, Tree, glm_tree, sites
from sparkmods.cli import main
from sparkmods.community.judge import SKIPPED, judge
from sparkmods.community.runsh import read_mod


@pytest.mark.parametrize("name, tool, strip, reverse, tolerated, guarded, excluded", [
    ("patch-d-site", "patch", 1, False, "", False, []),
    ("patch-root-skipping", "patch", 1, False, "`|| echo Patch is not applicable, skipping...`", False, []),
    ("git-apply-directory", "git apply", 1, False, "", False, ["vllm/tests/test_glm.py"]),
    ("reverse-upstream", "patch", 1, True, "", False, []),
    ("dry-run-guard", "patch", 1, False, "its dry run failing skips it", True, []),
    ("stacked-one-file", "git apply", 1, False, "", False, []),
])
def test_run_sh_forms_are_read(name, tool, strip, reverse, tolerated, guarded, excluded):
    mod = read_mod(FIXTURES / name)
    (step,) = mod.steps
    assert mod.checkable and not mod.blockers
    assert (step.tool, step.strip, step.reverse, step.tolerated, step.guarded, step.excluded) == \
        (tool, strip, reverse, tolerated, guarded, excluded)
    assert {fp.path for fp in step.patches} == {GLM}


def test_a_loop_over_a_glob_applies_each_diff_in_order():
    mod = read_mod(FIXTURES / "stacked-loop")
    assert [s.source for s in mod.steps] == ["01-guard.patch", "02-comment.patch"]


@pytest.mark.parametrize("name, kind, line", [
    ("python-edit", "python", 3), ("sed-edit", "sed", 3), ("download-pr", "download", 3),
    ("transformers-patch", "other-package", 3), ("copies-files", "copies", 3),
])
def test_mods_that_cannot_be_judged_name_their_line(name, kind, line):
    mod = read_mod(FIXTURES / name)
    assert not mod.checkable and (mod.blockers[0].kind, mod.blockers[0].line) == (kind, line)
    assert mod.why_not().startswith(f"run.sh line {line}: ")


def test_a_mod_that_only_sets_up_the_container_has_nothing_to_check():
    mod = read_mod(FIXTURES / "container-setup")
    assert not mod.checkable and not mod.blockers and "sets up the container" in mod.why_not()


def write_mod(tmp: Path, runsh: str, files: Dict[str, str]) -> Path:
    mod = tmp / "m"
    mod.mkdir()
    (mod / "run.sh").write_text(runsh)
    for name, text in files.items():
        (mod / name).write_text(text)
    return mod


DIFF = "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,2 +1,2 @@\n a = 1\n-b = 2\n+b = 3\n"


@pytest.mark.parametrize("runsh, tolerated", [
    ("set -e\npatch -p1 -d /usr/lib/python3/dist-packages < x.diff\n", ""),
    ("set -e\npatch -p1 -d /usr/lib/python3/dist-packages < x.diff || true\n", "`|| true`"),
    ("set -e\npatch -p1 -d /usr/lib/python3/dist-packages < x.diff || { echo no; exit 1; }\n", ""),
    ("patch -p1 -d /usr/lib/python3/dist-packages < x.diff\necho done\n", "run.sh has no `set -e`"),
    ("patch -p1 -d /usr/lib/python3/dist-packages < x.diff\n", ""),  # its last command: run.sh's exit status
    ("set -e\npatch -p1 -d /usr/lib/python3/dist-packages < x.diff && echo ok\n",
     "a failure before `&&` does not stop run.sh"),
    ("set -e\nif ! patch --dry-run -p1 -d /usr/lib/python3/dist-packages < x.diff; then exit 1; fi\n"
     "patch -p1 -d /usr/lib/python3/dist-packages < x.diff\n", ""),
])
def test_when_run_sh_goes_on_after_a_failed_patch(tmp_path: Path, runsh: str, tolerated: str):
    (step,) = read_mod(write_mod(tmp_path, runsh, {"x.diff": DIFF})).steps
    assert step.tolerated == tolerated


@pytest.mark.parametrize("runsh, path", [
    ("cd /usr/local/lib/python3.12/dist-packages/vllm\npatch -p1 < /workspace/mods/m/x.diff\n", "vllm/vllm/x.py"),
    ("cd /usr/local/lib/python3.12/dist-packages/vllm\npatch -p0 < $OLDPWD/x.diff\n", "vllm/b/vllm/x.py"),  # no such file: missing-file
    ("cd /usr/local/lib/python3.12/dist-packages/vllm\npatch -p1 < x.diff\n", None),  # x.diff is read there
    ("cd /usr/local/lib/python3.12/dist-packages/vllm/..\npatch -p1 < $OLDPWD/x.diff\n", "vllm/x.py"),
    ('V=${PYTHON_ROOT:-/usr/local/lib/python3.12/dist-packages}\ngit apply --directory=vllm -p2 "$PWD/x.diff" -C1\n',
     None),  # git apply -C after the file is --context: an option this check does not model
    ('git -C /opt/venv/lib/python3.12/site-packages apply x.diff\n', None),  # -C: relative to the new folder
    ('patch -p1 -d /usr/local/lib/python3.12/dist-packages -i x.diff\n', None),  # -i: read after -d's chdir
])
def test_where_the_paths_land(tmp_path: Path, runsh: str, path):
    mod = read_mod(write_mod(tmp_path, runsh, {"x.diff": DIFF}))
    if path is None:
        assert not mod.checkable
    else:
        assert [fp.path for s in mod.steps for fp in s.patches] == [path]


def test_a_function_called_from_an_if_is_followed(tmp_path: Path):
    runsh = ('set -e\nDIR="$( cd "$( dirname "${BASH_SOURCE[0]}" )" && pwd )"\napply() {\n'
             '    patch -p1 -d /usr/lib/python3/dist-packages < "$DIR/x.diff"\n}\n'
             'if [ "$1" == "description" ]; then\n    echo about\nelse\n    apply\nfi\n')
    (step,) = read_mod(write_mod(tmp_path, runsh, {"x.diff": DIFF})).steps
    assert (step.line, step.tolerated, [fp.path for fp in step.patches]) == (4, "", ["vllm/x.py"])


def test_a_run_sh_that_cannot_be_read_says_so(tmp_path: Path):
    mod = read_mod(write_mod(tmp_path, 'patch -p1 < "x.diff\n', {"x.diff": DIFF}))
    assert not mod.checkable and mod.blockers[0].kind == "unreadable" and "line 1" in mod.why_not()


@pytest.mark.parametrize("name, status", [("patch-d-site", "ok-offset"), ("git-apply-directory", "conflict")])
def test_gnu_patch_fuzz_is_modelled_and_git_apply_has_none(name, status):
    result = judge(read_mod(FIXTURES / name), glm_tree(outer=True))
    assert result.status == status
    assert ("applies only with fuzz 1" in result.steps[0]["reason"]) == (status == "ok-offset")


@pytest.mark.parametrize("name, status", [
    ("patch-d-site", "conflict"), ("patch-root-skipping", SKIPPED), ("dry-run-guard", SKIPPED),
    ("git-apply-directory", "conflict"), ("stacked-loop", "conflict"),
])
def test_a_failed_patch_is_skipped_silently_only_where_run_sh_goes_on(name, status):
    mod = read_mod(FIXTURES / name)
    assert judge(mod, glm_tree()).status == "ok"
    broken = judge(mod, glm_tree(broken=True))
    assert broken.status == status
    assert ("skipped silently" in broken.reason) == (status == SKIPPED)
    assert ("run.sh stops" in broken.reason) == (status != SKIPPED)


def test_gnu_patch_leaves_the_hunks_that_fit(tmp_path: Path):
    two = DIFF + "@@ -10,2 +10,2 @@\n j = 1\n-k = 2\n+k = 3\n"
    mod = read_mod(write_mod(tmp_path, "set -e\npatch -p1 -d /usr/lib/python3/dist-packages < x.diff || echo skip\n",
                             {"x.diff": two}))
    tree = Tree("0.19.1", {"vllm/x.py": b"a = 1\nb = 2\n" + b"#\n" * 7 + b"j = 1\nk = 9\n"})
    result = judge(mod, tree)
    assert result.status == SKIPPED and "GNU patch still writes 1 hunk(s)" in result.reason


def test_stacked_diffs_judged_as_one_and_already_applied_stops_run_sh():
    mod = read_mod(FIXTURES / "stacked-loop")
    tree = glm_tree()
    first = judge(mod, tree, keep_bytes=True)
    assert first.status == "ok" and [s["status"] for s in first.steps] == ["ok", "ok"]
    done = Tree("0.19.1", {GLM: first.files[0].after})
    assert judge(mod, done).status == "conflict"  # 02 changed what 01 added: 01 neither fits nor is there
    once = judge(read_mod(FIXTURES / "patch-d-site"), tree, keep_bytes=True)
    again = judge(read_mod(FIXTURES / "patch-d-site"), Tree("0.19.1", {GLM: once.files[0].after}))
    assert again.status == "conflict" and "already in this vLLM" in again.reason and "`patch` exits 1" in again.reason


def test_check_community_table_json_and_exit_codes(tmp_path: Path, capsys):
    good, bad = sites(tmp_path)
    assert main(["check", "--community", str(FIXTURES), "patch-root-skipping", "--vllm", f"dir:{good}",
                 "--static"]) == 0
    assert "1 checked, 1 green, 0 not (0 skipped silently); 0 of 1 mods not checkable" in capsys.readouterr().out
    assert main(["check", str(FIXTURES / "patch-root-skipping"), "--vllm", f"dir:{bad}", "--json",
                 "--static"]) == 1  # detected
    [row] = json.loads(capsys.readouterr().out)["results"]  # JSON: the table's width follows the tmp path
    assert row["status"] == "skipped" and row["reason"].startswith("skipped silently: guard.patch (run.sh line 3)")
    assert main(["check", "--community", str(FIXTURES), "--vllm", f"dir:{good}", "--json", "--static"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert {r["mod"] for r in doc["results"]} == {m.name for m in FIXTURES.iterdir() if read_mod(m).checkable}
    assert {n["mod"] for n in doc["not_checkable"]} == {"python-edit", "sed-edit", "download-pr",
                                                        "transformers-patch", "copies-files", "container-setup"}


@pytest.mark.parametrize("args, message", [
    (["--community", "/nonexistent"], "/nonexistent: no such folder"),
    (["--community", str(FIXTURES), "nope"], "no community mod 'nope'"),
])
def test_check_community_input_errors(args, message, capsys):
    assert main(["check", *args, "--vllm", "dir:/tmp"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_matrix_community_writes_its_own_matrix(tmp_path: Path, capsys):
    good, bad = sites(tmp_path)
    out = tmp_path / "cm"
    assert main(["matrix", "--community", str(FIXTURES), "--out", str(out), "--vllm", f"dir:{good}",
                 "--vllm", f"dir:{bad}", "--source-label", "fixtures"]) == 0
    doc = json.loads((out / "matrix.json").read_text())
    cells = {(c["mod"], c["vllm"]): c["status"] for c in doc["cells"]}
    assert cells[("patch-root-skipping", "0.19.1")] == "ok" and cells[("patch-root-skipping", "0.20.0")] == SKIPPED
    assert cells[("sed-edit", "0.20.0")] == "not-checkable" and doc["community"]["source"] == "fixtures"
    assert "`skipped`" in (out / "MATRIX.md").read_text() and (out / "matrix.svg").is_file()


def test_adopt_writes_a_mod_keyed_by_where_the_steps_apply(tmp_path: Path, capsys):
    good, bad = sites(tmp_path)
    out = tmp_path / "mods" / "scale-guard"
    assert main(["adopt", str(FIXTURES / "stacked-loop"), "--out", str(out), "--vllm", f"dir:{bad}",
                 "--vllm", f"dir:{good}"]) == 0
    assert "variant v0.19.1: vllm >=0.19.1, <0.20.0; verified on 0.19.1" in capsys.readouterr().out
    assert (out / "run.sh").is_file()
    assert main(["check", "scale-guard", "--mods-dir", str(out.parent), "--vllm", f"dir:{good}", "--vllm", f"dir:{bad}"]) == 1
    table = capsys.readouterr().out
    rows = {line.split()[1]: line.split()[3:5] for line in table.splitlines() if line.startswith("scale-guard")}
    assert rows == {"0.19.1": ["v0.19.1", "ok"], "0.20.0": ["-", "no-variant"]}  # run.sh fails loudly there
    # a second adopt into the same folder, or of a mod that cannot be judged, is refused whole
    assert main(["adopt", str(FIXTURES / "stacked-loop"), "--out", str(out), "--vllm", f"dir:{good}"]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["adopt", str(FIXTURES / "sed-edit"), "--out", str(tmp_path / "x"), "--vllm", f"dir:{good}",
                 "--sandbox-image", "sparkmods-no-such-image:0"]) == 2  # it would be run: no such image
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("no sandbox image" in err or "no Docker engine" in err)
    assert not (tmp_path / "x").exists()
