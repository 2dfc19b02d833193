"""`sparkmods check --community` and `sparkmods matrix --community`: community mods judged
on vLLM targets, as a table (or JSON) and as a matrix of their own."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from pathlib import Path
from typing import List, Sequence

from sparkmods.community.judge import NOT_CHECKABLE, SKIPPED, judge_all
from sparkmods.community.runsh import CommunityMod, is_community_mod, read_mod
from sparkmods.errors import SparkmodsError

__all__ = ["collect", "load_mods", "run_check", "run_matrix", "wants_community"]

# the community matrix's extra statuses, beside the matrix legend
LEGEND_EXTRA = {SKIPPED: ("🙈", "#fb8500", "run.sh goes on after the patch failed: the fix is silently missing"),
                NOT_CHECKABLE: ("❔", "#eaeef2", "run.sh changes files by means no patch check can judge")}


def wants_community(args: argparse.Namespace) -> bool:
    """--community given, or a MOD named on the command line is a community mod folder."""
    return bool(getattr(args, "community", None)) or any(is_community_mod(Path(m)) for m in getattr(args, "mods", []))


def collect(root: Path, names: Sequence[str] = ()) -> List[Path]:
    """The community mod folders: root itself when it is one, else its sub-folders with a
    run.sh and no mod.toml (or the ones named)."""
    if not root.is_dir():
        raise SparkmodsError(f"{root}: no such folder (want a folder of community mods: run.sh, no mod.toml)")
    if is_community_mod(root):
        return [root]
    found = sorted(p for p in root.iterdir() if p.is_dir() and is_community_mod(p))
    if names:
        by_name = {p.name: p for p in found}
        missing = [n for n in names if Path(n).name not in by_name]
        if missing:
            raise SparkmodsError(f"{root}: no community mod {missing[0]!r}; there are: "
                                 + ", ".join(by_name) if by_name else f"{root}: no community mods")
        found = [by_name[Path(n).name] for n in names]
    if not found:
        raise SparkmodsError(f"{root}: no community mods (folders with run.sh and no mod.toml)")
    return found


def load_mods(args: argparse.Namespace) -> List[CommunityMod]:
    if getattr(args, "community", None):
        return [read_mod(p) for p in collect(Path(args.community), getattr(args, "mods", []))]
    return [read_mod(p) for name in args.mods for p in collect(Path(name))]


def run_check(args: argparse.Namespace) -> int:
    """Print the rows (a table, or one JSON document); exit 1 when a row is not green or a mod
    cannot be judged."""
    from sparkmods import report
    from sparkmods.check import CheckRow
    from sparkmods.sources import stats
    from sparkmods.targets import open_sources

    started = time.monotonic()
    mods = load_mods(args)
    judged = [m for m in mods if m.checkable]
    sources = open_sources(args) if judged else []
    per_source = judge_all(judged, sources)
    rows = [CheckRow(s.label, s.commit, s.sha256, r) for s, results in zip(sources, per_source) for r in results]
    rows.sort(key=lambda r: r.result.mod)
    blocked = [m for m in mods if not m.checkable]
    if args.json:
        fetch = stats.snapshot()
        fetch["seconds"] = round(time.monotonic() - started, 3)
        doc = {"results": [r.to_dict() for r in rows],
               "not_checkable": [{"mod": m.name, "reason": m.why_not(), "blockers": [b.to_dict() for b in m.blockers]}
                                 for m in blocked],
               "mods": [{"mod": m.name, "steps": [s.to_dict() for s in m.steps]} for m in judged],
               "fetch": fetch}
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        if rows:
            report.print_table(rows)
        for m in blocked:
            print(f"{m.name}: {NOT_CHECKABLE}: {m.why_not()}")
        skipped = sum(1 for r in rows if r.result.status == SKIPPED)
        print(report.summary_line(rows) + f" ({skipped} skipped silently); {len(blocked)} of {len(mods)} mods "
              f"not checkable")
    return 1 if blocked or report.exit_code(rows) else 0


def community_doc(mods: Sequence[CommunityMod], sources: Sequence, label: str) -> dict:
    """A matrix document (the schema `sparkmods matrix` writes) for community mods."""
    from sparkmods import __version__
    from sparkmods.check import checker_hash
    from sparkmods.matrix.build import cell_from_result

    per_source = judge_all(mods, sources)
    cells = [cell_from_result(per_source[j][i], s.label, "", s.sha256)
             for i in range(len(mods)) for j, s in enumerate(sources)]
    for cell in cells:
        cell.pop("mod_hash")
    return {
        "schema": 1, "generated_by": f"sparkmods {__version__}", "checker": checker_hash(),
        "generated_at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "community": {"source": label, "mods": len(mods), "checkable": sum(1 for m in mods if m.checkable)},
        "releases": [{"vllm": s.version, "target": s.label, "commit": s.commit, "wheel_sha256": s.sha256} for s in sources],
        "mods": [{"name": m.name, "summary": _summary(m), "variants": []} for m in mods],
        "cells": cells,
    }


def _summary(mod: CommunityMod) -> str:
    if not mod.checkable:
        return f"not checkable: {mod.why_not()}"
    return "run.sh applies " + ", ".join(f"{s.source} ({s.tool} -p{s.strip}{' -R' if s.reverse else ''}"
                                         f"{', tolerated' if s.tolerated else ''})" for s in mod.steps)


def run_matrix(args: argparse.Namespace) -> int:
    """Write MATRIX.md, matrix.json and matrix.svg for the community mods into --out."""
    from sparkmods.commands.matrix import _write_all
    from sparkmods.matrix.build import sort_sources
    from sparkmods.matrix.render import LEGEND, to_markdown, to_svg
    from sparkmods.targets import open_sources

    if args.check or args.against:
        raise SparkmodsError("--community writes a matrix; --check and --against work on ours only")
    out = Path(args.out) if args.out else Path("matrix") / "community"
    mods = load_mods(args)
    sources = sort_sources(open_sources(args))
    for spec in args.extra:
        sources.extend(open_sources(argparse.Namespace(**{**vars(args), "vllm": [spec]})))
    doc = community_doc(mods, sources, args.source_label or str(Path(args.community).resolve()))
    legend = {**LEGEND, **LEGEND_EXTRA}
    _write_all(out, {"matrix.json": json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                     "MATRIX.md": to_markdown(doc, legend), "matrix.svg": to_svg(doc, legend)})
    bad = sum(1 for c in doc["cells"] if c["status"] not in ("ok", "ok-offset", "applied", "upstream"))
    print(f"wrote {out}/{{matrix.json,MATRIX.md,matrix.svg}}: {len(mods)} community mods "
          f"({doc['community']['checkable']} checkable) x {len(sources)} targets, {bad} cells not green")
    return 0
