"""The community fixtures on real vLLM releases from PyPI: each step's verdict must agree
with the real tool its run.sh calls (GNU patch or git apply, with run.sh's own -p, -R, -d,
--directory and --exclude) on the release's real file laid out as in the community image."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import List

import pytest

from communitytree import FIXTURES, GLM
from sparkmods.community.judge import judge
from sparkmods.community.runsh import read_mod
from sparkmods.sources import open_targets

pytestmark = pytest.mark.network

SITE = "usr/local/lib/python3.12/dist-packages"
# fixture -> the command its run.sh runs for each step, with {root} for the container's /
COMMANDS = {
    "patch-d-site": [["patch", "-p1", "-d", "{root}/" + SITE, "-i", "{mod}/fix.patch"]],
    "patch-root-skipping": [["patch", "-p1", "-d", "{root}", "-i", "{mod}/guard.patch"]],
    "dry-run-guard": [["patch", "-p1", "-d", "{root}/" + SITE, "-i", "{mod}/fix.diff"]],
    "reverse-upstream": [["patch", "-R", "-p1", "-d", "{root}/" + SITE, "-i", "{mod}/islice.patch"]],
    "git-apply-directory": [["git", "-C", "{root}/" + SITE, "apply", "--exclude=vllm/tests/*", "--directory=vllm",
                             "{mod}/scales.diff"]],
    "stacked-loop": [["git", "-C", "{root}/" + SITE, "apply", "-p1", "{mod}/01-guard.patch"],
                     ["git", "-C", "{root}/" + SITE, "apply", "-p1", "{mod}/02-comment.patch"]],
    "stacked-one-file": [["git", "-C", "{root}/" + SITE, "apply", "{mod}/both.patch"]],
}


def run_tool(cmd: List[str], root: Path, mod: Path) -> "tuple[bool, bool]":
    """Run it for real (a new session has no terminal: GNU patch's questions get their default
    [n]): (exit 0, and GNU patch needed fuzz, i.e. matched with context lines ignored)."""
    args = [a.format(root=root, mod=mod) for a in cmd]
    proc = subprocess.run(args, capture_output=True, text=True, start_new_session=True, stdin=subprocess.DEVNULL)
    return proc.returncode == 0, "with fuzz" in proc.stdout


@pytest.mark.parametrize("version", ["0.18.0", "0.21.0", "0.33.0"])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_step_verdicts_agree_with_the_real_tools(tmp_path: Path, name: str, version: str):
    (source,) = open_targets(f"pypi:{version}")
    mod = read_mod(FIXTURES / name)
    result = judge(mod, source)
    target = tmp_path / SITE / GLM
    target.parent.mkdir(parents=True)
    target.write_bytes(source.read(GLM))
    verdicts = []
    for cmd, step in zip(COMMANDS[name], result.steps):
        applies, fuzz = run_tool(cmd, tmp_path, FIXTURES / name)  # really applied: the next step sees it
        # a hunk GNU patch places by ignoring context lines applies for run.sh too (the sandbox's run
        # says so): ours says it applies, and says it needed fuzz
        verdicts.append((applies, step["status"] in ("ok", "ok-offset"), fuzz))
        assert ("fuzz" in step["reason"]) == fuzz, step
        if not applies:
            break
    assert verdicts and all(tool == ours for tool, ours, _ in verdicts), (result.status, result.reason, verdicts)
