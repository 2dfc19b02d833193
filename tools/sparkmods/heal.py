"""Self-healing: when a new vLLM breaks a mod, carry the mod's nearest variant onto it and
propose the new variant only once the rebase is exact, the check (drift included) is green
and the mod's runtime tests pass on that vLLM; otherwise describe what needs a person.

The nightly job (ci/nightly_check.py --heal) calls `heal_break` for each broken mod and
target inside a git worktree of its own branch; `Heal.body()` is the pull request or issue
text, with the evidence: each edit of each patch and where it went, the drift verdicts, the
runtime tests run and the matrix cells that changed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence

from sparkmods.checking.batch import check_mods
from sparkmods.errors import SparkmodsError
from sparkmods.matrix.build import build_counted, sort_sources
from sparkmods.matrix.compare import compare
from sparkmods.matrix.document import JSON_NAME, rendered, write_all
from sparkmods.modsdir import load, mod_dirs
from sparkmods.outputfile import write_into
from sparkmods.rebase.modrebase import ModPlan, plan_mod, write_plan
from sparkmods.rebase.report import drift_lines, result_lines
from sparkmods.rebase.tomledit import TomlEditError, set_verified
from sparkmods.runtime.manifest import MANIFEST_TOML, Manifest, ManifestError, load_manifest
from sparkmods.runtime.modcheck import GREEN
from sparkmods.runtime.pep440 import Version
from sparkmods.sources import open_targets
from sparkmods.sources.index import fetch_page
from sparkmods.sources.spec import default_index
from sparkmods.sync import sync

if TYPE_CHECKING:
    from sparkmods.sources.base import VllmSource

PROPOSED, FLAGGED, TESTS_FAILED, UNTESTED = "proposed", "flagged", "tests-failed", "no-runtime-tests"

# What the runtime test files read (tests/vllmenv.py): the folder holding the mods to test,
# the one vLLM version to test them on and, when that version is not installable from PyPI,
# its wheel and the PyPI release whose dependencies it is installed with.
ENV_MODS, ENV_VLLM, ENV_WHEEL, ENV_DEPS = ("SPARKMODS_RUNTIME_MODS", "SPARKMODS_RUNTIME_VLLM",
                                          "SPARKMODS_RUNTIME_WHEEL", "SPARKMODS_RUNTIME_DEPS")


@dataclass
class TestRun:
    """The mod's runtime tests on one vLLM: the command and what pytest's JUnit report says."""

    command: List[str]
    seconds: float
    cases: List[Dict[str, str]]  # {"name", "outcome"}: passed, failed, error, skipped
    tail: str = ""

    def count(self, outcome: str) -> int:
        return sum(1 for c in self.cases if c["outcome"] == outcome)

    @property
    def ok(self) -> bool:
        """Passed: at least one test ran and none failed, errored or was skipped."""
        return bool(self.cases) and all(c["outcome"] == "passed" for c in self.cases)

    def summary(self) -> str:
        parts = [f"{self.count(o)} {o}" for o in ("passed", "failed", "error", "skipped") if self.count(o)]
        return (", ".join(parts) or "no tests ran") + f" in {self.seconds:.0f} s"

    def to_dict(self) -> dict:
        return {"command": self.command, "seconds": round(self.seconds, 1), "ok": self.ok, "cases": self.cases}


TestRunner = Callable[[Path, str, str, "Optional[Path]", "Optional[str]"], Optional[TestRun]]


@dataclass
class Heal:
    """What the nightly job did about one mod broken on one target."""

    mod: str
    target: str
    version: str
    commit: Optional[str]
    status: str  # the break: conflict, missing-file, drift, no-variant
    break_lines: List[str]
    outcome: str = FLAGGED
    plan: Optional[ModPlan] = None
    problem: str = ""  # why nothing was proposed, in one line
    check: str = ""  # the healed mod's check on the target (status and detail)
    tests: Optional[TestRun] = None
    matrix: List[str] = field(default_factory=list)
    written: List[str] = field(default_factory=list)

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{self.mod}-{self.version}")

    @property
    def branch(self) -> str:
        return f"sparkmods-heal/{self.slug}"

    @property
    def title(self) -> str:
        if self.outcome == PROPOSED and self.plan is not None:
            return f"{self.mod}: variant {self.plan.label} for vLLM {self.version} (rebased by the nightly job)"
        return f"{self.mod} breaks on vLLM {self.version}: the rebase needs a person"

    def body(self) -> str:
        return _pr_body(self) if self.outcome == PROPOSED else _issue_body(self)

    def to_dict(self) -> dict:
        return {"mod": self.mod, "target": self.target, "version": self.version, "commit": self.commit,
                "status": self.status, "outcome": self.outcome, "problem": self.problem, "check": self.check,
                "plan": self.plan.to_dict() if self.plan else None,
                "tests": self.tests.to_dict() if self.tests else None, "matrix": self.matrix,
                "written": self.written, "branch": self.branch if self.outcome == PROPOSED else None,
                "title": self.title}


# ---------------------------------------------------------------- the heal itself
def heal_break(mod_dir: Path, onto: VllmSource, open_release: Callable[[str], VllmSource], *, status: str,
               break_lines: Sequence[str], run_tests: Optional[TestRunner] = None,
               matrix_dir: Optional[Path] = None, index_url: Optional[str] = None) -> Heal:
    """Rebase the mod in mod_dir onto the source `onto`; write the variant, test it, mark it
    verified and regenerate the matrix only while every step succeeds. mod_dir must be a
    scratch copy (a worktree): a flagged heal leaves its partial writes for the caller to drop."""
    manifest = load(mod_dir)
    heal = Heal(manifest.name, onto.label, onto.version, onto.commit, status, list(break_lines))
    try:
        heal.plan = plan_mod(mod_dir, manifest, onto, open_release)
    except SparkmodsError as exc:
        heal.problem = str(exc)
        return heal
    plan = heal.plan
    if not plan.clean:
        heal.problem = "the rebase could not place every edit safely"
        return heal
    if not plan.carried:
        heal.problem = f"vLLM {plan.onto} already has every change of the mod: consider an [upstream] section"
        return heal
    try:
        return _write_and_prove(heal, mod_dir, manifest, onto, run_tests, matrix_dir, index_url)
    except SparkmodsError as exc:
        heal.outcome, heal.problem = FLAGGED, str(exc)
        return heal


def _write_and_prove(heal: Heal, mod_dir: Path, manifest: Manifest, onto: VllmSource, run_tests: Optional[TestRunner],
                     matrix_dir: Optional[Path], index_url: Optional[str]) -> Heal:
    """heal_break's steps after an exact plan: write, check, test, mark verified, matrix."""
    plan = heal.plan
    assert plan is not None
    heal.written = write_plan(mod_dir, manifest, plan, write_into, onto.read)
    sync(mod_dir)
    (row,) = check_mods([mod_dir], [onto])
    heal.check = row.result.status + (f": {row.result.reason}" if row.result.reason else "")
    if row.result.status not in GREEN or row.result.variant != plan.label:
        heal.problem = f"the new variant does not check green on {onto.label} ({heal.check})"
        return heal
    if run_tests is None:
        heal.outcome, heal.problem = UNTESTED, "no runtime tests are known for this mod: nothing is proposed untested"
        return heal
    with tempfile.TemporaryDirectory(prefix="sparkmods-heal-wheel-") as tmp:
        heal.tests = run_tests(mod_dir.parent, manifest.name, onto.version, *_wheel_for(onto, index_url, Path(tmp)))
    if heal.tests is None:
        heal.outcome, heal.problem = UNTESTED, "no runtime tests are known for this mod: nothing is proposed untested"
        return heal
    if not heal.tests.ok:
        heal.outcome, heal.problem = TESTS_FAILED, f"the runtime tests did not pass ({heal.tests.summary()})"
        return heal
    mark_verified(mod_dir, plan, f"rebased by the nightly job from variant {plan.variant.label!r} (vLLM "
                                 f"{plan.base}) onto {plan.onto}; runtime tests passed on {plan.onto}")
    sync(mod_dir)
    if matrix_dir is not None:
        heal.matrix = regenerate_matrix(matrix_dir, mod_dir.parent, onto, index_url)
    heal.outcome = PROPOSED
    return heal


def mark_verified(mod_dir: Path, plan: ModPlan, comment: str) -> None:
    """Set the new variant's `verified` to the release its tests passed on (minimal edit)."""
    path = mod_dir / MANIFEST_TOML
    try:
        text = set_verified(path.read_text(encoding="utf-8"), plan.label, [plan.onto], comment)
    except TomlEditError as exc:
        raise SparkmodsError(f"{path}: {exc}") from None
    write_into(path, text)
    try:
        manifest = load_manifest(mod_dir)
    except ManifestError as exc:
        raise SparkmodsError(f"{path}: after marking {plan.onto} verified: {exc}") from None
    if [v.verified for v in manifest.variants if v.label == plan.label] != [[plan.onto]]:
        raise SparkmodsError(f"{path}: marking {plan.onto} verified did not take")


def _wheel_for(onto: VllmSource, index_url: Optional[str], folder: Path) -> "tuple[Optional[Path], Optional[str]]":
    """(wheel file, downloaded into folder; PyPI release for its dependencies) when the runtime
    tests cannot install `vllm==version` from PyPI (a nightly, or a release of another index);
    else (None, None)."""
    if onto.label.startswith("pypi:") and not (index_url or os.environ.get("SPARKMODS_INDEX_URL")):
        return None, None
    url = getattr(onto, "url", None)
    if not url:
        raise SparkmodsError(f"{onto.label}: no wheel URL to install it from for the runtime tests")
    version = Version(onto.version)
    below = [v for v in fetch_page(default_index(index_url), offline=False).versions()
             if not Version(str(v)).is_prerelease and Version(str(v)) < version]
    if not below:
        raise SparkmodsError(f"{onto.label}: no release below {version} to take the runtime tests' dependencies from")
    dest = folder / url.rsplit("/", 1)[-1].split("#")[0]
    with urllib.request.urlopen(url, timeout=600) as answer, open(dest, "wb") as fh:
        shutil.copyfileobj(answer, fh, 1 << 20)
    return dest, str(max(below, key=lambda v: Version(str(v))))


# ---------------------------------------------------------------- runtime tests
def pytest_runner(tests_by_mod: Dict[str, List[str]], repo: Path, python: str = sys.executable,
                  timeout: float = 3600) -> TestRunner:
    """A TestRunner that runs the mod's vllm_runtime test files with pytest in repo, limited
    to one vLLM and to the mods folder being healed (the ENV_* variables)."""
    def run(mods: Path, mod: str, version: str, wheel: Optional[Path], deps: Optional[str]) -> Optional[TestRun]:
        files = tests_by_mod.get(mod)
        if not files:
            return None
        with tempfile.TemporaryDirectory(prefix="sparkmods-heal-tests-") as tmp:
            report = Path(tmp) / "junit.xml"
            cmd = [python, "-m", "pytest", "-m", "vllm_runtime", "-q", "-p", "no:cacheprovider",
                   f"--junitxml={report}", *files]
            env = {**os.environ, ENV_MODS: str(mods), ENV_VLLM: version}
            for key, value in ((ENV_WHEEL, wheel), (ENV_DEPS, deps)):
                if value is not None:
                    env[key] = str(value)
                else:
                    env.pop(key, None)
            start = time.monotonic()
            overran = False
            try:
                done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)
                output = done.stdout + done.stderr
            except subprocess.TimeoutExpired as exc:
                overran, output = True, _text(exc.stdout) + _text(exc.stderr)
            seconds = time.monotonic() - start
            cases = _junit_cases(report) if report.is_file() else []
            if overran:  # an unfinished run proves nothing, whatever passed before the limit
                cases.append({"name": f"the whole run (stopped at its time limit, {timeout:.0f} s)", "outcome": "error"})
        shown = [c if c != python else "python" for c in cmd if not c.startswith("--junitxml")]
        return TestRun(shown, seconds, cases, output[-4000:])
    return run


def _text(data: "str | bytes | None") -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data or ""


def _junit_cases(path: Path) -> List[Dict[str, str]]:
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = "passed"
        for child, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            if case.find(child) is not None:
                outcome = name
        cases.append({"name": f"{case.get('classname', '')}::{case.get('name', '')}", "outcome": outcome})
    return cases


# ---------------------------------------------------------------- the matrix
def regenerate_matrix(matrix_dir: Path, mods_root: Path, onto: VllmSource, index_url: Optional[str]) -> List[str]:
    """Rewrite matrix_dir for the mods in mods_root on the matrix's own targets (plus onto when
    it is a release): cells whose inputs did not change are reused. Returns what changed."""
    path = matrix_dir / JSON_NAME
    if not path.is_file():
        return [f"{path} does not exist: no matrix to regenerate"]
    previous = json.loads(path.read_text(encoding="utf-8"))
    labels = [r["target"] for r in previous.get("releases", [])]
    if onto.label.startswith("pypi:") and onto.label not in labels:
        labels.append(onto.label)
    sources = [onto if label == onto.label else open_targets(label, index_url=index_url)[0] for label in labels]
    built = build_counted(mod_dirs(mods_root), sort_sources(sources), previous)
    write_all(matrix_dir, rendered(built.doc))
    diff = compare(previous, built.doc)
    lines = [f"new release column: {v}" for v in diff.new_releases]
    lines += [f"new cell: {c['mod']} on vLLM {c['vllm']}: {c['status']}" + (f" (variant {c['variant']})" if c["variant"] else "")
              for c in built.doc["cells"] if c["vllm"] in diff.new_releases]
    lines += [f"fixed: {x}" for x in diff.fixes] + [f"changed: {x}" for x in diff.changed]
    lines += [f"REGRESSION: {x}" for x in diff.regressions]
    lines.append(f"cells re-checked: {built.rechecked}, reused: {built.reused}")
    return lines


# ---------------------------------------------------------------- the texts
def _edit_rows(plan: ModPlan) -> List[str]:
    rows = ["| patch | file | hunk | base line | onto line | how |", "|---|---|---:|---:|---:|---|"]
    for p in plan.patches:
        for f in p.result.files:
            for part in f.parts:
                where = f"`{f.path}`" + (f" -> `{part.target}` (file moved)" if part.target != f.path else "")
                for o in part.outcomes:
                    onto_line = "" if o.onto_start is None else str(o.onto_start + 1)
                    how = o.outcome + (f" ({o.rule})" if o.rule else "") + (f": {o.reason}" if o.reason else "")
                    rows.append(f"| `{p.source}` | {where} | {o.edit.hunk} | {o.edit.base_start + 1} | {onto_line} "
                                f"| {how} |")
            if not f.parts:
                rows.append(f"| `{p.source}` | `{f.path}` | | | | {f.status}{': ' + f.reason if f.reason else ''} |")
    return rows


def _report_lines(plan: ModPlan) -> List[str]:
    lines = []
    for p in plan.patches:
        where = "unchanged, reused" if p.target == p.source else f"-> {p.target}"
        lines.append(f"{p.source} {where}: {'ok' if p.clean else 'NOT SAFE'}")
        lines += result_lines(p.result, "  ") + drift_lines(p.drift, "  ")
    return lines


def _head(heal: Heal) -> List[str]:
    where = f"`{heal.target}` (vLLM {heal.version}" + (f", commit {heal.commit}" if heal.commit else "") + ")"
    return [f"The nightly job found **{heal.mod}** `{heal.status}` on {where}:", "",
            *heal.break_lines, ""]


def _pr_body(heal: Heal) -> str:
    plan = heal.plan
    assert plan is not None and heal.tests is not None
    out = _head(heal)
    out += [f"This pull request adds variant `{plan.label}` (`vllm = \"{plan.range}\"`, verified on {plan.onto}), "
            f"rebased from variant `{plan.variant.label}` as verified on vLLM {plan.base}."]
    out += [f"Variant `{k}`: `{a}` -> `{b}`." for k, (a, b) in plan.cuts.items()]
    out += ["", "### Where each edit went", ""] + _edit_rows(plan)
    out += ["", "### Drift verdicts", ""]
    for p in plan.carried:
        out.append(f"- `{p.target}`: " + ("no new drift (patched files parse, imported vLLM names exist, overridden "
                                          "and called signatures compatible)" if not p.drift else
                                          "; ".join(str(f) for f in p.drift)))
    out.append(f"- `sparkmods check` of the mod on `{heal.target}`: {heal.check}")
    out += ["", f"### Runtime tests on vLLM {plan.onto}: {heal.tests.summary()}", "",
            f"`{' '.join(heal.tests.command)}` with {ENV_VLLM}={plan.onto}", ""]
    out += [f"- {c['outcome']}: `{c['name']}`" for c in heal.tests.cases]
    out += ["", "### Matrix", ""] + [f"- {line}" for line in heal.matrix or ["not regenerated"]]
    out += ["", "### Files", ""] + [f"- `mods/{heal.mod}/{w}`" for w in heal.written]
    out += ["", "Generated by `ci/nightly_check.py --heal`; nothing here was edited by hand."]
    return "\n".join(out) + "\n"


def _issue_body(heal: Heal) -> str:
    out = _head(heal) + [f"**Nothing was proposed:** {heal.problem}.", ""]
    if heal.plan is not None:
        out += ["### Rebase report", "", "```"] + _report_lines(heal.plan) + ["```", ""]
        out += ["### Where each edit went", ""] + _edit_rows(heal.plan) + [""]
    if heal.tests is not None:
        out += [f"### Runtime tests on vLLM {heal.version}: {heal.tests.summary()}", ""]
        out += [f"- {c['outcome']}: `{c['name']}`" for c in heal.tests.cases if c["outcome"] != "passed"]
        out += ["", "```", heal.tests.tail.strip()[-3000:], "```", ""]
    out += [f"To try by hand: `sparkmods rebase {heal.mod} --onto '{heal.target}' --conflicts conflicts/`", ""]
    out.append("Generated by `ci/nightly_check.py --heal`.")
    return "\n".join(out) + "\n"
