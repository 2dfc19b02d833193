#!/usr/bin/env python3
"""CI step after `nightly_check.py --heal`: push each proposed branch and open its pull request,
and open an issue for each break that needs a person, with GitHub's CLI (`gh`).

    python ci/open_proposals.py PROPOSALS.json [--remote origin] [--base main]

A branch the remote already has was proposed by an earlier run and is left alone; so is an issue
whose title an open issue already has. Needs a token that may push and open pull requests and
issues (the workflow's permissions: contents, pull-requests and issues: write) in GH_TOKEN.
Exit 0 when everything was opened or already there, 1 when a git or gh command failed, 2 on a
bad proposals file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import List


def _run(cmd: List[str]) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(cmd, capture_output=True, text=True)


def _load(path: Path) -> list:
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: not a JSON list")
    for i, entry in enumerate(entries):
        need = ["kind", "title", "body_file"] + (["branch"] if isinstance(entry, dict) and entry.get("kind") == "pr" else [])
        if not isinstance(entry, dict) or entry.get("kind") not in ("pr", "issue") or any(
                not isinstance(entry.get(k), str) for k in need):
            raise ValueError(f"{path}: entry {i} needs kind (pr or issue), title, body_file and, for a pr, branch")
    return entries


def open_one(entry: dict, remote: str, base: str) -> str:
    """Open one proposal; returns what was done, raises RuntimeError with the failed command."""
    def must(cmd: List[str]) -> str:
        done = _run(cmd)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:3])} failed: {(done.stderr or done.stdout).strip()}")
        return done.stdout
    if entry["kind"] == "pr":
        branch = entry["branch"]
        if _run(["git", "ls-remote", "--exit-code", "--heads", remote, branch]).returncode == 0:
            return f"branch {branch} is already on {remote}: proposed before, left alone"
        must(["git", "push", remote, f"refs/heads/{branch}:refs/heads/{branch}"])
        url = must(["gh", "pr", "create", "--base", base, "--head", branch, "--title", entry["title"],
                    "--body-file", entry["body_file"]]).strip()
        return f"pull request {url or branch} opened"
    found = json.loads(must(["gh", "issue", "list", "--state", "open", "--search", f"{entry['title']} in:title",
                             "--json", "title"]) or "[]")
    if any(item.get("title") == entry["title"] for item in found):
        return f"issue '{entry['title']}' is already open"
    url = must(["gh", "issue", "create", "--title", entry["title"], "--body-file", entry["body_file"]]).strip()
    return f"issue {url or entry['title']} opened"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("proposals", help="the --proposals file nightly_check.py --heal wrote")
    parser.add_argument("--remote", default="origin")
    parser.add_argument("--base", default="main", help="branch the pull requests go into (default: %(default)s)")
    args = parser.parse_args()
    try:
        entries = _load(Path(args.proposals))
    except ValueError as exc:
        print(f"open_proposals: error: {exc}", file=sys.stderr)
        return 2
    failed = 0
    for entry in entries:
        try:
            print(open_one(entry, args.remote, args.base))
        except RuntimeError as exc:
            print(f"open_proposals: {entry['title']}: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
