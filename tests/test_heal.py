"""The nightly job's self-healing (ci/nightly_check.py --heal, sparkmods.heal) and the step that
opens what it prepared (ci/open_proposals.py), fast tier: a one-mod repository in git, a local
bare repository standing in for GitHub, a loopback package index serving a release the mod
applies to and a newer one that breaks it, the real job in a subprocess, and a stand-in `gh`
on PATH that records what it was asked to open. The mod's runtime test is a real pytest file
in the repository that applies the healed mod with its run.sh to the new wheel's files and
runs the patched code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from healrepo import fake_gh, git
from modfactory import ORIGINAL, TARGET, make_mod
from nightlyrepo import add_commit, serve
from wheelindex import make_wheel

pytestmark = pytest.mark.usefixtures("fresh_cache")

REPO = Path(__file__).resolve().parents[1]
WHEEL = "vllm-{v}-cp38-abi3-manylinux_2_28_x86_64.whl"
# Upstream changes the def line two lines above the mod's insertion point: GNU patch's context
# no longer matches, the three-way rebase places the edit exactly.
RENAMED = ORIGINAL.replace("    def forward(self, x):\n", "    def forward(self, x, scale=1):\n")
# Upstream folds both statements around the mod's insertion into one: no place left, a person decides.
REWRITTEN = ORIGINAL.replace("        y = x * 2\n        return y\n", "        return x * 2\n")
# Upstream changes the statement the mod inserts after: the rebase places the edit after it, and
# only running the code shows the result is no longer the mod's (3 * 3 + 1, not 7).
TRIPLED = ORIGINAL.replace("        y = x * 2\n", "        y = x * 3\n")
RUNTIME_TEST = '''\
"""The demo mod's runtime test: its run.sh on the wheel's files, then the patched code runs."""
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm_runtime


def test_demo_mod_adds_one(tmp_path):
    mods = Path(os.environ["SPARKMODS_RUNTIME_MODS"])
    assert os.environ["SPARKMODS_RUNTIME_DEPS"] == "0.19.1"
    zipfile.ZipFile(os.environ["SPARKMODS_RUNTIME_WHEEL"]).extractall(tmp_path / "site")
    done = subprocess.run(["bash", str(mods / "demo" / "run.sh")], capture_output=True, text=True,
                          env={**os.environ, "PYTHON_ROOT": str(tmp_path / "site"), "WORKSPACE_DIR": str(tmp_path)})
    assert done.returncode == 0 and "applied variant" in done.stdout, done.stdout + done.stderr
    assert os.environ["SPARKMODS_RUNTIME_VLLM"] in done.stdout
    code = (tmp_path / "site" / "vllm/model_executor/layers/demo.py").read_text().replace("import torch\\n", "")
    scope = {}
    exec(code, scope)
    assert scope["Demo"](1).forward(3) == EXPECTED
'''


class World:
    """The repository, its bare remote, the index and the job's outputs."""

    def __init__(self, tmp: Path, index, new_text: str, expected: int) -> None:
        self.tmp, self.index = tmp, index
        self.repo, self.bare, self.out = tmp / "repo", tmp / "github.git", tmp / "out"
        make_mod(self.repo / "mods", "demo", vllm=">=0.19.0", verified='["0.19.1"]')
        index.add(make_wheel(tmp / WHEEL.format(v="0.19.1"), "0.19.1", extra={TARGET: ORIGINAL.encode()}))
        test = self.repo / "tests" / "test_demo_runtime.py"
        test.parent.mkdir(parents=True)
        test.write_text(RUNTIME_TEST.replace("EXPECTED", str(expected)))
        matrix = subprocess.run([str(Path(sys.executable).parent / "sparkmods"), "matrix", "--vllm", "0.19.1",
                                 "--index-url", f"{index.url}/simple", "--mods-dir", str(self.repo / "mods"),
                                 "--out", str(self.repo / "matrix")], capture_output=True, text=True)
        assert matrix.returncode == 0, matrix.stderr
        subprocess.run(["git", "init", "-q", "-b", "main", str(self.repo)], check=True)
        git(self.repo, "add", ".")
        git(self.repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "mods")
        subprocess.run(["git", "clone", "-q", "--bare", str(self.repo), str(self.bare)], check=True)
        git(self.repo, "remote", "add", "origin", str(self.bare))
        index.add(make_wheel(tmp / WHEEL.format(v="0.20.0"), "0.20.0", extra={TARGET: new_text.encode()}))

    def job(self, tests: str = "demo=tests/test_demo_runtime.py", nightly: str = "") -> subprocess.CompletedProcess:
        where = ["--nightly-url", nightly] if nightly else ["--no-nightly"]
        return subprocess.run([sys.executable, str(REPO / "ci" / "nightly_check.py"), *where, "--heal",
                               "--index-url", f"{self.index.url}/simple", "--repo", str(self.repo),
                               "--matrix", str(self.repo / "matrix" / "matrix.json"),
                               "--mods-dir", str(self.repo / "mods"), "--report", str(self.out / "report.md"),
                               "--proposals", str(self.out / "proposals.json"),
                               "--runtime-tests", tests],
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "GITHUB_STEP_SUMMARY": ""})

    def proposals(self) -> List[Dict[str, str]]:
        return json.loads((self.out / "proposals.json").read_text())

    def open(self, **env: str) -> subprocess.CompletedProcess:
        bindir = fake_gh(self.tmp / "bin")
        return subprocess.run([sys.executable, str(REPO / "ci" / "open_proposals.py"), str(self.out / "proposals.json")],
                              cwd=self.repo, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
                                   "GH_LOG": str(self.tmp / "gh.log"), **env})

    def gh_calls(self) -> List[List[str]]:
        log = self.tmp / "gh.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []

    def heal_branches(self) -> List[str]:
        return git(self.repo, "branch", "--list", "sparkmods-heal/*", "--format=%(refname:short)").split()


def _untouched(world: World) -> None:
    """The job's checkout is as it was: no edits, no worktree left behind."""
    assert git(world.repo, "status", "--porcelain") == ""
    assert len(git(world.repo, "worktree", "list").splitlines()) == 1


def test_an_exact_rebase_that_passes_its_tests_becomes_a_pull_request(tmp_path, loopback_index):
    world = World(tmp_path, loopback_index, RENAMED, expected=7)
    done = world.job()
    assert done.returncode == 1, done.stdout + done.stderr  # a break was found
    (pr,) = world.proposals()
    assert pr["kind"] == "pr" and pr["branch"] == "sparkmods-heal/demo-0.20.0"
    assert pr["title"] == "demo: variant v1-0.20.0 for vLLM 0.20.0 (rebased by the nightly job)"
    assert world.heal_branches() == ["sparkmods-heal/demo-0.20.0"]
    _untouched(world)
    branch = "sparkmods-heal/demo-0.20.0"
    changed = git(world.repo, "diff", "--name-only", "main", branch).split()
    assert "mods/demo/mod.toml" in changed and "mods/demo/patches/v1-0.20.0/demo.patch" in changed
    assert "matrix/matrix.json" in changed and "matrix/MATRIX.md" in changed
    toml = git(world.repo, "show", f"{branch}:mods/demo/mod.toml")
    assert 'vllm = ">=0.19.0, <0.20.0"' in toml
    assert 'label = "v1-0.20.0"\nvllm = ">=0.20.0"\npatches = ["patches/v1-0.20.0/demo.patch"]\nverified = ["0.20.0"]' in toml
    assert "runtime tests passed on 0.20.0" in toml
    patch = git(world.repo, "show", f"{branch}:mods/demo/patches/v1-0.20.0/demo.patch")
    assert "     def forward(self, x, scale=1):\n         y = x * 2\n+        y = y + 1  # demo mod\n" in patch
    matrix = json.loads(git(world.repo, "show", f"{branch}:matrix/matrix.json"))
    cells = {(c["mod"], c["vllm"]): (c["status"], c["variant"]) for c in matrix["cells"]}
    assert cells == {("demo", "0.19.1"): ("ok", "v1"), ("demo", "0.20.0"): ("ok", "v1-0.20.0")}
    body = Path(pr["body_file"]).read_text()
    assert "**demo** `conflict` on `pypi:0.20.0`" in body and "`vllm/model_executor/layers/demo.py` hunk 1" in body
    assert "| `patches/v1/demo.patch` | `vllm/model_executor/layers/demo.py` | 1 | 10 | 10 | placed" in body
    assert "no new drift" in body and "`sparkmods check` of the mod on `pypi:0.20.0`: ok" in body
    assert "### Runtime tests on vLLM 0.20.0: 1 passed" in body
    assert "- passed: `tests.test_demo_runtime::test_demo_mod_adds_one`" in body
    assert "- new release column: 0.20.0\n- new cell: demo on vLLM 0.20.0: ok (variant v1-0.20.0)\n" in body
    assert "pull request from branch `sparkmods-heal/demo-0.20.0`" in (world.out / "report.md").read_text()

    opened = world.open()
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout == "pull request https://github.example/spark-vllm-mods/pull/1 opened\n"
    assert git(world.bare, "rev-parse", branch) == git(world.repo, "rev-parse", branch)
    assert world.gh_calls() == [["pr", "create", "--base", "main", "--head", branch, "--title", pr["title"],
                                 "--body-file", pr["body_file"]]]
    again = world.open()  # the next night: the branch is on the remote already
    assert again.returncode == 0 and "already on origin: proposed before, left alone" in again.stdout
    assert len(world.gh_calls()) == 1


def test_a_nightly_that_breaks_the_mod_is_healed_from_its_own_wheel(tmp_path, loopback_index):
    """The newest nightly of a per-commit wheel repository (tests/nightlyrepo.py) instead of a
    release: the variant starts at the dev build, and the runtime test gets that nightly's wheel."""
    world = World(tmp_path, loopback_index, RENAMED, expected=7)
    del loopback_index.wheels[WHEEL.format(v="0.20.0")]  # no new release: only the nightly breaks
    version, commit = "0.20.1.dev3+gabc1234", "abc1234def5678901234567890abcdef12345678"
    wheel = make_wheel(tmp_path / WHEEL.format(v=version), version, extra={TARGET: RENAMED.encode()})
    add_commit(tmp_path / "nightly", commit, wheel, version, nightly=True)
    with serve(tmp_path / "nightly") as base:
        done = world.job(nightly=base)
    assert done.returncode == 1, done.stdout + done.stderr
    (pr,) = world.proposals()
    assert pr["branch"] == "sparkmods-heal/demo-0.20.1.dev3-gabc1234", pr
    toml = git(world.repo, "show", f"{pr['branch']}:mods/demo/mod.toml")
    assert 'vllm = ">=0.19.0, <0.20.1.dev3"' in toml
    assert 'vllm = ">=0.20.1.dev3"' in toml and f'verified = ["{version}"]' in toml
    body = Path(pr["body_file"]).read_text()
    assert f"(vLLM {version}, commit abc1234" in body and "Runtime tests on vLLM 0.20.1.dev3+gabc1234: 1 passed" in body
    assert "- cells re-checked: 1, reused: 0" in body  # the mod's cell on the matrix's one release; no nightly column

def test_a_flagged_rebase_becomes_an_issue_and_proposes_nothing(tmp_path, loopback_index):
    world = World(tmp_path, loopback_index, REWRITTEN, expected=7)
    done = world.job()
    assert done.returncode == 1, done.stdout + done.stderr
    (issue,) = world.proposals()
    assert issue == {"kind": "issue", "title": "demo breaks on vLLM 0.20.0: the rebase needs a person",
                     "body_file": issue["body_file"]}
    assert world.heal_branches() == []
    _untouched(world)
    body = Path(issue["body_file"]).read_text()
    assert "**Nothing was proposed:** the rebase could not place every edit safely" in body
    assert "vllm/model_executor/layers/demo.py: conflict" in body and "hunk 1, base line 10:" in body
    assert "Runtime tests" not in body  # nothing to test
    assert "sparkmods rebase demo --onto 'pypi:0.20.0' --conflicts conflicts/" in body

    opened = world.open(GH_OPEN_ISSUES="[]")
    assert opened.returncode == 0, opened.stderr
    assert world.gh_calls()[-1] == ["issue", "create", "--title", issue["title"], "--body-file", issue["body_file"]]
    known = json.dumps([{"title": issue["title"]}])
    again = world.open(GH_OPEN_ISSUES=known)
    assert "is already open" in again.stdout and world.gh_calls()[-1][:2] == ["issue", "list"]


def test_one_proposal_per_mod_the_oldest_broken_release_first(tmp_path, loopback_index):
    world = World(tmp_path, loopback_index, REWRITTEN, expected=7)
    loopback_index.add(make_wheel(tmp_path / WHEEL.format(v="0.21.0"), "0.21.0", extra={TARGET: REWRITTEN.encode()}))
    done = world.job()
    assert done.returncode == 1, done.stdout + done.stderr
    assert [p["title"] for p in world.proposals()] == ["demo breaks on vLLM 0.20.0: the rebase needs a person"]
    assert "- **demo** on `pypi:0.21.0`: left for after the proposal for `pypi:0.20.0`" in (
        world.out / "report.md").read_text()

def test_a_rebase_whose_runtime_tests_fail_is_not_proposed(tmp_path, loopback_index):
    world = World(tmp_path, loopback_index, TRIPLED, expected=7)
    done = world.job()
    assert done.returncode == 1, done.stdout + done.stderr
    (issue,) = world.proposals()
    assert issue["kind"] == "issue" and world.heal_branches() == []
    _untouched(world)
    body = Path(issue["body_file"]).read_text()
    assert "**Nothing was proposed:** the runtime tests did not pass (1 failed" in body
    assert "- failed: `tests.test_demo_runtime::test_demo_mod_adds_one`" in body
    assert "assert 10 == 7" in body  # pytest's own words, from the test output
    record = json.loads((world.out / "proposals" / "demo-0.20.0.json").read_text())
    assert record["outcome"] == "tests-failed" and record["plan"]["clean"] is True


def test_a_mod_without_runtime_tests_is_not_proposed(tmp_path, loopback_index):
    world = World(tmp_path, loopback_index, RENAMED, expected=7)
    done = world.job(tests="other=tests/test_demo_runtime.py")
    (issue,) = world.proposals()
    assert done.returncode == 1 and issue["kind"] == "issue" and world.heal_branches() == []
    assert "no runtime tests are known for this mod" in Path(issue["body_file"]).read_text()


def test_bad_runtime_tests_option_and_bad_proposals_file_are_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "ci" / "nightly_check.py"), "--no-nightly", "--offline",
                           "--runtime-tests", "nofile"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (2, "nightly_check: error: --runtime-tests 'nofile': expected MOD=FILE\n")
    bad = tmp_path / "proposals.json"
    bad.write_text(json.dumps([{"kind": "pr", "title": "t", "body_file": "b"}]))
    opened = subprocess.run([sys.executable, str(REPO / "ci" / "open_proposals.py"), str(bad)],
                            capture_output=True, text=True, timeout=60)
    assert opened.returncode == 2
    assert opened.stderr == (f"open_proposals: error: {bad}: entry 0 needs kind (pr or issue), title, body_file "
                             "and, for a pr, branch\n")


def test_the_workflow_opens_what_the_job_prepared_with_the_permissions_it_needs():
    text = (REPO / "ci" / "workflows" / "nightly.yml").read_text()
    import yaml

    doc = yaml.safe_load(text)
    assert doc["permissions"] == {"contents": "write", "pull-requests": "write", "issues": "write"}
    steps = doc["jobs"]["check"]["steps"]
    heal = next(s for s in steps if "nightly_check.py" in s.get("run", ""))
    assert "$HEAL" in heal["run"] and "--heal --proposals proposals.json" in heal["env"]["HEAL"]
    opener = next(s for s in steps if "open_proposals.py" in s.get("run", ""))
    assert opener["env"]["GH_TOKEN"] == "${{ github.token }}"
    assert "proposals.json" in opener["if"] and "pull_request" in opener["if"]


def test_set_verified_edits_one_line_and_refuses_what_it_cannot_find():
    from sparkmods.rebase.tomledit import TomlEditError, set_verified

    text = ('schema = 1\n\n[[variant]]\nlabel = "a"\nvllm = ">=0.1"\nverified = ["0.1"]\n\n'
            '# rebased by `sparkmods rebase`\n[[variant]]\nlabel = "b"\nvllm = ">=0.2"\nverified = []  # none yet\n')
    assert set_verified(text, "b", ["0.2"], "tested on 0.2") == text.replace(
        "# rebased by `sparkmods rebase`\n", "# tested on 0.2\n").replace("verified = []  # none yet\n", 'verified = ["0.2"]\n')
    with pytest.raises(TomlEditError, match="no \\[\\[variant\\]\\] table with label 'c'"):
        set_verified(text, "c", ["0.2"], "x")
    split = text.replace('verified = []  # none yet\n', 'verified = [\n  "0.1",\n]\n')
    with pytest.raises(TomlEditError, match=r"variant 'b': no single one-line `verified = \[\.\.\.\]`"):
        set_verified(split, "b", ["0.2"], "x")


def test_a_runtime_test_run_that_overruns_its_limit_is_an_error_never_a_pass(tmp_path):
    from sparkmods.heal import pytest_runner

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_slow.py").write_text(
        "import time\nimport pytest\npytestmark = pytest.mark.vllm_runtime\n\n\ndef test_slow():\n    time.sleep(60)\n")
    run = pytest_runner({"slow": ["tests/test_slow.py"]}, tmp_path, timeout=5)
    got = run(tmp_path, "slow", "0.20.0", None, None)
    assert not got.ok and got.cases[-1] == {"name": "the whole run (stopped at its time limit, 5 s)", "outcome": "error"}
    assert run(tmp_path, "other", "0.20.0", None, None) is None  # no tests known for that mod
