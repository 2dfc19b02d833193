"""The community matrix's bookkeeping without Docker: the committed results hold statuses and
counts only, cells are reused only while their inputs are unchanged, the nightly line names the
mods that broke, the static and run verdicts are compared as documented, and loose files
become mod folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scriptload import load_script
from sparkmods.community.cli import loose_mod
from sparkmods.community.runsh import read_mod
from sparkmods.community.sandbox import APPLIED, FAILED, NO_CHANGE, RUN_STATUSES, SITE_DIR, agrees
from sparkmods.nightly import community_broke

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "ci" / "bench" / "results"
bench = load_script(REPO / "ci" / "bench" / "bench_community.py")


def test_committed_matrix_holds_statuses_and_counts_only():
    doc = json.loads((RESULTS / "community-any-cpu.json").read_text())
    versions = [r["vllm"] for r in doc["releases"]]
    names = [m["name"] for m in doc["mods"]]
    assert len(versions) >= 20 and versions[0] == "0.18.0" and len(names) == len(set(names))
    assert {(c["mod"], c["vllm"]) for c in doc["cells"]} == {(m, v) for m in names for v in versions}
    allowed = {"mod", "vllm", "status", "exit_code", "changed", "seconds", "static", "agrees"}
    for cell in doc["cells"]:
        assert set(cell) <= allowed and cell["status"] in RUN_STATUSES
        assert isinstance(cell["changed"], int) and (cell["exit_code"] is None or isinstance(cell["exit_code"], int))
    assert doc["static_agreement"]["agree"] == doc["static_agreement"]["cells"]  # the two readings agree
    assert sum(doc["counts"].values()) == len(doc["cells"])
    md = (RESULTS / "community-any-cpu.md").read_text()
    assert f"{len(doc['cells'])} cells" in md and "whole matrix" in md
    assert not list(RESULTS.glob("community*/**/*.patch")) and not (RESULTS / "community-matrix").exists()


def _doc(cells, trees=None, shas=None, sandbox="s1"):
    return {"sandbox": sandbox, "mods": [{"name": n, "tree": t} for n, t in (trees or {"a": "t1", "b": "t2"}).items()],
            "releases": [{"vllm": v, "wheel_sha256": s} for v, s in (shas or {"0.1": "x", "0.2": "y"}).items()],
            "cells": [{"mod": m, "vllm": v, "status": s} for m, v, s in cells],
            "mirror": {"repository": "spark-arena/eugr-recipes", "commit": "0123456789abcdef"}}


def test_cells_are_reused_only_while_mod_release_and_sandbox_are_unchanged():
    prev = _doc([("a", "0.1", APPLIED), ("a", "0.2", APPLIED), ("b", "0.1", FAILED), ("b", "0.2", FAILED)])
    shas = {"0.1": "x", "0.2": "y"}
    assert len(bench.reusable(prev, {"a": "t1", "b": "t2"}, shas, "s1")) == 4
    assert set(bench.reusable(prev, {"a": "t1", "b": "CHANGED"}, shas, "s1")) == {("a", "0.1"), ("a", "0.2")}
    assert set(bench.reusable(prev, {"a": "t1", "b": "t2"}, {"0.1": "x", "0.2": "z"}, "s1")) == {("a", "0.1"),
                                                                                                 ("b", "0.1")}
    assert bench.reusable(prev, {"a": "t1", "b": "t2"}, {"0.1": None, "0.2": None}, "s1") == {}
    assert bench.reusable(prev, {"a": "t1", "b": "t2"}, shas, "s2") == {}


def test_nightly_line_names_the_community_mods_that_broke():
    doc = _doc([("a", "0.1", APPLIED), ("a", "0.2", FAILED), ("b", "0.1", APPLIED), ("b", "0.2", APPLIED)])
    line = community_broke(doc)
    assert "1 broke on 0.2 (they changed vLLM 0.1): a (failed)." in line and "0123456789ab" in line
    doc = _doc([("a", "0.1", NO_CHANGE), ("a", "0.2", FAILED), ("b", "0.1", APPLIED), ("b", "0.2", APPLIED)])
    assert "none that changed vLLM 0.1 stopped on 0.2" in community_broke(doc)
    assert community_broke(None) == ""


@pytest.mark.parametrize("static, run, agree", [
    ("ok", APPLIED, True), ("ok-offset", APPLIED, True), ("skipped", NO_CHANGE, True), ("skipped", APPLIED, True),
    ("applied", NO_CHANGE, True), ("conflict", FAILED, True), ("missing-file", FAILED, True),
    ("ok", NO_CHANGE, False), ("conflict", APPLIED, False), ("skipped", FAILED, False),
])
def test_static_and_run_verdicts_agree_as_documented(static, run, agree):
    assert agrees(static, run) is agree


def test_loose_files_become_mod_folders(tmp_path: Path):
    diff = tmp_path / "my fix.diff"
    diff.write_text("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n")
    folder = loose_mod(diff, tmp_path / "scratch")
    mod = read_mod(folder)
    assert folder.name == "my-fix" and mod.checkable and mod.steps[0].tool == "patch"
    assert f"-d {SITE_DIR}" in (folder / "run.sh").read_text()
    script = tmp_path / "edit.sh"
    script.write_text("#!/bin/bash\nsed -i s/a/b/ /x\n")
    folder = loose_mod(script, tmp_path / "scratch2")
    assert (folder / "run.sh").read_bytes() == script.read_bytes() and not read_mod(folder).checkable


def test_a_patch_behind_a_condition_only_running_can_decide_is_not_read_statically(tmp_path: Path):
    """`if <function or grep>; then skip; elif patch --dry-run ...` patches or skips by what
    vLLM holds: the static reading must say so instead of predicting a conflict."""
    folder = tmp_path / "guarded"
    folder.mkdir()
    (folder / "fix.diff").write_text("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n")
    body = (f"#!/bin/bash\nset -e\nSP={SITE_DIR}\n"
            "if {cond}; then\n  echo present\nelif patch --dry-run -p1 -d $SP < fix.diff; then\n"
            "  patch -p1 -d $SP < fix.diff\nelse\n  exit 1\nfi\n")
    (folder / "run.sh").write_text(body.format(cond="grep -q 'a = 2' $SP/vllm/x.py"))
    mod = read_mod(folder)
    assert not mod.checkable and mod.blockers[0].kind == "unresolved" and mod.blockers[0].line == 4
    (folder / "run.sh").write_text(body.format(cond="! command -v git >/dev/null"))
    assert read_mod(folder).checkable  # a question about the container's tools decides nothing about vLLM
