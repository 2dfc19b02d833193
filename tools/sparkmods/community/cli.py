"""`sparkmods check --community` and `sparkmods matrix --community`: community mods judged
on vLLM targets, as a table (or JSON) and as a matrix of their own.

check runs each mod in the sandbox (sandbox.py) and, where run.sh can also be read statically
(patch steps only), reads it too: the two must agree. A loose script or diff named on the
command line is judged as a mod folder of its own."""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, List, Optional, Sequence, Tuple

from sparkmods.checking import report
from sparkmods.checking.rows import CheckRow, Tally
from sparkmods.community.judge import NOT_CHECKABLE, SKIPPED, CommunityResult, judge, judge_all
from sparkmods.community.runsh import CommunityMod, is_community_mod, read_mod
from sparkmods.community.sandbox import (
    SITE_DIR,
    RunResult,
    _client,
    agrees,
    check_image,
    release_tree,
    run_mod,
    sandbox_image,
    tree_image,
)
from sparkmods.errors import SparkmodsError
from sparkmods.matrix.build import cell_from_result, sort_sources
from sparkmods.matrix.document import JSON_NAME, MD_NAME, SVG_NAME, document, rendered, write_all
from sparkmods.matrix.render import LEGEND
from sparkmods.runtime.udiff import PatchParseError, parse_patch
from sparkmods.sources import stats
from sparkmods.sources.options import open_sources

if TYPE_CHECKING:
    from sparkmods.sources.base import VllmSource

__all__ = ["collect", "load_mods", "loose_mod", "run_cells", "run_check", "run_matrix", "wants_community"]

# the community matrix's extra statuses, beside the matrix legend
LEGEND_EXTRA = {SKIPPED: ("🙈", "#fb8500", "run.sh goes on after the patch failed: the fix is silently missing"),
                NOT_CHECKABLE: ("❔", "#eaeef2", "run.sh changes files by means no patch check can judge")}


def wants_community(args: argparse.Namespace) -> bool:
    """--community given, or a MOD named on the command line is a community mod folder or a
    loose file (a script or a diff)."""
    return bool(getattr(args, "community", None)) or any(is_community_mod(Path(m)) or Path(m).is_file()
                                                        for m in getattr(args, "mods", []))


def _is_diff(text: str) -> bool:
    if text.startswith("#!"):
        return False
    try:
        return bool(parse_patch(text))
    except PatchParseError:
        return False


def loose_mod(path: Path, scratch: Path) -> Path:
    """A mod folder in scratch for a loose file: a script becomes its run.sh; a diff is applied
    by a run.sh of ours as the collection's simplest mods do (`patch -p1` in site-packages,
    stopping when it fails)."""
    data = path.read_bytes()
    if len(data) > 16 << 20:
        raise SparkmodsError(f"{path}: over 16 MiB; not a mod script or diff")
    name = re.sub(r"[^A-Za-z0-9._+-]", "-", path.stem).strip("-.") or "loose"
    folder = scratch / name
    folder.mkdir(parents=True)
    if _is_diff(data.decode("utf-8", "replace")):
        (folder / f"{name}.diff").write_bytes(data)
        (folder / "run.sh").write_text(f"#!/bin/bash\nset -e\npatch -p1 -d {SITE_DIR} < {name}.diff\n",
                                       encoding="utf-8")
    else:
        (folder / "run.sh").write_bytes(data)
    return folder


def collect(root: Path, names: Sequence[str] = (), scratch: Optional[Path] = None) -> List[Path]:
    """The community mod folders: root itself when it is one (or a loose file, given a scratch
    folder to wrap it in), else its sub-folders with a run.sh and no mod.toml (or the ones named)."""
    if root.is_file() and scratch is not None:
        if names:
            raise SparkmodsError(f"{root}: a single file; name no mods after it")
        return [loose_mod(root, scratch)]
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


def load_mods(args: argparse.Namespace, scratch: Optional[Path] = None) -> List[CommunityMod]:
    if getattr(args, "community", None):
        return [read_mod(p) for p in collect(Path(args.community), getattr(args, "mods", []), scratch)]
    return [read_mod(p) for name in args.mods for p in collect(Path(name), (), scratch)]


def run_check(args: argparse.Namespace) -> int:
    """Run (or with --static, read) the mods on the targets and print the rows."""
    with tempfile.TemporaryDirectory(prefix="sparkmods-loose-") as scratch:
        mods = load_mods(args, Path(scratch))
        return _static_check(args, mods) if args.static else _run_check(args, mods)


def run_cells(mods: Sequence[CommunityMod], sources: Sequence[VllmSource], image: str,
              timeout: float) -> Iterator[Tuple[VllmSource, CommunityMod, RunResult, Optional[CommunityResult]]]:
    """(source, mod, what its run did, the static judgment where run.sh can be read) for every
    mod on every source, one container at a time."""
    client = _client()
    for source in sources:
        with tempfile.TemporaryDirectory(prefix="sparkmods-tree-") as tmp:
            tree = release_tree(source, Path(tmp))
            tag = tree_image(tree, image, client)
            for mod in mods:
                static = judge(mod, source) if mod.checkable else None
                yield source, mod, run_mod(mod.path, tree, image, timeout, client, tree_tag=tag), static
        release = getattr(source, "release", None)
        if release is not None:
            release()


def _run_check(args: argparse.Namespace, mods: Sequence[CommunityMod]) -> int:
    """A row per mod and target with the run's status; exit 1 when a row is not green or the run
    and the static reading disagree."""
    image = sandbox_image(args.sandbox_image)
    check_image(image)
    sources = open_sources(args)
    rows, docs, disagree = [], [], 0
    for source, mod, ran, static in run_cells(mods, sources, image, args.timeout):
        reason = ran.reason(args.timeout)
        if static is not None and not agrees(static.status, ran.status):
            disagree += 1
            reason += f"; DISAGREES with the static reading ({static.status}: {static.reason or 'no detail'})"
        result = CommunityResult(mod.name, source.version, ran.status, None, reason)
        doc = result.to_dict()
        result.how = reason  # the table's detail column shows a green row's files only as `how`
        rows.append(CheckRow(source.label, source.commit, source.sha256, result))
        docs.append({**doc, "target": source.label, "static": static.status if static else None,
                     "run": {"exit_code": ran.exit_code, "last_line": ran.last_line, "seconds": ran.seconds,
                             "changed": [{"path": p, "change": op} for op, p in ran.changed],
                             "outside": ran.outside}})
    order = sorted(range(len(rows)), key=lambda i: rows[i].result.mod)
    if args.json:
        json.dump({"results": [docs[i] for i in order], "image": image, "disagreements": disagree},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        report.print_table([rows[i] for i in order])
        print(report.summary_line(rows) + f"; run in {image}; {disagree} disagree with the static reading")
    return 1 if disagree or report.exit_code(rows) else 0


def _static_check(args: argparse.Namespace, mods: Sequence[CommunityMod]) -> int:
    """Print the rows (a table, or one JSON document); exit 1 when a row is not green or a mod
    cannot be judged."""
    started = time.monotonic()
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
    per_source = judge_all(mods, sources)
    cells = [cell_from_result(per_source[j][i], s.label, "", s.sha256)
             for i in range(len(mods)) for j, s in enumerate(sources)]
    for cell in cells:
        cell.pop("mod_hash")
    return document(sources, [{"name": m.name, "summary": _summary(m), "variants": []} for m in mods], cells,
                    community={"source": label, "mods": len(mods), "checkable": sum(1 for m in mods if m.checkable)})


def _summary(mod: CommunityMod) -> str:
    if not mod.checkable:
        return f"not checkable: {mod.why_not()}"
    return "run.sh applies " + ", ".join(f"{s.source} ({s.tool} -p{s.strip}{' -R' if s.reverse else ''}"
                                         f"{', tolerated' if s.tolerated else ''})" for s in mod.steps)


def run_matrix(args: argparse.Namespace) -> int:
    """Write MATRIX.md, matrix.json and matrix.svg for the community mods into --out."""
    if args.check or args.against:
        raise SparkmodsError("--community writes a matrix; --check and --against work on ours only")
    out = Path(args.out) if args.out else Path("matrix") / "community"
    mods = load_mods(args)
    sources = sort_sources(open_sources(args))
    for spec in args.extra:
        sources.extend(open_sources(argparse.Namespace(**{**vars(args), "vllm": [spec]})))
    doc = community_doc(mods, sources, args.source_label or str(Path(args.community).resolve()))
    legend = {**LEGEND, **LEGEND_EXTRA}
    write_all(out, rendered(doc, legend))
    bad = Tally.of(c["status"] for c in doc["cells"]).not_green
    print(f"wrote {out}/{{{JSON_NAME},{MD_NAME},{SVG_NAME}}}: {len(mods)} community mods "
          f"({doc['community']['checkable']} checkable) x {len(sources)} targets, {bad} cells not green")
    return 0
