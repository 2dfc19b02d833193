"""Files the tools write (issue 30, items 9 and 11): a file that replaces another keeps its mode, a
new one follows the umask (mkstemp's 0600 used to leak through: a 0644 mod.toml came back 0600),
cache entries stay the user's own; and an output path that can never be written (a folder, `.`,
a missing folder, a file where a folder is wanted) is one line and exit 2 before any work."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterator

import pytest

from clirun import one_line_error, sparkmods
from modfactory import ORIGINAL, PATCHED, TARGET, make_mod, make_site, unified
from sparkmods.errors import SparkmodsError
from sparkmods.outputfile import write_atomic, write_into
from test_launch import STAND_IN, Repo
from test_rebase_mod import MANIFEST, ONTO, index, mod, run  # noqa: F401 (fixtures)
from test_sources_kit import fresh_cache, loopback_index, make_wheel  # noqa: F401 (fixtures)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask() -> Iterator:
    """Set the process umask for a test (restored after)."""
    old = os.umask(0o022)
    os.umask(old)
    yield os.umask
    os.umask(old)


# --- item 11: modes ------------------------------------------------------------------------------

@pytest.mark.parametrize("before", [0o644, 0o664, 0o600, 0o640, 0o444])
def test_a_replaced_file_keeps_its_mode(tmp_path, umask, before):
    umask(0o077)  # the umask would narrow a new file: a replaced one keeps what it had
    path = tmp_path / "mod.toml"
    path.write_text("old\n")
    path.chmod(before)
    write_atomic(path, "new\n")
    assert path.read_text() == "new\n" and mode_of(path) == before
    assert [p.name for p in tmp_path.iterdir()] == ["mod.toml"]  # no temp left beside it


@pytest.mark.parametrize("mask, file_mode, script_mode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775),
                                                          (0o077, 0o600, 0o700), (0o027, 0o640, 0o750)])
def test_a_new_file_follows_the_umask(tmp_path, umask, mask, file_mode, script_mode):
    umask(mask)
    write_atomic(tmp_path / "plain", b"x")
    write_atomic(tmp_path / "script.sh", "#!/bin/sh\n", executable=True)
    assert mode_of(tmp_path / "plain") == file_mode and mode_of(tmp_path / "script.sh") == script_mode


def test_a_regenerated_script_stays_runnable_by_whoever_could_read_it(tmp_path, umask):
    umask(0o022)
    script = tmp_path / "launch.sh"
    script.write_text("old\n")
    script.chmod(0o640)
    write_atomic(script, "new\n", executable=True)
    assert mode_of(script) == 0o750


def test_a_symlink_is_replaced_not_followed(tmp_path, umask):
    umask(0o022)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("keep\n")
    elsewhere.chmod(0o600)
    link = tmp_path / "out.patch"
    link.symlink_to(elsewhere)
    write_atomic(link, "new\n")
    assert not link.is_symlink() and link.read_text() == "new\n" and mode_of(link) == 0o644
    assert elsewhere.read_text() == "keep\n"


def test_rebase_patch_output_keeps_its_mode(tmp_path, capsys, umask):
    umask(0o022)
    base = "dir:" + str(make_site(tmp_path / "0.19.1", "0.19.1", {TARGET: ORIGINAL}))
    onto = "dir:" + str(make_site(tmp_path / "0.20.0", "0.20.0", {TARGET: "# header\n" + ORIGINAL}))
    patch = tmp_path / "demo.patch"
    patch.write_text(unified(TARGET, ORIGINAL, PATCHED))
    out = tmp_path / "out.patch"
    out.write_text("previous\n")
    out.chmod(0o664)
    code, _, _ = run(capsys, "rebase-patch", str(patch), "--base", base, "--onto", onto, "-o", str(out))
    assert code == 0 and out.read_text() != "previous\n" and mode_of(out) == 0o664
    fresh = tmp_path / "fresh.patch"
    code, _, _ = run(capsys, "rebase-patch", str(patch), "--base", base, "--onto", onto, "-o", str(fresh))
    assert code == 0 and mode_of(fresh) == 0o644


def test_rebase_write_keeps_mod_toml_mode_and_new_patches_follow_the_umask(index, mod, capsys, umask):
    umask(0o002)
    (mod / "mod.toml").chmod(0o644)
    code, out, _ = run(capsys, "rebase", str(mod), "--onto", "0.20.0", "--index-url", index, "--write")
    assert code == 0, out
    assert (mod / "mod.toml").read_text() != MANIFEST and mode_of(mod / "mod.toml") == 0o644
    [patch] = (mod / "patches" / "v1-0.20.0").iterdir()
    assert mode_of(patch) == 0o664


def test_matrix_outputs_keep_their_modes(loopback_index, tmp_path, capsys, umask):
    umask(0o022)
    make_mod(tmp_path / "mods", "demo")
    loopback_index.add(make_wheel(tmp_path / "vllm-0.19.1-cp38-abi3-manylinux_2_28_x86_64.whl", "0.19.1",
                                  extra={TARGET: ORIGINAL.encode()}))
    out = tmp_path / "matrix"
    args = ["matrix", "--mods-dir", str(tmp_path / "mods"), "--out", str(out),
            "--index-url", f"{loopback_index.url}/simple", "--vllm", ">=0.19"]
    code, _, _ = run(capsys, *args)
    assert code == 0 and {p.name: mode_of(p) for p in out.iterdir()} == \
        {"matrix.json": 0o644, "MATRIX.md": 0o644, "matrix.svg": 0o644}
    (out / "MATRIX.md").chmod(0o664)
    (out / "matrix.json").unlink()  # rewritten on the next run
    code, _, _ = run(capsys, *args)
    assert code == 0 and mode_of(out / "MATRIX.md") == 0o664 and mode_of(out / "matrix.json") == 0o644


def test_launch_script_follows_the_umask(tmp_path, capsys, umask):
    umask(0o027)
    repo = Repo(tmp_path / "repo")
    out = tmp_path / "launch.sh"
    code, _, err = run(capsys, "launch", str(repo.recipe), "--solo", "--vllm", repo.target,
                       "--launch-cluster", str(STAND_IN), "-o", str(out))
    assert code == 0, err
    assert mode_of(out) == 0o750


def test_cache_entries_stay_private(loopback_index, tmp_path, fresh_cache, umask):
    umask(0o000)
    from sparkmods.sources import open_targets
    loopback_index.add(make_wheel(tmp_path / "vllm-0.19.1-cp38-abi3-manylinux_2_28_x86_64.whl", "0.19.1"))
    [source] = open_targets("0.19.1", index_url=f"{loopback_index.url}/simple")
    assert source.read("vllm/__init__.py")
    files = [p for p in fresh_cache.rglob("*") if p.is_file()]
    assert files and {mode_of(p) for p in files} == {0o600}


# --- item 9: output paths that can never be written ---------------------------------------------

def _launch_args(repo: Repo, out: str):
    # --vllm 0.19.1 --offline with an empty cache would fail on its own: the output is refused first
    return ["launch", str(repo.recipe), "--solo", "--vllm", "0.19.1", "--offline",
            "--launch-cluster", str(STAND_IN), "-o", out]


@pytest.mark.parametrize("out, why", [(".", "a folder; name the file to write"),
                                      ("{tmp}", "a folder; name the file to write"),
                                      ("{tmp}/", "a folder; name the file to write"),
                                      ("{tmp}/no/such/launch.sh", "folder {tmp}/no/such does not exist")])
def test_launch_output_that_cannot_be_written_is_refused_first(tmp_path, out, why):
    repo = Repo(tmp_path / "repo")
    out, why = out.format(tmp=tmp_path), why.format(tmp=tmp_path)
    done, _ = sparkmods(*_launch_args(repo, out), cwd=tmp_path)
    assert one_line_error(done) == f"sparkmods: error: -o {Path(out)}: {why}"


def test_launch_output_under_a_file_is_refused(tmp_path):
    repo = Repo(tmp_path / "repo")
    done, _ = sparkmods(*_launch_args(repo, str(repo.recipe / "launch.sh")))
    assert one_line_error(done) == f"sparkmods: error: -o {repo.recipe / 'launch.sh'}: folder {repo.recipe} does not exist"


@pytest.mark.parametrize("out", [".", "{tmp}", "{tmp}/missing/out.patch"])
def test_rebase_patch_output_that_cannot_be_written_is_refused_before_any_fetch(tmp_path, out):
    patch = tmp_path / "demo.patch"
    patch.write_text(unified(TARGET, ORIGINAL, PATCHED))
    out = out.format(tmp=tmp_path)
    done, _ = sparkmods("rebase-patch", str(patch), "--base", "0.19.1", "--onto", "0.20.0", "--offline",
                        "-o", out, cwd=tmp_path)
    assert one_line_error(done).startswith(f"sparkmods: error: -o {Path(out)}: ")


@pytest.mark.parametrize("what", ["file", "fifo", "symlink to a file"])
def test_matrix_out_that_is_not_a_folder_is_refused(tmp_path, what):
    make_mod(tmp_path / "mods", "demo")
    out = tmp_path / "out"
    if what == "fifo":
        os.mkfifo(out)
    elif what == "file":
        out.write_text("x")
    else:
        (tmp_path / "target").write_text("x")
        out.symlink_to(tmp_path / "target")
    done, _ = sparkmods("matrix", "--mods-dir", str(tmp_path / "mods"), "--out", str(out), "--vllm", "0.19.1",
                        "--offline")
    assert one_line_error(done) == (f"sparkmods: error: --out {out}: not a folder; name the folder to write the "
                                    "matrix files in")


def test_a_matrix_file_that_is_a_folder_is_one_line(loopback_index, tmp_path, capsys):
    make_mod(tmp_path / "mods", "demo")
    loopback_index.add(make_wheel(tmp_path / "vllm-0.19.1-cp38-abi3-manylinux_2_28_x86_64.whl", "0.19.1"))
    (tmp_path / "matrix" / "MATRIX.md").mkdir(parents=True)
    code, _, err = run(capsys, "matrix", "--mods-dir", str(tmp_path / "mods"), "--out", str(tmp_path / "matrix"),
                       "--index-url", f"{loopback_index.url}/simple", "--vllm", ">=0.19")
    assert code == 2 and err == f"sparkmods: error: {tmp_path / 'matrix' / 'MATRIX.md'}: cannot write it (a folder)\n"


def test_a_write_that_fails_leaves_no_temp_and_says_why(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "out").mkdir()
    with pytest.raises(SparkmodsError, match=r"out: cannot write it \(a folder\)$"):
        write_atomic(folder / "out", "x")
    assert [p.name for p in folder.iterdir()] == ["out"]


@pytest.mark.parametrize("setting", ["file", "file/below"])
def test_a_cache_dir_that_is_a_file_is_one_line(tmp_path, setting):
    (tmp_path / "file").write_text("x")
    cache = tmp_path / setting
    make_mod(tmp_path / "mods", "demo")
    done, _ = sparkmods("check", "demo", "--mods-dir", str(tmp_path / "mods"), "--vllm", "0.19.1", "--offline",
                        env={"SPARKMODS_CACHE_DIR": str(cache)})
    blocker = "" if setting == "file" else f" ({tmp_path / 'file'} is a file)"
    assert one_line_error(done) == (f"sparkmods: error: SPARKMODS_CACHE_DIR={cache}: not a folder{blocker}; "
                                    "set SPARKMODS_CACHE_DIR to a folder (it is created if missing)")


def _special(tmp_path: Path, what: str) -> Path:
    """A FIFO, a character device (like /dev/null, made here), or a link to the FIFO."""
    path = tmp_path / what
    if what == "fifo":
        os.mkfifo(path)
    elif what == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs root")
    else:
        os.mkfifo(tmp_path / "fifo")
        path.symlink_to(tmp_path / "fifo")
    return path


@pytest.mark.parametrize("what, kind", [("fifo", "a FIFO"), ("device", "a character device"),
                                        ("link", "a FIFO")])
def test_an_output_that_is_no_regular_file_is_refused_not_replaced(tmp_path, what, kind):
    """`-o /dev/stdout` or `-o /dev/null`: a rename would put a regular file in the device's place."""
    out = _special(tmp_path, what)
    repo = Repo(tmp_path / "repo")
    done, _ = sparkmods(*_launch_args(repo, str(out)))
    assert one_line_error(done) == (f"sparkmods: error: -o {out}: {kind}, not a regular file; name a file to write "
                                    "(without -o the output goes to standard output)")
    assert not stat.S_ISREG(os.stat(out).st_mode)


@pytest.mark.parametrize("what", ["fifo", "device"])
def test_write_atomic_never_replaces_what_is_no_regular_file(tmp_path, what):
    out = _special(tmp_path, what)
    with pytest.raises(SparkmodsError, match=r"not a regular file; not replacing it$"):
        write_atomic(out, "x")
    assert not stat.S_ISREG(os.lstat(out).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == [what]


def test_write_into_creates_the_folders_and_keeps_modes(tmp_path, umask):
    """What rebase --write and the nightly heal write a mod's files with."""
    umask(0o002)
    toml = tmp_path / "mod" / "mod.toml"
    toml.parent.mkdir()
    toml.write_text("old\n")
    toml.chmod(0o644)
    write_into(toml, "new\n")
    write_into(tmp_path / "mod" / "patches" / "v2" / "a.patch", b"patch\n")
    assert mode_of(toml) == 0o644 and mode_of(tmp_path / "mod" / "patches" / "v2" / "a.patch") == 0o664
    blocker = tmp_path / "mod" / "file"
    blocker.write_text("x")
    with pytest.raises(SparkmodsError, match=rf"^{blocker}/sub: cannot create the folder \(Not a directory\)$"):
        write_into(blocker / "sub" / "a.patch", b"x")


def test_set_id_bits_are_not_carried_over(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "tool"
    path.write_text("old\n")
    path.chmod(0o4755)
    write_atomic(path, "new\n")
    assert mode_of(path) == 0o755
