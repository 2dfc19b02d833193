"""The lint and type gates: `ruff check` and `mypy` with the configuration in pyproject.toml
report nothing. Both come with the test extra (CI installs it); where one is missing the test
says so and skips."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(tool: str, args: List[str]) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(tool) is None:
        pytest.skip(f"{tool} is not installed (pip install -e .[test] brings it)")
    return subprocess.run([sys.executable, "-m", tool, *args], cwd=REPO, capture_output=True, text=True)


def test_ruff_reports_nothing() -> None:
    done = _run("ruff", ["check", "--quiet"])
    assert done.returncode == 0 and not done.stdout, done.stdout + done.stderr


def test_mypy_reports_nothing() -> None:
    done = _run("mypy", [])
    assert done.returncode == 0, done.stdout + done.stderr
