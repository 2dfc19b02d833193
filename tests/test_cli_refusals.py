"""Bad input is one line on stderr and exit 2, no traceback, nothing done (issue 30, items 5 and 9):
an option a command takes once given twice (`apply --vllm dir:A --vllm dir:B` used only B),
`recipe check` of what is no recipe file, `--mods-dir` naming a file, `git:PATH@REF` whose PATH
is missing, `pypi:` without a version, `--launch-cluster` naming nothing, and a trickling
server cut off once at the deadline (a failed fetch ahead used to be asked again)."""

from __future__ import annotations

import os
import re
import time

import pytest

from clirun import one_line_error, sparkmods
from modfactory import ORIGINAL, TARGET, make_mod, make_site
from test_launch import STAND_IN, Repo
from test_sources_hostile import _wheel_trickle, check_cli
from test_sources_kit import fresh_cache, loopback_index, make_wheel  # noqa: F401

NAME = "vllm-0.19.1-cp38-abi3-manylinux_2_28_x86_64.whl"


# --- item 5: an option a command takes once --------------------------------------------------------

def test_apply_to_two_vllms_is_refused_and_neither_is_touched(tmp_path):
    mods = tmp_path / "mods"
    make_mod(mods)
    a, b = make_site(tmp_path / "a", "0.19.1"), make_site(tmp_path / "b", "0.19.1")
    for action in ([], ["--revert"], ["--dry-run"]):
        done, _ = sparkmods("apply", "demo", "--mods-dir", str(mods), "--vllm", f"dir:{a}", "--vllm", f"dir:{b}",
                            *action)
        assert one_line_error(done) == (f"sparkmods: error: --vllm given 2 times (dir:{a}, dir:{b}); this command "
                                        "takes one: run it once for each")
    assert (a / TARGET).read_text() == (b / TARGET).read_text() == ORIGINAL
    assert not (a / ".sparkmods").exists() and not (b / ".sparkmods").exists()


@pytest.mark.parametrize("argv, flag", [
    (["rebase-patch", "{patch}", "--base", "0.19.1", "--base", "0.19.0", "--onto", "0.20.0"], "--base"),
    (["rebase-patch", "{patch}", "--base", "0.19.1", "--onto", "0.20.0", "--onto", "0.21.0"], "--onto"),
    (["rebase", "demo", "--mods-dir", "{mods}", "--onto", "0.20.0", "--onto", "0.21.0"], "--onto"),
])
def test_rebase_targets_given_twice_are_refused(tmp_path, argv, flag):
    make_mod(tmp_path / "mods")
    patch = tmp_path / "demo.patch"
    patch.write_text("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    done, _ = sparkmods(*[a.format(patch=patch, mods=tmp_path / "mods") for a in argv], "--offline")
    assert re.fullmatch(rf"sparkmods: error: {flag} given 2 times \(.*\); this command takes one: run it once for "
                        r"each", one_line_error(done))


# --- item 9: bad input, one line -----------------------------------------------------------------------

@pytest.mark.parametrize("what, why", [("missing", "no such file"), ("folder", "not a regular file"),
                                       ("fifo", "not a regular file")])
def test_recipe_check_of_what_is_no_recipe_is_exit_2(tmp_path, what, why):
    path = tmp_path / "r.yaml"
    if what == "folder":
        path.mkdir()
    elif what == "fifo":
        os.mkfifo(path)
    done, seconds = sparkmods("recipe", "check", str(path), timeout=30)
    assert one_line_error(done) == f"sparkmods: error: {path}: {why}; name a recipe (.yaml)" and seconds < 20


@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_mods_dir_that_is_a_file_says_so(tmp_path, how):
    file = tmp_path / "mods.txt"
    file.write_text("x")
    args, env = (["--mods-dir", str(file)], None) if how == "option" else ([], {"SPARKMODS_MODS_DIR": str(file)})
    done, _ = sparkmods("check", *args, "--vllm", f"dir:{make_site(tmp_path / 's', '0.19.1')}", env=env)
    assert one_line_error(done) == f"sparkmods: error: mods folder {file} is not a folder"
    done, _ = sparkmods("check", "--mods-dir", str(tmp_path / "nope"), "--vllm", "dir:x")
    assert one_line_error(done) == f"sparkmods: error: mods folder {tmp_path / 'nope'} does not exist"


@pytest.mark.parametrize("ref", ["v0.19.1", "main", "0123abc"])
def test_git_target_names_the_missing_path_without_the_ref(tmp_path, ref):
    repo = tmp_path / "no-such-clone"
    done, _ = sparkmods("check", "--vllm", f"git:{repo}@{ref}")
    assert one_line_error(done) == (f"sparkmods: error: git:{repo}@{ref}: {repo} does not exist (the path before "
                                    f"'@{ref}'); name a git repository as git:PATH@REF")


def test_git_target_whose_folder_holds_an_at_sign_is_still_named_whole(tmp_path):
    folder = tmp_path / "has@sign"
    folder.mkdir()
    done, _ = sparkmods("check", "--vllm", f"git:{folder}")
    assert one_line_error(done) == f"sparkmods: error: git:{folder}: {folder} is not a git repository"


@pytest.mark.parametrize("spec", ["pypi:", "pypi: ", "pypi:\t"])
def test_pypi_without_a_version_is_not_taken_as_the_latest(spec):
    done, _ = sparkmods("check", "--vllm", spec, "--offline")
    assert one_line_error(done) == (f"sparkmods: error: vLLM target {spec.strip()!r} names no version; "
                                    "use pypi:VERSION (or latest)")


@pytest.mark.parametrize("what", ["missing", "folder"])
def test_launch_cluster_that_names_no_file_is_refused_before_any_check(tmp_path, what):
    repo = Repo(tmp_path / "repo")
    launcher = tmp_path / "launch-cluster.sh"
    if what == "folder":
        launcher.mkdir()
    done, _ = sparkmods("launch", str(repo.recipe), "--solo", "--vllm", "0.19.1", "--offline",
                        "--launch-cluster", str(launcher), "-o", str(tmp_path / "out.sh"))
    why = "a folder" if what == "folder" else "no such file"
    assert one_line_error(done) == (f"sparkmods: error: --launch-cluster {launcher}: {why}; name eugr's "
                                    "launch-cluster.sh (or use --standalone)")
    assert not (tmp_path / "out.sh").exists()


def test_an_existing_launcher_still_works(tmp_path):
    repo = Repo(tmp_path / "repo")
    done, _ = sparkmods("launch", str(repo.recipe), "--solo", "--vllm", repo.target, "--launch-cluster",
                        str(STAND_IN), "-o", str(tmp_path / "out.sh"))
    assert done.returncode == 0 and (tmp_path / "out.sh").is_file(), done.stderr


def test_a_trickling_server_is_asked_once_and_cut_off_once(loopback_index, tmp_path):
    """The check fetches central directories ahead (warming); a failure there is the answer, not a
    reason to ask the same range again and wait out the deadline twice."""
    loopback_index.add(make_wheel(tmp_path / NAME, "0.19.1"))
    loopback_index.routes[f"/files/{NAME}"] = _wheel_trickle(loopback_index)
    started = time.monotonic()
    done, _ = check_cli(loopback_index, tmp_path, env={"SPARKMODS_HTTP_DEADLINE": "2"})
    seconds = time.monotonic() - started
    assert one_line_error(done).endswith("no complete answer within 2 s (a stalled or trickling server; "
                                         "SPARKMODS_HTTP_DEADLINE sets the limit)")
    assert [h.range for h in loopback_index.file_hits()] == ["bytes=-1048576"]
    assert seconds < 2 * 2, seconds
