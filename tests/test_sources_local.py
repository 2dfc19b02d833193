"""Local targets: dir: (source tree, site-packages), wheel:, git: (any commit, no checkout), and
the one-line errors every bad target string gets."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import git
import pytest

from modfactory import TARGET, make_site
from sparkmods.errors import SparkmodsError
from sparkmods.sources import open_targets, stats
from wheelindex import A, B, flip_byte_in_member, make_wheel, wheel_files

pytestmark = pytest.mark.usefixtures("fresh_cache")

CONFIG = "vllm/config.py"


# --- dir: ----------------------------------------------------------------------------------------

def test_dir_site_packages_layout(tmp_path):
    site = make_site(tmp_path / "site", version="0.19.1rc1.dev15+g50cd5674b.d20260403")
    (site / "vllm" / "__pycache__").mkdir()
    (site / "vllm" / "__pycache__" / "x.cpython-312.pyc").write_bytes(b"\0")
    [source] = open_targets(f"dir:{site}")
    assert (source.label, source.version, source.commit, source.sha256) == \
        (f"dir:{site}", "0.19.1rc1.dev15+g50cd5674b.d20260403", "50cd5674b", None)
    assert source.read(TARGET) == (site / TARGET).read_bytes()
    assert source.read("vllm/nope.py") is None and source.read("vllm") is None
    assert source.list_files() == sorted(["vllm/__init__.py", TARGET,
                                          "vllm-0.19.1rc1.dev15+g50cd5674b.d20260403.dist-info/METADATA"])
    with pytest.raises(SparkmodsError, match=r"refusing path '\.\./outside.txt'"):
        source.read("../outside.txt")


def test_dir_plain_tree_needs_a_version(tmp_path):
    tree = tmp_path / "tree"
    (tree / "vllm").mkdir(parents=True)
    (tree / CONFIG).write_text("x = 1\n")
    with pytest.raises(SparkmodsError, match=r"cannot tell the vLLM version .*; name it: dir:.*#0.19.1"):
        open_targets(f"dir:{tree}")
    [named] = open_targets(f"dir:{tree}#0.20.0")
    assert named.version == "0.20.0" and named.read(CONFIG) == b"x = 1\n"
    with pytest.raises(SparkmodsError, match=r"not a PEP 440 version: 'banana'"):
        open_targets(f"dir:{tree}#banana")


def test_dir_source_tree_with_a_setuptools_scm_version_file(tmp_path):
    tree = tmp_path / "tree"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "_version.py").write_text(
        "version: str\n__version__: str\n\n__version__ = version = '0.20.1.dev3+gabcdef12'\n"
        "__version_tuple__ = version_tuple = (0, 20, 1, 'dev3', 'gabcdef12')\n")
    [found] = open_targets(f"dir:{tree}")
    assert (found.version, found.commit) == ("0.20.1.dev3+gabcdef12", "abcdef12")


# --- wheel: --------------------------------------------------------------------------------------

def test_local_wheel(tmp_path):
    path = make_wheel(tmp_path / "renamed.whl", "0.19.1")  # no version in the name: METADATA says it
    [source] = open_targets(f"wheel:{path}")
    assert (source.version, source.label) == ("0.19.1", f"wheel:{path}")
    assert source.read(A) == wheel_files("0.19.1")[A] and source.read("vllm/none.py") is None
    assert "vllm-0.19.1.dist-info/METADATA" in source.list_files()
    assert stats.snapshot()["requests"] == 0


def test_local_wheel_crc_and_not_a_wheel(tmp_path):
    path = make_wheel(tmp_path / "vllm-0.19.1-py3-none-any.whl", "0.19.1", stored=True)
    flip_byte_in_member(path, B)
    [source] = open_targets(f"wheel:{path}")
    with pytest.raises(SparkmodsError, match=r"member .*inc.py failed its CRC-32 check"):
        source.read(B)
    bogus = tmp_path / "bogus.whl"
    bogus.write_bytes(b"not a zip at all" * 100)
    with pytest.raises(SparkmodsError, match=r"wheel:.*bogus.whl: not a readable wheel"):
        open_targets(f"wheel:{bogus}")


# --- git: ----------------------------------------------------------------------------------------

def _commit(repo: git.Repo, files: dict, message: str) -> git.Commit:
    for rel, text in files.items():
        path = Path(repo.working_tree_dir) / rel
        if text is None:
            repo.index.remove([rel], working_tree=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        repo.index.add([rel])
    return repo.index.commit(message)


@pytest.fixture
def vllm_repo(tmp_path: Path) -> git.Repo:
    """v0.19.0 -> v0.19.1rc0 (one file changed, one added) -> one untagged commit (a file deleted)."""
    repo = git.Repo.init(tmp_path / "vllm-src")
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "Test").set_value("user", "email", "test@example.com")
    _commit(repo, {"vllm/__init__.py": "", CONFIG: "release = '0.19.0'\n", "setup.py": ""}, "0.19.0")
    repo.create_tag("v0.19.0")
    _commit(repo, {CONFIG: "release = '0.19.1rc0'\n", "vllm/new.py": "new\n"}, "rc")
    repo.create_tag("v0.19.1rc0", message="annotated tag")
    _commit(repo, {"vllm/new.py": None}, "drop new.py")
    return repo


def test_git_commits_are_read_from_the_object_database(vllm_repo):
    path = vllm_repo.working_tree_dir
    [tagged] = open_targets(f"git:{path}@v0.19.0")
    assert (tagged.version, tagged.commit) == ("0.19.0", vllm_repo.tags["v0.19.0"].commit.hexsha)
    assert tagged.read(CONFIG) == b"release = '0.19.0'\n" and tagged.read("vllm/new.py") is None
    assert tagged.list_files() == sorted([CONFIG, "vllm/__init__.py"])  # vllm/ only, not setup.py

    [rc] = open_targets(f"git:{path}@v0.19.1rc0")
    assert rc.version == "0.19.1rc0" and rc.read("vllm/new.py") == b"new\n"

    head = vllm_repo.head.commit.hexsha
    [tip] = open_targets(f"git:{path}")  # no @REF: HEAD
    abbrev = vllm_repo.git.rev_parse("--short", head)
    assert (tip.version, tip.commit) == (f"0.19.1rc1.dev1+g{abbrev}", head)
    [by_sha] = open_targets(f"git:{path}@{head[:10]}")
    assert by_sha.version == tip.version and by_sha.read("vllm/new.py") is None
    # Reading an old commit touched nothing: the working tree still shows HEAD.
    assert (Path(path) / CONFIG).read_text() == "release = '0.19.1rc0'\n" and not vllm_repo.is_dirty()


def test_git_bare_clone_and_past_a_release_tag(vllm_repo, tmp_path):
    _commit(vllm_repo, {CONFIG: "later\n"}, "after rc")
    vllm_repo.create_tag("v0.19.1")
    _commit(vllm_repo, {CONFIG: "main\n"}, "main 1")
    _commit(vllm_repo, {CONFIG: "main 2\n"}, "main 2")
    bare = vllm_repo.clone(tmp_path / "bare.git", bare=True)
    [source] = open_targets(f"git:{bare.git_dir}@HEAD")
    abbrev = bare.git.rev_parse("--short", "HEAD")
    assert source.version == f"0.19.2.dev2+g{abbrev}" and source.read(CONFIG) == b"main 2\n"


def test_git_dir_checkout_uses_head_for_its_version(vllm_repo):
    [source] = open_targets(f"dir:{vllm_repo.working_tree_dir}")
    assert source.version.startswith("0.19.1rc1.dev1+g") and source.commit == vllm_repo.head.commit.hexsha
    assert source.read(CONFIG) == b"release = '0.19.1rc0'\n"


def test_git_errors_and_untagged_clones(vllm_repo, tmp_path):
    path = vllm_repo.working_tree_dir
    with pytest.raises(SparkmodsError, match=r"no commit 'v9.9.9' in"):
        open_targets(f"git:{path}@v9.9.9")
    with pytest.raises(SparkmodsError, match=r"is not a git repository"):
        open_targets(f"git:{tmp_path}")
    untagged = git.Repo.init(tmp_path / "untagged")
    with untagged.config_writer() as cfg:
        cfg.set_value("user", "name", "Test").set_value("user", "email", "test@example.com")
    _commit(untagged, {CONFIG: "x\n"}, "one")
    _commit(untagged, {CONFIG: "y\n"}, "two")
    # A fork's clone without release tags: setuptools_scm's fallback, as vLLM's build names it.
    [source] = open_targets(f"git:{untagged.working_tree_dir}@HEAD")
    assert source.version == f"0.1.dev2+g{untagged.git.rev_parse('--short', 'HEAD')}"
    assert source.read(CONFIG) == b"y\n"
    if os.geteuid() == 0:  # a repository another user owns (a mirror): git's safe.directory refuses it
        shutil.chown(untagged.git_dir, user="nobody")
        with pytest.raises(SparkmodsError, match=r"git refuses to read .*, which another user owns; clone it"):
            open_targets(f"git:{untagged.working_tree_dir}@HEAD")


# --- target strings ------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, message", [
    ("", r"empty vLLM target; use one of VERSION, pypi:VERSION"),
    ("   ", r"empty vLLM target"),
    ("foo:bar", r"unknown vLLM target 'foo:bar'; use one of"),
    ("wheel:", r"names no wheel; use wheel:"),
    ("wheel:/no/such.whl", r"wheel:/no/such.whl: no wheel file at /no/such.whl"),
    ("dir:/no/such/dir", r"dir:/no/such/dir: /no/such/dir has no vllm/ folder"),
    ("git:/no/such/repo", r"git:/no/such/repo: /no/such/repo is not a git repository"),
    ("index:ftp://host/simple", r"index: needs an http\(s\) URL"),
    ("not a version", r"bad vLLM target 'not a version': not a version or a range"),
    (">=banana", r"bad vLLM target '>=banana'"),
    ("pypi:>=1,<", r"bad vLLM target 'pypi:>=1,<'"),
])
def test_bad_targets_are_one_clear_line(spec, message):
    with pytest.raises(SparkmodsError, match=message) as err:
        open_targets(spec, offline=True)
    assert "\n" not in str(err.value)


def test_git_path_may_contain_an_at_sign(vllm_repo, tmp_path):
    odd = tmp_path / "me@host"
    shutil.copytree(vllm_repo.git_dir, odd / ".git")
    [source] = open_targets(f"git:{odd}@v0.19.0")
    assert source.version == "0.19.0"


@pytest.mark.parametrize("link", ["file", "folder", "dangling"])
def test_dir_a_link_on_the_way_is_refused_as_run_sh_refuses_it(tmp_path, link):
    """run.sh never follows a link inside vllm/ (runtime/engine.plain_path): the host's check of
    the same folder must not call a mod `ok` there, so reading through a link is one line."""
    site = make_site(tmp_path / "site")
    real = site / TARGET
    if link == "file":
        moved = real.with_name("elsewhere.py")
        real.rename(moved)
        real.symlink_to(moved.name)
    elif link == "folder":
        folder = real.parent
        folder.rename(folder.with_name("moved"))
        folder.symlink_to("moved")
    else:
        real.unlink()
        real.symlink_to("nowhere.py")
    [source] = open_targets(f"dir:{site}")
    with pytest.raises(SparkmodsError, match=r"is a symbolic link .*a mod changes only real files"):
        source.read(TARGET)
    assert source.read("vllm/__init__.py") is not None  # what no link leads to reads as before


def test_dir_a_link_refusal_through_the_cli_is_one_line(tmp_path):
    from clirun import one_line_error, sparkmods
    from modfactory import make_mod

    site = make_site(tmp_path / "site")
    real = site / TARGET
    moved = real.with_name("elsewhere.py")
    real.rename(moved)
    real.symlink_to(moved.name)
    mod = make_mod(tmp_path / "mods")
    done, _ = sparkmods("check", "--mods-dir", str(mod.parent), "--vllm", f"dir:{site}", "--no-cache")
    assert "is a symbolic link" in one_line_error(done, 2)
