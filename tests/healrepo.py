"""What the heal job drives besides the index: git on the project's repository, and a `gh` that logs
its arguments and answers as GitHub's CLI does."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def fake_gh(folder: Path) -> Path:
    """A `gh` that logs its arguments (one JSON list per line) and answers like GitHub's CLI."""
    folder.mkdir(parents=True, exist_ok=True)
    gh = folder / "gh"
    gh.write_text(textwrap.dedent(f'''\
        #!{sys.executable}
        import json, os, sys
        with open(os.environ["GH_LOG"], "a") as fh:
            fh.write(json.dumps(sys.argv[1:]) + "\\n")
        if sys.argv[1:3] == ["issue", "list"]:
            print(os.environ.get("GH_OPEN_ISSUES", "[]"))
        elif sys.argv[1:3] == ["pr", "create"]:
            print("https://github.example/spark-vllm-mods/pull/1")
        elif sys.argv[1:3] == ["issue", "create"]:
            print("https://github.example/spark-vllm-mods/issues/2")
        '''))
    gh.chmod(0o755)
    return folder
