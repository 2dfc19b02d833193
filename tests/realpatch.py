"""The real patch tools run.sh's engine is compared with: GNU patch (as run.sh would run it in a
container) and git apply, each on a patch text in a folder."""

from __future__ import annotations

import difflib
import subprocess
from pathlib import Path

REL = "vllm/model_executor/models/glm4_moe.py"


def diff(old: str, new: str, left: str, right: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), left, right))


def gnu_patch(root: Path, patch: str, *args: str) -> "subprocess.CompletedProcess[str]":
    """GNU patch as run.sh runs it in a container: no terminal to ask (a new session has no
    /dev/tty), so every question takes its default answer, [n]."""
    return subprocess.run(["patch", "--dry-run", "--verbose", *args], cwd=root, input=patch,
                          capture_output=True, text=True, start_new_session=True)


def git_apply(root: Path, patch: str, *args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(["git", "apply", *args], cwd=root, input=patch, capture_output=True, text=True)
