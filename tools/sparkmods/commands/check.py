"""`sparkmods check [MOD ...]` and `sparkmods check-patch FILE`: which patches apply where."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sparkmods.commands import help_for
from sparkmods.sources.options import add_cache_arg, add_target_args


def register(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("check", help=help_for("check"),
                       description="For each mod and vLLM target: the variant chosen and its status.")
    p.add_argument("mods", nargs="*", metavar="MOD", help="mod names or folders (default: all)")
    p.add_argument("--mods-dir", help="folder holding the mods (default: ./mods or the repository's)")
    p.add_argument("--json", action="store_true", help="one JSON document with per-hunk detail and fetch statistics")
    p.add_argument("--community", metavar="DIR",
                   help="judge community mods (folders with run.sh, no mod.toml; or a loose script or diff) by "
                        "running them as launch-cluster.sh --apply-mod does, in a throwaway container")
    p.add_argument("--static", action="store_true",
                   help="with --community: read run.sh without running it (no Docker; Python and sed edits are "
                        "not-checkable)")
    p.add_argument("--sandbox-image", metavar="IMAGE",
                   help="with --community: the image mods run in (default: $SPARKMODS_SANDBOX_IMAGE or "
                        "sparkmods-sandbox:latest, built by ci/sandbox_image.py)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="with --community: seconds a mod may run before it is killed (default 120)")
    add_target_args(p)
    add_cache_arg(p)
    p.set_defaults(func=run_check)

    patch_parser = sub.add_parser("check-patch", help=help_for("check-patch"))
    patch_parser.add_argument("patch", metavar="FILE")
    patch_parser.add_argument("-p", dest="strip", type=int, default=1,
                              help="leading path components to strip, as GNU patch's -p N (default 1)")
    patch_parser.add_argument("-R", "--reverse", action="store_true",
                              help="check the patch reversed, as `patch -R` applies it")
    patch_parser.add_argument("--json", action="store_true")
    add_target_args(patch_parser, default=None)
    add_cache_arg(patch_parser)
    patch_parser.set_defaults(func=run_check_patch)


def _finish(args: argparse.Namespace, rows: list, started: float) -> int:
    from sparkmods.checking import report, resultcache
    from sparkmods.sources import stats

    fetch = stats.snapshot()
    fetch["seconds"] = round(time.monotonic() - started, 3)
    counts = resultcache.active().counts
    if args.json:
        report.print_json(rows, fetch, {"reuse": not args.no_cache, **counts.to_dict()})
    else:
        report.print_table(rows)
        reused = f"; {counts.reused} reused from the result cache" if counts.reused else ""
        print(report.summary_line(rows) + reused)
    return report.exit_code(rows)


def run_check(args: argparse.Namespace) -> int:
    from sparkmods.checking import resultcache
    from sparkmods.checking.batch import check_mods
    from sparkmods.modsdir import resolve_mods
    from sparkmods.sources.options import open_sources

    if args.community or args.mods:  # only then can it be about community mods (import them only then)
        from sparkmods.community.cli import run_check as run_community, wants_community

        if wants_community(args):
            return run_community(args)
    started = time.monotonic()
    resultcache.start(reuse=not args.no_cache)
    mod_dirs = resolve_mods(args.mods, args.mods_dir)
    sources = open_sources(args)
    rows = check_mods(mod_dirs, sources)
    rows.sort(key=lambda r: r.result.mod)  # stable: targets stay in version order per mod
    _mark_served(rows, mod_dirs)
    return _finish(args, rows, started)


def _mark_served(rows: list, mod_dirs: list) -> None:
    """Rows of released wheels whose variant a committed GPU run served say so (matrix/served.py)."""
    from sparkmods.matrix.build import served_index
    from sparkmods.matrix.served import lookup

    found = served_index(mod_dirs)
    for row in rows:
        if row.sha256:
            hit = lookup(found, row.result.mod, row.result.version, row.result.variant, row.result.status)
            row.served = hit.to_dict() if hit else None


def run_check_patch(args: argparse.Namespace) -> int:
    from sparkmods.checking import resultcache
    from sparkmods.checking.batch import check_patch_source
    from sparkmods.checking.fingerprints import patch_fingerprint
    from sparkmods.errors import SparkmodsError
    from sparkmods.patchfile import read_diff_file
    from sparkmods.sources.options import open_sources

    started = time.monotonic()
    resultcache.start(reuse=not args.no_cache)
    if not args.vllm:
        raise SparkmodsError("check-patch needs at least one --vllm SPEC")
    path = Path(args.patch)
    changes = read_diff_file(path, args.strip, args.reverse)
    name = path.name + (" -R" if args.reverse else "")
    subject = patch_fingerprint(name, args.strip, path.read_bytes())
    rows = [check_patch_source(name, subject, changes, source) for source in open_sources(args)]
    return _finish(args, rows, started)
