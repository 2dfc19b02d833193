"""`sparkmods matrix`: build, check or compare the compatibility matrix in matrix/."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

from sparkmods.commands import help_for
from sparkmods.errors import SparkmodsError
from sparkmods.sources.options import add_target_args, open_sources

if TYPE_CHECKING:
    from rich.progress import Progress

_REPO_MATRIX = Path(__file__).resolve().parents[3] / "matrix"


def register(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("matrix", help=help_for("matrix"),
                       description="Check every mod on every vLLM release and write the matrix.")
    p.add_argument("--mods-dir", help="folder holding the mods")
    p.add_argument("--out", help="matrix folder (default: ./matrix or the repository's)")
    p.add_argument("--extra", action="append", default=[], metavar="SPEC",
                   help="extra targets beside the releases (a nightly index:..., an image:...); repeatable")
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 if the committed matrix is stale for the current mods")
    p.add_argument("--against", metavar="OLD.json", help="report regressions/fixes/new releases vs an older matrix")
    p.add_argument("--rebuild", action="store_true",
                   help="re-check every cell, even those whose inputs (mod content, wheel sha256) are unchanged "
                        "(neither the previous matrix nor stored check results are reused)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.add_argument("--community", metavar="DIR",
                   help="a matrix of community mods (run.sh, no mod.toml) instead of ours (--out: default matrix/community)")
    p.add_argument("--source-label", help="with --community: where the mods came from (e.g. a repository@commit)")
    add_target_args(p)
    p.set_defaults(func=run)


def _out_dir(arg: Optional[str]) -> Path:
    from sparkmods.matrix.document import folder

    if arg:
        return folder(Path(arg))
    local = Path.cwd() / "matrix"
    return local if local.is_dir() else _REPO_MATRIX


def _check(out: Path, mod_dirs: List[Path]) -> int:
    from sparkmods.matrix.compare import stale_mods, stale_served
    from sparkmods.matrix.document import JSON_NAME, read, rendered

    doc = read(out / JSON_NAME)
    if doc is None:
        print(f"{out / JSON_NAME} is missing: run `sparkmods matrix`")
        return 1
    problems = stale_mods(doc, mod_dirs)
    problems += stale_served(doc, mod_dirs)
    for name, text in rendered(doc).items():
        if name != JSON_NAME and (not (out / name).is_file() or (out / name).read_text(encoding="utf-8") != text):
            problems.append(f"{out / name} does not match {JSON_NAME}")
    for line in problems:
        print(f"stale: {line} (run: sparkmods matrix)")
    if not problems:
        print(f"matrix up to date: {len(doc['mods'])} mods x {len(doc['releases'])} targets")
    return 1 if problems else 0


def _progress(total: int) -> Tuple[Optional[Progress], Optional[Callable[[str], None]]]:
    """A progress callback: a bar on a terminal, nothing in CI or pipes."""
    if not sys.stderr.isatty() or os.environ.get("CI"):
        return None, None
    from rich.progress import Progress

    bar = Progress(transient=True)
    task = bar.add_task("checking", total=total)
    return bar, (lambda label: bar.update(task, advance=1, description=label))


def run(args: argparse.Namespace) -> int:
    from sparkmods.checking import resultcache
    from sparkmods.checking.rows import Tally
    from sparkmods.matrix.build import build_counted, sort_sources
    from sparkmods.matrix.compare import compare, without_timestamp
    from sparkmods.matrix.document import JSON_NAME, MD_NAME, SVG_NAME, read, rendered, write_all
    from sparkmods.modsdir import resolve_mods

    if args.community:
        from sparkmods.community.cli import run_matrix

        return run_matrix(args)
    out = _out_dir(args.out)
    mod_dirs = resolve_mods([], args.mods_dir)
    if args.check:
        return _check(out, mod_dirs)
    previous = read(out / JSON_NAME)
    against = read(Path(args.against)) if args.against else None
    if args.against and against is None:
        raise SparkmodsError(f"{args.against}: no such file")
    sources = sort_sources(open_sources(args))
    for spec in args.extra:
        args_extra = argparse.Namespace(**{**vars(args), "vllm": [spec]})
        sources.extend(open_sources(args_extra))
    resultcache.start(reuse=not args.rebuild)
    bar, tick = _progress(len(sources))
    if bar:
        bar.start()
    try:
        built = build_counted(mod_dirs, sources, None if args.rebuild else previous, tick)
    finally:
        if bar:
            bar.stop()
    doc = built.doc
    if previous is not None and without_timestamp(previous) == without_timestamp(doc):
        doc = previous  # nothing changed: keep the old timestamp so git sees no diff
    write_all(out, rendered(doc))
    diff = compare(against, doc) if against is not None else None
    bad = Tally.of(c["status"] for c in doc["cells"]).not_green
    if args.json:
        summary = {"out": str(out), "mods": len(doc["mods"]), "targets": len(doc["releases"]),
                   "cells": len(doc["cells"]), "not_green": bad, "reused": built.reused,
                   "reused_from_result_cache": built.from_cache, "rechecked": built.rechecked}
        if diff is not None:
            summary.update(diff.to_dict())
        print(json.dumps(summary, indent=2))
    else:
        stored = f"; {built.from_cache} from the result cache" if built.from_cache else ""
        print(f"{len(doc['releases'])} targets x {len(doc['mods'])} mods: {built.reused} cells reused "
              f"(inputs unchanged{stored}), {built.rechecked} re-checked"
              + ("; --rebuild re-checks all" if built.reused else ""))
        print(f"wrote {out}/{{{JSON_NAME},{MD_NAME},{SVG_NAME}}}: {len(doc['mods'])} mods x "
              f"{len(doc['releases'])} targets, {bad} cells not green")
        if diff is not None:
            for kind in ("regressions", "fixes", "changed"):
                for line in getattr(diff, kind):
                    print(f"{kind}: {line}")
            for version in diff.new_releases:
                print(f"new release: {version}")
    return 1 if diff is not None and diff.regressions else 0
