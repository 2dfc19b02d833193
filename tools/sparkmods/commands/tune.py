"""`sparkmods tune`: time the int8-lm-head and turboquant kernels on this GPU and write the local
tune table the mods read at start-up (sparkmods/tuning.py does the work).

Exit 0 when the table was written, 2 on input errors (no GPU, no torch, a bad option).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from sparkmods.commands import help_for
from sparkmods.errors import SparkmodsError

if TYPE_CHECKING:
    from sparkmods.tuning import Options

MODS = ("int8-lm-head", "turboquant")


def register(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("tune", help=help_for("tune"),
                       description="Time the INT8 head's and TurboQuant's kernel configs on this machine's GPU (a few "
                                   "minutes) and write the table the mods read at start-up instead of their shipped "
                                   "defaults, on this GPU and with these kernels only.")
    p.add_argument("--out", type=Path, help="the table (default: $SPARKMODS_TUNE_TABLE, else "
                                            "${XDG_CACHE_HOME:-~/.cache}/sparkmods/kernel-tune.json)")
    p.add_argument("--mod", action="append", choices=MODS, help="tune only this mod (repeatable; default: both)")
    p.add_argument("--head", default="248320x3072", metavar="VOCABxHIDDEN",
                   help="the LM head timed for int8-lm-head (default: Qwen3.5's 248320x3072)")
    p.add_argument("--head-size", type=int, default=256, help="TurboQuant attention head size (default 256)")
    p.add_argument("--heads", default="32/2", metavar="Q/KV", help="query and KV heads per GPU (default 32/2)")
    p.add_argument("--dtypes", help="TurboQuant cache dtypes, comma-separated (default: all four)")
    p.add_argument("--candidates", type=int, default=0, metavar="N",
                   help="time at most N candidates per shape besides the shipped config (default: all, a few minutes)")
    p.add_argument("--mods-dir", help="folder holding the mods (default: ./mods or the repository's)")
    p.set_defaults(func=run)


def _pair(text: str, sep: str, what: str) -> "tuple[int, int]":
    try:
        first, second = (int(v) for v in text.split(sep))
    except ValueError:
        raise SparkmodsError(f"{what} {text!r}: expected two integers as A{sep}B") from None
    if first <= 0 or second <= 0:
        raise SparkmodsError(f"{what} {text!r}: both must be positive")
    return first, second


def options(args: argparse.Namespace) -> Options:
    from sparkmods.modsdir import mods_root
    from sparkmods.tuning import Options

    root = mods_root(args.mods_dir)
    kt = _kerneltune(root)
    q_heads, kv_heads = _pair(args.heads, "/", "--heads")
    if q_heads % kv_heads:
        raise SparkmodsError(f"--heads {args.heads}: the query heads must be a multiple of the KV heads")
    opts = Options(mods_root=root, out=args.out or kt.table_path(), mods=tuple(args.mod or MODS),
                   int8_shape=_pair(args.head, "x", "--head"), head_size=args.head_size, q_heads=q_heads, kv_heads=kv_heads,
                   candidates=max(0, args.candidates))
    if args.dtypes:
        opts.dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
        unknown = [d for d in opts.dtypes if d not in Options.dtypes]
        if unknown or not opts.dtypes:
            raise SparkmodsError(f"--dtypes: unknown {', '.join(unknown) or 'empty list'}; valid: {', '.join(Options.dtypes)}")
    if args.head_size < 16 or args.head_size > 512 or args.head_size & (args.head_size - 1):
        raise SparkmodsError(f"--head-size {args.head_size}: TurboQuant supports powers of two in [16, 512]")
    return opts


def _kerneltune(root: Path) -> ModuleType:
    """The shared table module from the mods' folder (it names the default path)."""
    import importlib.util

    path = root / "turboquant" / "files" / "sparkmods_kerneltune.py"
    spec = importlib.util.spec_from_file_location("sparkmods_kerneltune", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise SparkmodsError(f"{path} is missing: pass --mods-dir with this repository's mods/")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(args: argparse.Namespace) -> int:
    from sparkmods.tuning import speedup, tune

    opts = options(args)
    sections, measured = tune(opts, sys.stderr)
    for mod in sections:
        mine = [m for m in measured if m.mod == mod]
        print(f"{mod}: tuned {speedup(mine):.2f}x the shipped defaults' speed (geometric mean over {len(mine)} shapes; "
              f"best {max(m.shipped_us / m.tuned_us for m in mine):.2f}x)")
    print(f"wrote {opts.out}; the mods read it at start-up on this GPU "
          f"(inside a container: mount it and set SPARKMODS_TUNE_TABLE to its path)")
    return 0
