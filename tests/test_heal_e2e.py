"""The nightly heal end to end on a real mod, a real vLLM and a real upstream change (markers
network and vllm_runtime: a vLLM wheel from PyPI, and vLLM 0.19.1 installed by vllmenv).

A "next release", 0.19.2, is vLLM 0.19.1's wheel with one file replaced by the one vLLM 0.20.0
shipped: quantization/inc.py, whose upstream rewrite makes hybrid-int4-fp8's v0.18.0 variant
conflict. A loopback package index (a static folder with Range support, as a file host serves
it) lists 0.19.1 and 0.19.2. The repository is a git checkout holding that mod, the tests and
a matrix of 0.19.1; a local bare repository stands in for GitHub, and a `gh` on PATH that only
records its arguments stands in for GitHub's CLI. The real job runs: it must find the conflict,
rebase the mod onto 0.19.2, run the mod's own runtime tests on 0.19.2 (0.19.1's environment with
the 0.19.2 wheel's files), commit the variant and the matrix on a branch, and
ci/open_proposals.py must push that branch to the bare repository and ask gh for the pull request.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from healrepo import fake_gh, git
from nightlyrepo import rebuild_with_edit, serve
from releasewheel import vllm_wheel

pytestmark = [pytest.mark.network, pytest.mark.vllm_runtime]
REPO = Path(__file__).resolve().parents[1]
MOD = "hybrid-int4-fp8"
INC = "vllm/model_executor/layers/quantization/inc.py"
NEXT = "0.19.2"
BRANCH = f"sparkmods-heal/{MOD}-{NEXT}"


def publish(index: Path, wheels: "list[Path]") -> None:
    """A PEP 503 project page for vllm with each wheel's sha256, the wheels beside it."""
    files = index / "files"
    files.mkdir(parents=True)
    links = []
    for wheel in wheels:
        shutil.copyfile(wheel, files / wheel.name)
        digest = hashlib.sha256((files / wheel.name).read_bytes()).hexdigest()
        links.append(f'<a href="../../files/{wheel.name}#sha256={digest}">{wheel.name}</a><br/>')
    page = index / "simple" / "vllm"
    page.mkdir(parents=True)
    (page / "index.html").write_text("<!DOCTYPE html>\n<html><body>\n" + "\n".join(links) + "\n</body></html>\n")


def test_the_nightly_job_proposes_a_tested_variant_for_a_real_upstream_change(tmp_path: Path) -> None:
    from sparkmods.sources import open_targets

    released = vllm_wheel("0.19.1")
    (upstream,) = open_targets("pypi:0.20.0")
    new_inc = upstream.read(INC)
    assert new_inc is not None
    next_wheel = tmp_path / released.name.replace("0.19.1", NEXT)
    old_inc = zipfile.ZipFile(released).read(INC)
    rebuild_with_edit(released, next_wheel, INC, old_inc, new_inc)
    _retag(next_wheel, NEXT)
    publish(tmp_path / "index", [released, next_wheel])

    repo = tmp_path / "repo"
    shutil.copytree(REPO / "mods" / MOD, repo / "mods" / MOD, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "tests", repo / "tests", ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    shutil.copyfile(REPO / "pyproject.toml", repo / "pyproject.toml")
    env = {**os.environ, "SPARKMODS_CACHE_DIR": str(tmp_path / "cache"), "GITHUB_STEP_SUMMARY": ""}
    env.pop("SPARKMODS_INDEX_URL", None)
    sparkmods = str(Path(sys.executable).parent / "sparkmods")
    with serve(tmp_path / "index") as base:
        index_url = f"{base}/simple"
        built = subprocess.run([sparkmods, "matrix", "--vllm", "0.19.1", "--index-url", index_url, "--mods-dir",
                                str(repo / "mods"), "--out", str(repo / "matrix")], capture_output=True, text=True,
                               env=env, timeout=600)
        assert built.returncode == 0, built.stdout + built.stderr
        subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
        git(repo, "add", ".")
        git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "mods")
        bare = tmp_path / "github.git"  # the stand-in for GitHub
        subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(bare)], check=True)
        git(repo, "remote", "add", "origin", str(bare))

        out = tmp_path / "out"
        job = subprocess.run([sys.executable, str(REPO / "ci" / "nightly_check.py"), "--no-nightly", "--heal",
                              "--index-url", index_url, "--repo", str(repo),
                              "--matrix", str(repo / "matrix" / "matrix.json"), "--mods-dir", str(repo / "mods"),
                              "--report", str(out / "report.md"), "--proposals", str(out / "proposals.json")],
                             capture_output=True, text=True, env=env, timeout=3600)
    assert job.returncode == 1, job.stdout + job.stderr  # the break was found
    (pr,) = json.loads((out / "proposals.json").read_text())
    body = Path(pr["body_file"]).read_text()
    assert pr["kind"] == "pr" and pr["branch"] == BRANCH, body
    assert f"**{MOD}** `conflict` on `pypi:{NEXT}`" in body and f"`{INC}` hunk" in body
    assert "### Runtime tests on vLLM 0.19.2: " in body and " failed" not in body and " skipped" not in body
    assert "- passed: `tests.test_mod_hybrid_runtime::test_shared_experts_get_vllms_fp8_method" in body
    assert f"- new cell: {MOD} on vLLM {NEXT}: ok (variant v0.18.0-{NEXT})" in body
    assert "no new drift" in body

    toml = git(repo, "show", f"{BRANCH}:mods/{MOD}/mod.toml")
    assert f'label = "v0.18.0-{NEXT}"\nvllm = ">={NEXT}, <0.20.0"' in toml
    assert f'verified = ["{NEXT}"]' in toml and 'vllm = ">=0.18.0, <0.19.2"' in toml
    patch = git(repo, "show", f"{BRANCH}:mods/{MOD}/patches/v0.18.0-{NEXT}/inc.patch")
    assert patch.startswith(f"--- a/{INC}\n+++ b/{INC}\n")
    matrix = json.loads(git(repo, "show", f"{BRANCH}:matrix/matrix.json"))
    assert [r["vllm"] for r in matrix["releases"]] == ["0.19.1", NEXT]

    bindir = fake_gh(tmp_path / "bin")
    opened = subprocess.run([sys.executable, str(REPO / "ci" / "open_proposals.py"), str(out / "proposals.json")],
                            cwd=repo, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
                                 "GH_LOG": str(tmp_path / "gh.log")})
    assert opened.returncode == 0, opened.stderr
    assert git(bare, "rev-parse", BRANCH) == git(repo, "rev-parse", BRANCH)
    calls = [json.loads(line) for line in (tmp_path / "gh.log").read_text().splitlines()]
    assert calls == [["pr", "create", "--base", "main", "--head", BRANCH, "--title", pr["title"],
                      "--body-file", pr["body_file"]]]


def _retag(wheel: Path, version: str) -> None:
    """Rename the wheel's dist-info to `version` (METADATA's Version too), as a real next
    release's wheel names itself (run.sh reads the version there). As rebuild_with_edit does:
    only those few members are rewritten, at the end of the zip with a fresh directory."""
    with zipfile.ZipFile(wheel, "a") as zf:
        for info in [i for i in zf.infolist() if i.filename.split("/", 1)[0].endswith(".dist-info")]:
            top = info.filename.split("/", 1)[0]
            old = top[len("vllm-"):-len(".dist-info")]
            data = zf.read(info)
            if info.filename.endswith("/METADATA"):
                data = data.replace(f"\nVersion: {old}\n".encode(), f"\nVersion: {version}\n".encode(), 1)
            zf.filelist.remove(info)
            del zf.NameToInfo[info.filename]
            name = info.filename.replace(top, f"vllm-{version}.dist-info", 1)
            zf.writestr(zipfile.ZipInfo(name, date_time=info.date_time), data, compress_type=zipfile.ZIP_DEFLATED)
