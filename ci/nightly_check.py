#!/usr/bin/env python3
"""CI job: check every mod against vLLM's newest nightly (or a given commit) and any release newer
than the committed matrix; write a Markdown report; exit 1 on any break.

    python ci/nightly_check.py [--nightly-url URL] [--commit SHA] [--report FILE] [--no-nightly] [--offline]

The report goes to --report, else to $GITHUB_STEP_SUMMARY when set, else to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from sparkmods.errors import SparkmodsError
from sparkmods.modsdir import resolve_mods
from sparkmods.nightly import DEFAULT_NIGHTLY_URL, newer_releases, resolve_nightly, run_job

REPO = Path(__file__).resolve().parents[1]


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
    args = parser.parse_args()
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
    except SparkmodsError as exc:
        print(f"nightly_check: error: {exc}", file=sys.stderr)
        return 2
    text = report.markdown()
    target = args.report or os.environ.get("GITHUB_STEP_SUMMARY")
    if target:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(text)
        print(f"report written to {target}: {len(report.rows)} checks, {len(report.broken)} broken")
    else:
        sys.stdout.write(text)
    return 1 if report.broken else 0


if __name__ == "__main__":
    sys.exit(main())
