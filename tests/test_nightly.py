"""The nightly CI job end to end, against a loopback copy of vLLM's per-commit wheel repository
serving REAL wheels: the release as published, and a rebuild of it with one vLLM file edited so
that a mod's hunk no longer applies. The job must name the mod, the file and the hunk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from nightlyrepo import add_commit, rebuild_with_edit, serve
from releasewheel import vllm_wheel
from sparkmods.modsdir import mod_dirs
from sparkmods.runtime.manifest import Variant, load_manifest
from sparkmods.runtime.modcheck import variant_patches

pytestmark = pytest.mark.network
REPO = Path(__file__).resolve().parents[1]
RELEASE = "0.19.1"


@pytest.fixture(scope="module")
def release_wheel() -> Path:
    return vllm_wheel(RELEASE)


def _victim(wheel: Path):
    """The first mod with a patch for RELEASE, the file and hunk to break, and the line to edit.

    The line is one of the first hunk's context or removed lines that occurs exactly once in the
    real file, so that editing it can only break that hunk (a bare ``)`` would hit another place).
    """
    with zipfile.ZipFile(wheel) as zf:
        for mod in mod_dirs(REPO / "mods"):
            chosen = load_manifest(mod).select(RELEASE)
            if not (isinstance(chosen, Variant) and chosen.patches):
                continue
            for fp in variant_patches(mod, chosen):
                if fp.is_new:
                    continue
                text = zf.read(fp.path).decode()
                lines = text.splitlines()
                for tag, line in fp.hunks[0].lines:
                    if tag != "+" and line.strip() and lines.count(line) == 1 and text.count(line) == 1:
                        return mod.name, fp.path, line
    pytest.fail(f"no mod patches an existing file of vLLM {RELEASE} with a unique line in its first hunk")


def run_job(base: str, *extra: str, matrix: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "ci" / "nightly_check.py"), "--nightly-url", base,
                           "--matrix", str(matrix), "--mods-dir", str(REPO / "mods"), *extra],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "GITHUB_STEP_SUMMARY": ""})


def test_nightly_job_reports_the_broken_hunk(tmp_path, release_wheel):
    mod, path, line = _victim(release_wheel)
    root = tmp_path / "repo"
    add_commit(root, "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678", release_wheel, RELEASE, nightly=False)
    edited = tmp_path / release_wheel.name
    rebuild_with_edit(release_wheel, edited, path, line.encode(), (line + "  # edited upstream").encode())
    with zipfile.ZipFile(edited) as zf:  # still a valid wheel, CRCs and all
        assert zf.testzip() is None
    add_commit(root, "deadbeef01234567890abcdef0123456789abcde", edited, "0.19.2.dev7+gdeadbeef0", nightly=True)
    matrix = tmp_path / "matrix.json"
    matrix.write_text(json.dumps({"releases": [{"vllm": "99.0.0", "target": "pypi:99.0.0"}]}))
    with serve(root) as base:
        broken = run_job(base, "--report", str(tmp_path / "report.md"), matrix=matrix)
        assert broken.returncode == 1, broken.stdout + broken.stderr
        report = (tmp_path / "report.md").read_text()
        assert f"**{mod}** on `index:{base}/nightly/vllm/#0.19.2.dev7+gdeadbeef0`" in report
        assert f"`{path}` hunk 1" in report
        assert "commit deadbeef0" in report
        assert f"sparkmods rebase {mod} --onto" in report
        clean = run_job(base, "--commit", "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678", matrix=matrix)
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert "Every mod applies to every build checked." in clean.stdout
