"""`sparkmods checkpoint inspect|add-mtp|build-hybrid`: safetensors checkpoint tools.

inspect reads headers only; add-mtp and build-hybrid stream tensor data by byte ranges,
so they run on a 128 GB machine next to a 120 GB checkpoint.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sparkmods.checkpoint import hub
from sparkmods.checkpoint.add_mtp import add_mtp
from sparkmods.checkpoint.hybrid_build import build_hybrid, check_target
from sparkmods.checkpoint.hybrid_plan import format_plan, needed_fp8_files, plan_hybrid
from sparkmods.checkpoint.inspection import format_report, inspect_checkpoint
from sparkmods.checkpoint.layout import CONFIG_NAME, INDEX_NAME, Checkpoint, Index
from sparkmods.checkpoint.names import MTP_FILE
from sparkmods.checkpoint.units import human_bytes
from sparkmods.commands import help_for


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "checkpoint",
        help=help_for("checkpoint"),
        description="Safetensors checkpoint tools. Reads headers only; writes stream byte ranges.",
    )
    sub = parser.add_subparsers(dest="checkpoint_command", metavar="ACTION")
    sub.required = True

    p = sub.add_parser(
        "inspect", help="shards, index, quantization, FP8 and MTP findings (headers only)",
        description="Report what vLLM will load from a checkpoint. Exit 1 when an error or warning needs fixing.",
    )
    p.add_argument("dir", help="checkpoint folder (a Hugging Face snapshot folder works)")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.set_defaults(func=_inspect)

    p = sub.add_parser("add-mtp", help="index the MTP head of model_extra_tensors.safetensors")
    p.add_argument("--source", required=True, help="folder (or HF repo id) with the MTP file")
    p.add_argument("--target", help="checkpoint folder whose index to fix (default: --source)")
    p.add_argument("--file", default=MTP_FILE, help=f"MTP file name (default: {MTP_FILE})")
    p.add_argument("--json", action="store_true", help="machine-readable result")
    p.set_defaults(func=_add_mtp)

    p = sub.add_parser("build-hybrid", help="AutoRound INT4 + Qwen FP8 shared experts -> hybrid checkpoint")
    p.add_argument("--int4", required=True, help="AutoRound INT4 checkpoint folder or HF repo id")
    p.add_argument("--fp8", required=True, help="Qwen block-FP8 checkpoint folder or HF repo id")
    p.add_argument("--out", required=True, help="output folder (built aside, renamed at the end)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    p.add_argument("--json", action="store_true", help="machine-readable plan/result")
    p.set_defaults(func=_build_hybrid)


def _inspect(args: argparse.Namespace) -> int:
    report = inspect_checkpoint(Path(args.dir))
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report))
    return report.exit_code


def _add_mtp(args: argparse.Namespace) -> int:
    source = hub.resolve(args.source, allow_patterns=[args.file] if args.target else None)
    result = add_mtp(source, Path(args.target) if args.target else None, args.file, progress=not args.json)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    elif result.added:
        print(
            f"{result.file} ({result.placed}): indexed {result.added} of {result.tensors} tensors, "
            f"total_size {result.total_size}; old index saved as {result.backup}"
        )
    else:
        print(f"{result.file} ({result.placed}): all {result.tensors} tensors already indexed, nothing to do")
    return 0


def _resolve_fp8(spec: str) -> Path:
    """Local folder as is; for a repo id, only the shards with shared-expert weights."""
    if not hub.is_repo_id(spec):
        return hub.resolve(spec)
    meta = hub.resolve(spec, allow_patterns=[INDEX_NAME, CONFIG_NAME])
    files = needed_fp8_files(Index.load(meta / INDEX_NAME))
    return hub.resolve(spec, allow_patterns=[INDEX_NAME, CONFIG_NAME, *files])


def _build_hybrid(args: argparse.Namespace) -> int:
    int4 = Checkpoint.open(hub.resolve(args.int4))
    fp8 = Checkpoint.open(_resolve_fp8(args.fp8))
    plan = plan_hybrid(int4, fp8)
    out = Path(args.out)
    if args.dry_run:
        check_target(plan, out, args.force)
        print(json.dumps(plan.to_dict(), indent=2) if args.json else format_plan(plan))
        return 1 if plan.errors else 0
    result = build_hybrid(plan, out, force=args.force, progress=not args.json)
    if args.json:
        print(json.dumps({**plan.to_dict(), "out": str(result.out), "bytes_written": result.bytes_written,
                          "hardlinked": result.hardlinked, "copied": result.copied, "others": result.others},
                         indent=2))
    else:
        print(
            f"{result.out}: {len(plan.swaps)} shared-expert projections now FP8; {result.rewritten} files "
            f"rewritten, {result.hardlinked + result.copied} kept ({result.hardlinked} hardlinked, "
            f"{result.copied} copied), {result.others} other files copied ({human_bytes(result.bytes_written)} written)"
        )
    return 0
