"""Stacked diffs and reverse patches on a real vLLM file (0.19.1's glm4_moe.py from PyPI),
judged by our engine and by the tools community run.sh files call: `git apply --check` and
GNU `patch --dry-run`. Where they accept, our engine must too, and produce their bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from realpatch import REL, diff, git_apply, gnu_patch
from sparkmods.runtime.engine import APPLIED, CONFLICT, OK, OK_OFFSET, plan
from sparkmods.runtime.udiff import parse_patch, reverse
from sparkmods.sources import open_targets

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def original() -> str:
    (source,) = open_targets("pypi:0.19.1")
    return source.read(REL).decode()


def edits(text: str) -> "tuple[str, str]":
    """Two successive real edits of the file: the first changes a line the second moves past."""
    lines = text.splitlines(True)
    imports = next(i for i, line in enumerate(lines) if line.startswith("import "))
    once = "".join(lines[:imports] + ["import sys  # sparkmods: first change\n"] + lines[imports:])
    loop = once.index("        for name, loaded_weight in weights:\n")
    twice = once[:loop] + "        seen = set()  # sparkmods: second change\n" + once[loop:]
    assert once != text and twice != once
    return once, twice


def tree(root: Path, text: str) -> Path:
    path = root / REL
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return root


def test_two_diffs_of_one_file_apply_in_order(tmp_path: Path, original: str):
    once, twice = edits(original)
    stacked = diff(original, once, f"a/{REL}", f"b/{REL}") + diff(once, twice, f"a/{REL}", f"b/{REL}")
    root = tree(tmp_path, original)
    assert git_apply(root, stacked, "--check").returncode == 0
    assert gnu_patch(root, stacked, "-p1").returncode == 0
    (result,) = plan(parse_patch(stacked), lambda p: (root / p).read_bytes() if (root / p).exists() else None)
    assert result.status == OK and [h.index for h in result.hunks] == [1, 2]
    assert git_apply(root, stacked).returncode == 0  # now really applied: the bytes must agree
    assert result.after == (root / REL).read_bytes() == twice.encode()
    # on the patched tree, both are present: applied, and git apply refuses to apply it again
    (again,) = plan(parse_patch(stacked), lambda p: (root / p).read_bytes())
    assert again.status == APPLIED and git_apply(root, stacked, "--check").returncode != 0


def test_stacked_diffs_where_the_second_does_not_fit(tmp_path: Path, original: str):
    once, twice = edits(original)
    wrong = diff(original, once, f"a/{REL}", f"b/{REL}") + diff(original, twice, f"a/{REL}", f"b/{REL}")
    root = tree(tmp_path, original)
    (result,) = plan(parse_patch(wrong), lambda p: (root / p).read_bytes())
    assert git_apply(root, wrong, "--check").returncode != 0 and result.status == CONFLICT


@pytest.mark.parametrize("tool", ["git", "gnu"])
def test_a_reverse_patch_undoes_an_upstream_change(tmp_path: Path, original: str, tool: str):
    """run.sh files revert an upstream change with `patch -R` / `git apply -R`: it applies where
    the change is present and fails where it is not, as our reversed patch says."""
    once, _ = edits(original)
    change = diff(original, once, f"a/{REL}", f"b/{REL}")
    backwards = [reverse(fp) for fp in parse_patch(change)]
    for text, expect in ((once, (OK, OK_OFFSET)), (original, (APPLIED,))):
        root = tree(tmp_path / str(len(text)), text)
        proc = git_apply(root, change, "-R", "--check") if tool == "git" else gnu_patch(root, change, "-p1", "-R")
        (result,) = plan(backwards, lambda p: (root / p).read_bytes())  # noqa: B023 - used in this iteration only
        assert result.status in expect
        assert (proc.returncode == 0) == (result.status != APPLIED), proc.stdout + proc.stderr
        if result.status != APPLIED:
            assert result.after == original.encode()
