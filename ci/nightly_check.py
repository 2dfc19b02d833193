#!/usr/bin/env python3
"""CI job: check every mod against vLLM's newest nightly (or a given commit) and any release newer
than the committed matrix; write a Markdown report; exit 1 on any break.

    python ci/nightly_check.py [--nightly-url URL] [--commit SHA] [--report FILE] [--no-nightly] [--offline]
                               [--heal --proposals FILE]

The report goes to --report, else to $GITHUB_STEP_SUMMARY when set, else to stdout.

--heal: for each broken mod and target, rebase the mod onto it in a git worktree of a new branch
sparkmods-heal/<mod>-<version> (sparkmods.heal); an exact rebase that checks green and passes
the mod's runtime tests (RUNTIME_TESTS, on that one vLLM) is committed there with its regenerated
matrix, anything else becomes an issue text. --proposals lists them for ci/open_proposals.py,
which pushes the branches and opens the pull requests and issues.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from sparkmods.errors import SparkmodsError, Unreachable
from sparkmods.modsdir import resolve_mods
from sparkmods.nightly import (
    DEFAULT_NIGHTLY_URL,
    Report,
    break_lines,
    community_broke,
    newer_releases,
    resolve_nightly,
    run_job,
)
from sparkmods.runtime.pep440 import Version

REPO = Path(__file__).resolve().parents[1]
# The vllm_runtime test files that prove each mod on one vLLM (they honour sparkmods.heal's
# SPARKMODS_RUNTIME_* variables); a mod without any is never proposed.
RUNTIME_TESTS = {
    "hybrid-int4-fp8": ["tests/test_mod_hybrid_runtime.py"],
    "mtp-weights": ["tests/test_mod_mtp_runtime.py"],
    "int8-lm-head": ["tests/test_mod_int8_lm_head_vllm.py"],
}
HEALABLE = ("conflict", "missing-file", "drift", "no-variant")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nightly-url", default=os.environ.get("SPARKMODS_NIGHTLY_URL", DEFAULT_NIGHTLY_URL),
                        help="base of vLLM's per-commit wheel repository (default: %(default)s)")
    parser.add_argument("--commit", help="check this commit's wheels instead of the newest nightly")
    parser.add_argument("--no-nightly", action="store_true", help="check only new releases")
    parser.add_argument("--index-url", help="release index (default: $SPARKMODS_INDEX_URL or PyPI)")
    parser.add_argument("--matrix", default=str(REPO / "matrix" / "matrix.json"))
    parser.add_argument("--mods-dir", default=str(REPO / "mods"))
    parser.add_argument("--offline", action="store_true",
                        help="releases and wheels from the on-disk cache only (needs --no-nightly: "
                             "the newest nightly is only known online)")
    parser.add_argument("--report", help="Markdown report path")
    parser.add_argument("--heal", action="store_true",
                        help="rebase each broken mod on a branch of the repository, test it, and prepare a pull "
                             "request (or an issue when it needs a person)")
    parser.add_argument("--repo", default=str(REPO), help="git checkout to branch from (default: this one)")
    parser.add_argument("--proposals", default="proposals.json",
                        help="with --heal: where to list the branches and texts to open (default: %(default)s)")
    parser.add_argument("--runtime-tests", action="append", default=[], metavar="MOD=FILE",
                        help="with --heal: run FILE (relative to the repository) as MOD's runtime tests instead of "
                             "RUNTIME_TESTS' (repeatable)")
    args = parser.parse_args()
    given: dict = {}
    for item in args.runtime_tests:
        mod, eq, path = item.partition("=")
        if not (eq and mod and path):
            print(f"nightly_check: error: --runtime-tests {item!r}: expected MOD=FILE", file=sys.stderr)
            return 2
        given.setdefault(mod, []).append(path)
    args.tests = {**RUNTIME_TESTS, **given}
    if args.offline and not args.no_nightly:
        print("nightly_check: error: --offline needs --no-nightly: the newest nightly can only be looked up online",
              file=sys.stderr)
        return 2
    try:
        matrix_path = Path(args.matrix)
        matrix = json.loads(matrix_path.read_text()) if matrix_path.is_file() else None
        specs = [] if args.no_nightly else [resolve_nightly(args.nightly_url, args.commit).spec]
        specs += newer_releases(matrix, args.index_url, args.offline)
        report = run_job(resolve_mods([], args.mods_dir), specs, args.index_url, args.offline)
        heal_text = heal_all(report, args) if args.heal else ""
    except Unreachable as exc:  # --offline alone is refused here: say the combination that works
        print(f"nightly_check: error: {exc.reason} (without the network, --no-nightly --offline checks the new "
              "releases from the cache; the nightly needs the network)", file=sys.stderr)
        return 2
    except SparkmodsError as exc:
        print(f"nightly_check: error: {exc}", file=sys.stderr)
        return 2
    community = REPO / "ci" / "bench" / "results" / "community-any-cpu.json"
    text = report.markdown() + community_broke(json.loads(community.read_text()) if community.is_file() else None) \
        + heal_text
    target = args.report or os.environ.get("GITHUB_STEP_SUMMARY")
    if target:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(text)
        print(f"report written to {target}: {len(report.rows)} checks, {len(report.broken)} broken")
    else:
        sys.stdout.write(text)
    return 1 if report.broken else 0


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SparkmodsError(f"git {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def heal_all(report: Report, args: argparse.Namespace) -> str:
    """Heal every broken (mod, target) of the report; write the proposals list; a Markdown section."""
    from sparkmods.heal import PROPOSED, heal_break, pytest_runner
    from sparkmods.sources import open_targets

    repo = Path(_git(Path(args.repo), "rev-parse", "--show-toplevel").strip())
    mods_rel = Path(args.mods_dir).resolve().relative_to(repo)
    matrix_rel = Path(args.matrix).resolve().parent.relative_to(repo)
    sources = {s.label: s for s in report.sources}
    out_dir = Path(args.proposals).resolve().parent / "proposals"
    out_dir.mkdir(parents=True, exist_ok=True)
    proposals, lines = [], ["", "### Self-healing", ""]
    healed_mods: dict = {}
    for row in sorted(report.broken, key=lambda r: (r.result.mod, Version(r.result.version))):
        if row.result.status not in HEALABLE:
            continue
        if row.result.mod in healed_mods:  # one proposal per mod and night: the oldest broken vLLM first
            lines.append(f"- **{row.result.mod}** on `{row.target}`: left for after the proposal for "
                         f"`{healed_mods[row.result.mod]}`")
            continue
        healed_mods[row.result.mod] = row.target
        with tempfile.TemporaryDirectory(prefix="sparkmods-heal-") as tmp:
            tree = Path(tmp) / "tree"
            _git(repo, "worktree", "add", "--detach", "-q", str(tree), "HEAD")
            try:
                heal = heal_break(tree / mods_rel / row.result.mod, sources[row.target],
                                  lambda v: open_targets(f"pypi:{v}", index_url=args.index_url)[0],
                                  status=row.result.status, break_lines=break_lines(row.result),
                                  run_tests=pytest_runner(args.tests, tree), matrix_dir=tree / matrix_rel,
                                  index_url=args.index_url)
                if heal.outcome == PROPOSED:
                    _git(tree, "checkout", "-q", "-B", heal.branch)
                    _git(tree, "add", "-A", "--", str(mods_rel / heal.mod), str(matrix_rel))
                    _git(tree, "-c", "user.name=sparkmods nightly", "-c", "user.email=sparkmods-nightly@users.noreply",
                         "commit", "-q", "-m", heal.title)
            finally:
                _git(repo, "worktree", "remove", "--force", str(tree))
        body = out_dir / f"{heal.slug}.md"
        body.write_text(heal.body(), encoding="utf-8")
        (out_dir / f"{heal.slug}.json").write_text(json.dumps(heal.to_dict(), indent=1), encoding="utf-8")
        entry = {"kind": "pr" if heal.outcome == PROPOSED else "issue", "title": heal.title, "body_file": str(body)}
        if heal.outcome == PROPOSED:
            entry["branch"] = heal.branch
        proposals.append(entry)
        what = f"pull request from branch `{heal.branch}`" if heal.outcome == PROPOSED else f"issue ({heal.problem})"
        lines.append(f"- **{heal.mod}** on `{heal.target}`: {heal.outcome}: {what}")
    Path(args.proposals).write_text(json.dumps(proposals, indent=1) + "\n", encoding="utf-8")
    return "\n".join(lines + [""]) if proposals else ""


if __name__ == "__main__":
    sys.exit(main())
