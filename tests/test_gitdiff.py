"""`sparkmods check-patch` on git-format diffs, judged against `git apply --check` on the same tree.

A real git repository plays a pull request against vLLM's files: a rename with an edit, a pure
rename, a mode change, a binary file, a new and a deleted file. `git diff --binary` is what
`git apply --binary` (launch-cluster.sh's --apply-vllm-pr) takes; plain `git diff` writes
`Binary files ... differ`, which git apply refuses. check-patch must agree with git apply on
whether it applies, on the base tree, on a tree where it is already applied and on a tree
that moved on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

from sparkmods.errors import SparkmodsError
from sparkmods.gitdiff import blob_id, parse_git_diff
from sparkmods.patchfile import read_diff_file
from sparkmods.runtime.udiff import PatchParseError

BASE = {
    "vllm/a.py": "".join(f"line_{n} = {n}\n" for n in range(40)),
    "vllm/c.py": "def c():\n    return 3\n",
    "vllm/tool.sh": "#!/bin/sh\necho tool\n",
    "vllm/keep.py": "keep = True\n",
}
BLOB = bytes(range(256)) * 4


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def pr(tmp_path_factory) -> Dict[str, object]:
    """A repository with the base commit and the PR's commit; the PR's diffs, both forms."""
    repo = tmp_path_factory.mktemp("pr-repo")
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    for rel, text in BASE.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    (repo / "vllm/blob.bin").write_bytes(BLOB)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    _git(repo, "mv", "vllm/a.py", "vllm/b.py")
    (repo / "vllm/b.py").write_text(BASE["vllm/a.py"].replace("line_20 = 20\n", "line_20 = 'twenty'\n"))
    _git(repo, "mv", "vllm/c.py", "vllm/d.py")
    os.chmod(repo / "vllm/tool.sh", 0o755)
    (repo / "vllm/blob.bin").write_bytes(BLOB[::-1])
    (repo / "vllm/e.py").write_text("new = 1\n")
    _git(repo, "rm", "-q", "vllm/keep.py")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "pr")
    out = {"repo": repo}
    for name, extra in (("binary", ["--binary"]), ("plain", [])):
        path = repo.parent / f"pr-{name}.diff"
        path.write_text(_git(repo, "diff", "-M", *extra, "HEAD~1", "HEAD"))
        out[name] = path
    return out


def _tree(pr, dest: Path, rev: str) -> Path:
    """The files of rev as a site-packages tree (vllm/ plus a dist-info), and a git work tree
    for `git apply --check`."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(pr["repo"]), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    dist = dest / "vllm-0.1.dev19043+g1a2b3c4.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.1.dev19043+g1a2b3c4\n\n")
    return dest


def _git_apply_ok(tree: Path, diff: Path, *extra: str) -> bool:
    return subprocess.run(["git", "apply", "--check", "--binary", *extra, str(diff)], cwd=tree,
                          capture_output=True, check=False).returncode == 0


def _check_patch(tree: Path, diff: Path, *extra: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "sparkmods", "check-patch", str(diff), *extra, "--vllm", f"dir:{tree}",
                          "--json", "--no-cache"], capture_output=True, text=True, check=False)
    assert out.returncode in (0, 1), out.stderr
    [row] = json.loads(out.stdout)["results"]
    return row


def test_the_headers_git_writes_are_read(pr) -> None:
    changes = {c.path: c for c in parse_git_diff(pr["binary"].read_text())}
    assert sorted(changes) == ["vllm/b.py", "vllm/blob.bin", "vllm/d.py", "vllm/e.py", "vllm/keep.py", "vllm/tool.sh"]
    assert changes["vllm/b.py"].rename and changes["vllm/b.py"].old_path == "vllm/a.py"
    assert changes["vllm/b.py"].patch is not None and changes["vllm/d.py"].patch is None
    assert (changes["vllm/tool.sh"].old_mode, changes["vllm/tool.sh"].new_mode) == ("100644", "100755")
    assert changes["vllm/blob.bin"].binary == "data"
    assert blob_id(BLOB).startswith(changes["vllm/blob.bin"].index[0])
    assert changes["vllm/e.py"].old_path is None and changes["vllm/keep.py"].new_path is None
    plain = {c.path: c for c in parse_git_diff(pr["plain"].read_text())}
    assert plain["vllm/blob.bin"].binary == "no-data"


def test_check_patch_agrees_with_git_apply(pr, tmp_path: Path) -> None:
    base = _tree(pr, tmp_path / "base", "HEAD~1")
    assert _git_apply_ok(base, pr["binary"])
    row = _check_patch(base, pr["binary"])
    assert row["status"] == "ok", row
    assert {f["path"]: f["status"] for f in row["files"]} == {
        "vllm/b.py": "ok", "vllm/d.py": "ok", "vllm/blob.bin": "ok", "vllm/e.py": "ok", "vllm/keep.py": "ok"}
    # Without the binary data git apply refuses; so does check-patch, naming the file.
    assert not _git_apply_ok(base, pr["plain"])
    plain = _check_patch(base, pr["plain"])
    assert plain["status"] == "conflict" and "vllm/blob.bin" in plain["reason"]
    # Applied already: git apply -R applies, check-patch says applied.
    done = _tree(pr, tmp_path / "done", "HEAD")
    assert not _git_apply_ok(done, pr["binary"]) and _git_apply_ok(done, pr["binary"], "-R")
    assert _check_patch(done, pr["binary"])["status"] == "applied"
    assert _check_patch(done, pr["binary"], "-R")["status"] == "ok"
    # The tree moved on under the renamed file and the binary one: both refuse.
    moved = _tree(pr, tmp_path / "moved", "HEAD~1")
    (moved / "vllm/a.py").write_text(BASE["vllm/a.py"].replace("line_20 = 20\n", "line_20 = 21\n"))
    (moved / "vllm/blob.bin").write_bytes(b"other")
    assert not _git_apply_ok(moved, pr["binary"])
    row = _check_patch(moved, pr["binary"])
    statuses = {f["path"]: f["status"] for f in row["files"]}
    assert row["status"] == "conflict" and statuses["vllm/b.py"] == statuses["vllm/blob.bin"] == "conflict"


def test_bad_git_headers_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.diff"
    bad.write_text("diff --git a/vllm/x.py b/vllm/x.py\nindex zzz\n--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(SparkmodsError, match=r"bad.diff: line 2: bad index line 'index zzz'"):
        read_diff_file(bad)
    with pytest.raises(PatchParseError, match=r"line 2: unexpected 'what is this'"):
        parse_git_diff("diff --git a/vllm/x.py b/vllm/x.py\nwhat is this\n")
