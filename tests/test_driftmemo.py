"""The drift memo: a check is reused only when its tree answers every recorded question the
same (module bytes, absences, folders, extension modules), and is then neither parsed nor walked."""

from __future__ import annotations

from typing import Dict, List

import pytest

from drifttree import IMPORTS, MOD, TREE, add
from sparkmods.checking import drift
from sparkmods.checking.driftmemo import DriftMemo, changes_key
from sparkmods.pyindex.resolve import VllmTree

HELPERS = "vllm/model_executor/layers/quantization/helpers.py"
PATCHED = add(IMPORTS + "        y = scale(y, 2, clamp=True) + Box(3).size\n")


@pytest.fixture()
def counted(monkeypatch) -> List[int]:
    """A fresh memo, and the number of checks that really ran (not taken from it)."""
    monkeypatch.setattr(drift, "_MEMO", DriftMemo())
    runs: List[int] = []
    real = drift._findings

    def findings(changes, tree):
        runs.append(1)
        return real(changes, tree)
    monkeypatch.setattr(drift, "_findings", findings)
    return runs


def _check(tree: Dict[str, str], patched: str = PATCHED) -> List[str]:
    files = {k: v.encode() for k, v in tree.items()}
    read: List[str] = []

    def reader(path: str):
        read.append(path)
        return files.get(path)
    found = drift.check_patched({MOD: (files[MOD], patched.encode())}, reader, lambda: sorted(files))
    return [f"{f.kind}: {f.message}" for f in found]


def test_the_same_answers_reuse_the_findings_without_a_second_walk(counted):
    assert _check(TREE) == [] and len(counted) == 1
    unrelated = dict(TREE, **{"vllm/model_executor/layers/quantization/records.py": "# changed, never read\n"})
    assert _check(unrelated) == [] and len(counted) == 1  # a file the check never read may differ
    broken = add(IMPORTS + "        y = scale(y, 2, factor=3)\n")
    (finding,) = _check(TREE, broken)  # other changes: another key, a real check
    assert "no parameter named 'factor'" in finding and len(counted) == 2
    assert _check(TREE, broken) == [finding] and len(counted) == 2


@pytest.mark.parametrize("tree, problem", [
    # the imported module's bytes differ: the callee lost its keyword
    (dict(TREE, **{HELPERS: TREE[HELPERS].replace(", *, clamp: bool = False", "")}), "no parameter named 'clamp'"),
    # the imported module is gone, and nothing else provides it
    ({k: v for k, v in TREE.items() if k != HELPERS}, "does not exist"),
])
def test_a_different_answer_to_any_recorded_question_runs_the_check_again(counted, tree, problem):
    assert _check(TREE) == [] and len(counted) == 1
    (finding,) = _check(tree)
    assert problem in finding and len(counted) == 2


def test_a_folder_that_appears_is_a_different_answer(counted):
    """helpers.py gone but helpers/ a folder (namespace package): the listing's answer changed."""
    gone = {k: v for k, v in TREE.items() if k != HELPERS}
    (missing,) = _check(gone)
    as_folder = dict(gone, **{"vllm/model_executor/layers/quantization/helpers/data.txt": ""})
    found = _check(as_folder)
    assert len(counted) == 2 and found != [missing]


def test_recorded_questions_are_what_the_tree_was_asked_in_order():
    files = {k: v.encode() for k, v in TREE.items()}
    tree = VllmTree(files.get, lambda: sorted(files))
    assert tree.module("vllm.model_executor.layers.quantization.helpers") is not None
    assert tree.module("vllm.nothing") is None
    kinds = [(kind, path) for kind, path, _ in tree.observed]
    assert kinds == [("read", HELPERS), ("read", "vllm/nothing.py"), ("read", "vllm/nothing/__init__.py"),
                     ("folder", "vllm/nothing"), ("extension", "vllm/nothing")]
    assert all(tree.answer(q) == q[2] for q in tree.observed)
    assert tree.observed[1][2] is None and tree.observed[3][2] is False


def test_changes_key_tells_paths_contents_and_absence_apart():
    a, b = b"x = 1\n", b"x = 2\n"
    keys = {changes_key(c) for c in ({MOD: (a, b)}, {MOD: (b, a)}, {MOD: (None, b)}, {MOD: (a, None)},
                                     {"vllm/other.py": (a, b)}, {MOD: (a, b), "vllm/other.py": (a, b)})}
    assert len(keys) == 6
    assert changes_key({MOD: (a, b), "vllm/o.py": (a, a)}) == changes_key({"vllm/o.py": (a, a), MOD: (a, b)})


def test_the_memo_keeps_a_bounded_number_of_results():
    memo = DriftMemo(keys=2, per_key=2)
    tree = VllmTree({}.get)
    for i in range(3):
        memo.store(b"k", [("read", f"vllm/m{i}.py", b"never")], i)  # questions this tree answers otherwise
        memo.store(b"k", [], f"always {i}")
    assert memo.lookup(b"k", tree) == "always 2"
    memo.store(b"k2", [], 1)
    memo.store(b"k3", [], 2)
    assert memo.lookup(b"k", tree) is None and memo.lookup(b"k3", tree) == 2  # the oldest key went
