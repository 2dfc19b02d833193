"""`sparkmods rebase-patch PATCH --base SPEC --onto SPEC` and `sparkmods rebase MOD --onto SPEC`.

Exit codes: 0 the patch (or every patch of the mod) was carried and applies exactly to onto,
with no drift; 1 it could not be done safely (nothing written; the report names each hunk
and why; --conflicts DIR writes conflict-marked files); 2 usage or input errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List

from sparkmods.checking.drift import DriftFinding
from sparkmods.commands import help_for, only_one
from sparkmods.errors import SparkmodsError
from sparkmods.modsdir import load, resolve_mods
from sparkmods.outputfile import check_target, write_atomic, write_into
from sparkmods.patchfile import read_patch_file
from sparkmods.rebase import BaseMismatch, RebaseResult, rebase_patches
from sparkmods.rebase.modrebase import ModPlan, drift_of, plan_mod, write_plan
from sparkmods.rebase.report import drift_lines, result_lines
from sparkmods.runtime.engine import safe_target
from sparkmods.runtime.manifest import Manifest, Upstream
from sparkmods.runtime.modcheck import GREEN, check_mod

if TYPE_CHECKING:
    from sparkmods.sources.base import VllmSource


def _source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index-url", help="package index (default: $SPARKMODS_INDEX_URL or PyPI)")
    p.add_argument("--offline", action="store_true", help="use only the on-disk cache, no network")
    p.add_argument("--pre", action="store_true", help="allow pre-releases")
    p.add_argument("--conflicts", metavar="DIR", help="on failure, write conflict-marked files here for a human")
    p.add_argument("--json", action="store_true", help="one JSON document on standard output")


def register(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("rebase-patch", help=help_for("rebase-patch"),
                       description="Three-way rebase of a patch from --base to --onto; never misplaces a change.")
    p.add_argument("patch", metavar="PATCH")
    p.add_argument("--base", required=True, action="append", metavar="SPEC",
                   help="the vLLM the patch was written against")
    p.add_argument("--onto", required=True, action="append", metavar="SPEC", help="the vLLM to carry it to")
    p.add_argument("-o", "--output", metavar="OUT", help="write the rebased patch here (default: standard output)")
    p.add_argument("-p", dest="strip", type=int, default=1, help="leading path components to strip (default 1)")
    _source_args(p)
    p.set_defaults(func=run_rebase_patch)

    mod_parser = sub.add_parser("rebase", help=help_for("rebase"),
                                description="Rebase the nearest variant's patches onto a vLLM; --write adds the variant.")
    mod_parser.add_argument("mod", metavar="MOD")
    mod_parser.add_argument("--onto", required=True, action="append", metavar="SPEC",
                            help="the vLLM the mod should work on")
    mod_parser.add_argument("--write", action="store_true", help="add the variant to mod.toml and write its patches")
    mod_parser.add_argument("--label", help="label of the new variant (default: <source label>-<onto version>)")
    mod_parser.add_argument("--mods-dir", help="folder holding the mods")
    _source_args(mod_parser)
    mod_parser.set_defaults(func=run_rebase)


def _one(spec: str, args: argparse.Namespace, flag: str) -> VllmSource:
    from sparkmods.sources import open_targets

    found = open_targets(spec, index_url=args.index_url, offline=args.offline, prereleases=args.pre)
    if len(found) != 1:
        raise SparkmodsError(f"{flag} {spec!r} names {len(found)} vLLMs; name exactly one (e.g. 0.20.0)")
    return found[0]


def _write_conflicts(folder: str, results: List[RebaseResult]) -> List[str]:
    """Conflict-marked files (or, for drift, the merged files) under folder; returns paths."""
    root = Path(folder)
    out = []
    for result in results:
        files: Dict[str, bytes] = result.conflict_files()
        if not files:
            files = {p: a for p, (_, a) in result.changes().items() if a is not None}
        for rel, data in files.items():
            target = Path(safe_target(root, rel))
            write_into(target, data)
            out.append(str(target))
    return out


def run_rebase_patch(args: argparse.Namespace) -> int:
    path = Path(args.patch)
    if args.output:  # before any fetch: an output that can never be written
        check_target(Path(args.output), "-o")
    patches = read_patch_file(path, args.strip)
    base_spec, onto_spec = only_one(args.base, "--base"), only_one(args.onto, "--onto")
    base = _one(base_spec, args, "--base")
    onto = _one(onto_spec, args, "--onto")
    try:
        result = rebase_patches(patches, base, onto)
    except BaseMismatch as exc:
        raise SparkmodsError(f"{path}: {exc}") from None
    drift: List[DriftFinding] = drift_of(patches, result, base, onto) if result.clean else []
    ok = result.clean and not drift
    written = None
    if ok and args.output and result.patch:
        write_atomic(Path(args.output), result.patch.encode("utf-8"))
        written = args.output
    conflicts = _write_conflicts(args.conflicts, [result]) if args.conflicts and not ok else []
    if args.json:
        doc = result.to_dict()
        doc.update(drift=[f.to_dict() for f in drift], output=written, conflict_files=conflicts)
        if ok and not args.output:
            doc["patch"] = result.patch
        print(json.dumps(doc, indent=2))
    elif ok:
        if not result.patch:
            print(f"{path}: {onto.label} already has every change of the patch; nothing to carry")
        elif args.output:
            print(f"{path}: rebased {base.label} -> {onto.label}, every hunk exact: {args.output}")
        else:
            sys.stdout.write(result.patch)
    else:
        print(f"{path}: cannot be carried safely from {base.label} to {onto.label}; nothing written")
        for line in result_lines(result, "  ") + drift_lines(drift, "  "):
            print(line)
        for c in conflicts:
            print(f"  wrote {c}")
    return 0 if ok else 1


def run_rebase(args: argparse.Namespace) -> int:
    (mod_dir,) = resolve_mods([args.mod], args.mods_dir)
    manifest = load(mod_dir)
    onto = _one(only_one(args.onto, "--onto"), args, "--onto")
    now = check_mod(manifest, mod_dir, onto.version, onto.read)
    if now.status in GREEN:
        why = now.reason if isinstance(manifest.select(onto.version), Upstream) else f"variant {now.variant!r}"
        return _done(args, {"mod": manifest.name, "onto": onto.version, "status": now.status, "written": False},
                     f"{manifest.name}: already works on {onto.label} ({now.status}: {why}); nothing to do")
    plan = plan_mod(mod_dir, manifest, onto, lambda v: _one(f"pypi:{v}", args, "verified release"), args.label)
    return _report(args, mod_dir, manifest, plan, now.status, onto)


def _report(args: argparse.Namespace, mod_dir: Path, manifest: Manifest, plan: ModPlan, status: str,
            onto: VllmSource) -> int:
    doc = plan.to_dict()
    doc["status"] = status
    lines = [f"{plan.mod}: {status} on {plan.onto}; rebasing variant {plan.variant.label!r} from vLLM {plan.base}"]
    for p in plan.patches:
        where = "unchanged, reused" if p.target == p.source else f"-> {p.target}"
        lines.append(f"  {p.source} {where}: {'ok' if p.clean else 'NOT SAFE'}")
        lines += result_lines(p.result, "    ") + drift_lines(p.drift, "    ")
    if not plan.clean:
        conflicts = _write_conflicts(args.conflicts, [p.result for p in plan.patches]) if args.conflicts else []
        lines += [f"  wrote {c}" for c in conflicts] + ["nothing written"]
        doc.update(written=False, conflict_files=conflicts)
        return _done(args, doc, "\n".join(lines), 1)
    if not plan.carried and not plan.variant.install:
        return _done(args, dict(doc, written=False),
                     "\n".join(lines + [f"  vLLM {plan.onto} already has every change: the mod is not needed there; "
                                        "consider an [upstream] section"]))
    lines.append(f"  variant {plan.label!r}: vllm = \"{plan.range}\"")
    lines += [f"  variant {k!r}: vllm = \"{a}\" -> \"{b}\"" for k, (a, b) in plan.cuts.items()]
    if not args.write:
        return _done(args, dict(doc, written=False), "\n".join(lines + ["run with --write to add it"]))
    from sparkmods.sync import sync

    written = write_plan(mod_dir, manifest, plan, write_into, onto.read)
    synced = sync(mod_dir)
    lines += [f"  wrote {w}" for w in written] + [f"  synced {s}" for s in synced]
    return _done(args, dict(doc, written=True, files=written), "\n".join(lines))


def _done(args: argparse.Namespace, doc: dict, text: str, code: int = 0) -> int:
    print(json.dumps(doc, indent=2) if args.json else text)
    return code
