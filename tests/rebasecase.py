"""Rebase cases for the rebase and drift tests: an in-memory vLLM tree, diffs, and a one-call
rebase that also proves the regenerated patch with the engine."""

from __future__ import annotations

import difflib
import textwrap
from typing import Dict, List

from sparkmods.rebase import RebaseResult, rebase_patches
from sparkmods.runtime.engine import EXACT, OK, plan
from sparkmods.runtime.udiff import parse_patch
from sparkmods.sources.base import MemorySource
from udiffref import assert_parsed_alike

PATH = "vllm/model_executor/layers/demo.py"


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def udiff(path: str, old: str, new: str, n: int = 3) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}", n=n))


def rebase(base: Dict[str, str], patched: Dict[str, str], onto: Dict[str, str]) -> RebaseResult:
    """Rebase the patch base -> patched (one diff per changed path) onto `onto`."""
    text = "".join(udiff(p, base.get(p, ""), patched[p]) for p in sorted(patched) if patched[p] != base.get(p))
    return rebase_patches(parse_patch(text), MemorySource("0.1.0", base), MemorySource("0.2.0", onto))


def carried(result: RebaseResult, onto: Dict[str, str]) -> Dict[str, str]:
    """onto after the rebased patch, applied by the engine; every hunk must be exact, and unidiff
    must read the patch as the runtime does."""
    assert result.clean, result.to_dict()
    out = dict(onto)
    if not result.patch:
        return out
    assert_parsed_alike(result.patch, "the rebased patch")
    for res in plan(parse_patch(result.patch), MemorySource("onto", onto).read):
        assert res.status == OK and all(h.outcome == EXACT for h in res.hunks), res.to_dict()
        out[res.path] = res.after.decode() if res.after is not None else None
    return out


def one(base: str, patched: str, onto: str, path: str = PATH) -> RebaseResult:
    return rebase({path: base}, {path: patched}, {path: onto})


def rules(result: RebaseResult) -> List[str]:
    return [o.rule or o.outcome for f in result.files for p in f.parts for o in p.outcomes]
