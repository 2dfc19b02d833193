"""ci/nightly_check.py on the paths that need no nightly server (fast tier; the nightly itself is
in test_nightly.py): nothing new to check is a plain sentence, not a malformed table that
claims every mod applies; and the flags a network error recommends (`--no-nightly --offline`)
are accepted.
A real package index on loopback and the real script in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modfactory import ORIGINAL, TARGET, make_mod
from sparkmods.nightly import community_broke
from wheelindex import make_wheel

pytestmark = pytest.mark.usefixtures("fresh_cache")

REPO = Path(__file__).resolve().parents[1]
WHEEL = "vllm-{v}-cp38-abi3-manylinux_2_28_x86_64.whl"
# Every report ends with the line on the committed community matrix (tests/test_community_results.py).
COMMUNITY = community_broke(json.loads((REPO / "ci" / "bench" / "results" / "community-any-cpu.json").read_text()))


@pytest.fixture
def job(loopback_index, tmp_path):
    """Run the job with a one-mod collection and a matrix that covers 0.19.1; report to a file."""
    make_mod(tmp_path / "mods", "demo")
    loopback_index.add(make_wheel(tmp_path / WHEEL.format(v="0.19.1"), "0.19.1", extra={TARGET: ORIGINAL.encode()}))
    matrix = tmp_path / "matrix.json"
    matrix.write_text(json.dumps({"releases": [{"vllm": "0.19.1", "target": "pypi:0.19.1"}]}))
    report = tmp_path / "report.md"

    def run(*extra: str) -> "tuple[subprocess.CompletedProcess, str]":
        report.unlink(missing_ok=True)
        done = subprocess.run([sys.executable, str(REPO / "ci" / "nightly_check.py"), "--no-nightly",
                               "--index-url", f"{loopback_index.url}/simple", "--matrix", str(matrix),
                               "--mods-dir", str(tmp_path / "mods"), "--report", str(report), *extra],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "GITHUB_STEP_SUMMARY": ""})
        return done, report.read_text() if report.is_file() else ""

    run.index, run.tmp = loopback_index, tmp_path
    return run


def test_nothing_new_is_said_plainly(job):
    done, report = job()
    assert done.returncode == 0, done.stderr
    assert COMMUNITY.startswith("\nCommunity mods (")
    assert report == ("## sparkmods: mods against new vLLM builds\n\n"
                      "Nothing to check: no nightly was asked for and no release is newer than the matrix.\n" + COMMUNITY)


def test_a_new_release_gets_a_well_formed_table(job):
    job.index.add(make_wheel(job.tmp / WHEEL.format(v="0.20.0"), "0.20.0", extra={TARGET: ORIGINAL.encode()}))
    done, report = job()
    assert done.returncode == 0, done.stderr
    table = [line for line in report.splitlines() if line.startswith("|")]
    assert table == ["| mod | `pypi:0.20.0` |", "|---|---|", "| demo | ✅ ok |"]
    assert report.endswith("Every mod applies to every build checked.\n" + COMMUNITY)


def test_offline_works_from_the_cache_as_the_network_error_says(job):
    job.index.add(make_wheel(job.tmp / WHEEL.format(v="0.20.0"), "0.20.0", extra={TARGET: ORIGINAL.encode()}))
    assert job()[0].returncode == 0  # online once: index page and wheel members cached

    def hang_up(handler) -> None:
        handler.close_connection = True  # no answer at all: the network failed

    job.index.routes["/simple/vllm/"] = hang_up
    failed, _ = job()
    assert failed.returncode == 2 and failed.stderr.endswith(
        " (without the network, --no-nightly --offline checks the new releases from the cache; the nightly "
        "needs the network)\n"), failed.stderr
    offline, report = job("--offline")  # job() passes --no-nightly: the two flags the error names
    assert offline.returncode == 0, offline.stderr
    assert "| demo | ✅ ok |" in report


def test_an_unreachable_nightly_names_the_flags_that_work_offline(job):
    """Without --no-nightly, the flags the error names are a command line the job accepts offline."""
    job.index.add(make_wheel(job.tmp / WHEEL.format(v="0.20.0"), "0.20.0", extra={TARGET: ORIGINAL.encode()}))
    assert job()[0].returncode == 0  # online once
    script = [sys.executable, str(REPO / "ci" / "nightly_check.py"), "--nightly-url", "http://127.0.0.1:9",
              "--index-url", f"{job.index.url}/simple", "--matrix", str(job.tmp / "matrix.json"),
              "--mods-dir", str(job.tmp / "mods"), "--report", str(job.tmp / "report.md")]
    failed = subprocess.run(script, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 2 and len(failed.stderr.splitlines()) == 1, failed.stderr
    assert failed.stderr.startswith("nightly_check: error: cannot fetch http://127.0.0.1:9/nightly/vllm/metadata.json")
    assert "--offline to work" not in failed.stderr  # --offline alone is refused without --no-nightly
    flags = failed.stderr.split("without the network, ", 1)[1].split(" checks", 1)[0].split()
    assert flags == ["--no-nightly", "--offline"]
    offline = subprocess.run(script + flags, capture_output=True, text=True, timeout=120)
    assert offline.returncode == 0, offline.stderr


def test_offline_with_the_nightly_is_refused_in_one_line(job, tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "ci" / "nightly_check.py"), "--offline"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == ("nightly_check: error: --offline needs --no-nightly: the newest nightly can only be "
                           "looked up online\n")
