"""TurboQuant decode variants side by side on a GPU: the shipped kernel with and without one of
its code paths, each checked against the PyTorch reference and timed beside the benchmark's bf16
and fp8 yardsticks in the same run.

    python3 ci/bench/tq_variants.py --out DIR [--heads 256,128] [--dtypes ...] [--contexts ...]
        [--variants shipped,...] [--against OLD_tq_triton.py]

A variant is a name and the module attributes it replaces for its timing (VARIANTS): another
decode config, a code path switched off, or the decode of a copy of tq_triton.py with exact text
edits (a kernel change timed before it is made); the shipped kernel is "shipped". --against
times the same variants on another copy of tq_triton.py too (the kernel before a change, e.g.
from `git show`), each labelled "against VARIANT". Writes
DIR/tq_variants.json and prints a table (median us per call under a CUDA graph). An exploration
tool: the committed figures come from bench_turboquant.py.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_turboquant as bench


def _config(label: str) -> Callable[[ModuleType], Dict[str, Any]]:
    """The decode with one DecodeConfig (label as in DecodeConfig.label) at every shape."""
    def make(tq: ModuleType) -> Dict[str, Any]:
        cfg = bench.config_from_label(tq, label)
        return {"default_decode_config": lambda head_size, batch=1, max_context=0, dtype="*", table=None: cfg}
    return make


class EditError(Exception):
    """A source variant's edit no longer matches the mod's tq_triton.py exactly once."""


@functools.cache
def _folder() -> "tempfile.TemporaryDirectory[str]":
    """Where the edited copies live while this process runs (removed at its exit)."""
    return tempfile.TemporaryDirectory(prefix="tq-variants-")


@functools.cache
def edited_module(name: str, original: str, edits: Tuple[Tuple[str, str], ...]) -> ModuleType:
    """A copy of the tq_triton.py at path original with each `old` replaced by `new` (each must
    occur exactly once), imported by _import_copy."""
    source = Path(original).read_text()
    for old, new in edits:
        if source.count(old) != 1:
            raise EditError(f"variant {name}: an edit matches {original} {source.count(old)} times, not once; "
                            f"update tq_variants.VARIANTS to the kernel as it is now: {old[:60]!r}")
        source = source.replace(old, new)
    return _import_copy(name, source)


_COPY_IDS = itertools.count()  # each imported copy gets a file (and module) of its own


def _import_copy(name: str, source: str) -> ModuleType:
    """source (a tq_triton.py) imported as its own module from a file (Triton reads a kernel's
    source from its file), for the CPU interpreter when the benchmark's kernels run there."""
    path = Path(_folder().name) / f"tq_triton_{name.replace('-', '_')}_{next(_COPY_IDS)}.py"
    path.write_text(source)
    import triton

    with bench.mod_import_window(bench._interpreted(triton)):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    return module


def _source(name: str, *edits: Tuple[str, str]) -> Callable[[ModuleType], Dict[str, Any]]:
    """The decode of the timed tq_triton.py with these text edits (edited_module)."""
    return lambda tq: {"tq_decode": edited_module(name, tq.__file__, edits).tq_decode}


# the split kernel's grid with the KV head as its fastest axis: a request's working splits of both
# heads come first in launch order (timed, not adopted: ci/bench/results/turboquant-head-first-any-h200)
HEAD_FIRST_GRID = (("    split = tl.program_id(0)\n    kv_head = tl.program_id(1)\n",
                    "    split = tl.program_id(1)\n    kv_head = tl.program_id(0)\n"),
                   ("    return (req * tl.num_programs(1) * G + q_heads) * num_splits + split",  # the KV heads' count
                    "    return (req * tl.num_programs(0) * G + q_heads) * num_splits + split"),
                   ("_decode_split_kernel[(splits, num_kv_heads, batch)](", "_decode_split_kernel[(num_kv_heads, splits, batch)]("))

# name -> function(tq module) returning {attribute: replacement}
VARIANTS: Dict[str, Callable[[ModuleType], Dict[str, Any]]] = {
    "shipped": lambda tq: {},
    "no-ptx": lambda tq: {"inline_ptx": lambda device: False},  # plain Triton: 3-bit centroids gathered, 16-bit value masks
    **{label: _config(label) for label in ("n64/w2/s3/c128/p4/r0/f8", "n128/w4/s2/c128/p2/r0/f8", "n64/w2/s3/c128/p4/r0/f4",
                                            "n128/w4/s2/c128/p1/r0/f8", "n128/w4/s2/c128/p4/r0/f8")},
    "head-first-grid": _source("head-first-grid", *HEAD_FIRST_GRID),
    # and a batch-1 config that leaves splits idle below 128k (one working split per 512 tokens)
    "head-first-grid-c512": _source("head-first-grid-c512", *HEAD_FIRST_GRID, (
        '(256, "1", "long", "*"): DecodeConfig(128, 4, 2, 128, 2, 0, 8),',
        '(256, "1", "long", "*"): DecodeConfig(128, 4, 2, 512, 2, 0, 8),')),
    "head-first-grid-c256": _source("head-first-grid-c256", *HEAD_FIRST_GRID, (
        '(256, "1", "long", "*"): DecodeConfig(128, 4, 2, 128, 2, 0, 8),',
        '(256, "1", "long", "*"): DecodeConfig(128, 4, 2, 256, 2, 0, 8),')),
}


def run_head(head: int, args: argparse.Namespace, fmt: ModuleType, modules: Dict[str, ModuleType]) -> List[Dict[str, Any]]:
    """The chosen variants of every module (label prefix -> tq_triton module; the first is the
    mod's own) for every dtype at every shape of one head size, after the benchmark's bf16 and
    fp8 yardsticks at the same shapes (bench_turboquant.Bench does the workload, caches, inputs,
    reference and yardsticks)."""
    import torch

    ns = bench.parse_args(["--out", str(args.out), "--head-size", str(head), "--contexts", args.contexts, "--batches", args.batches])
    names = [n.strip() for n in args.dtypes.split(",")]
    runner = bench.Bench(ns, fmt, modules[""], None, bench.make_workload(ns, torch.device("cuda")), names)
    rows: List[Dict[str, Any]] = []
    runner.yardsticks(rows)
    for row in rows:
        row["head"] = head
    for name in names:
        spec = fmt.tq_spec(name)
        cache = runner.stored_cache(spec)
        for batch in ns.batches:
            for context in ns.contexts:
                q, bt, lens = runner.inputs(batch, context)
                ref = runner.reference(q, cache, bt, lens, spec)
                for prefix, tq in modules.items():
                    for variant in args.variants.split(","):
                        replaced = VARIANTS[variant](tq)
                        saved = {attr: getattr(tq, attr) for attr in replaced}
                        for attr, value in replaced.items():
                            setattr(tq, attr, value)
                        try:
                            err = bench.rel_err(tq.tq_decode(q, cache, bt, lens, runner.work.scale, spec), ref)
                            us, _ = bench.median_us(lambda: tq.tq_decode(q, cache, bt, lens, runner.work.scale, spec), False)  # noqa: F821 - timed before the del below
                        finally:
                            for attr, value in saved.items():
                                setattr(tq, attr, value)
                        kind = f"{name} {prefix}{variant}"
                        rows.append({"head": head, "kind": kind, "batch": batch, "context": context, "us": us, "vs_reference": err})
                        print(f"head {head} {kind} b{batch} {context}: {us:.1f} us, err {err:.2e}", flush=True)
        del cache
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--heads", default="256,128")
    p.add_argument("--dtypes", default="turboquant_k3v4_nc,turboquant_3bit_nc")
    p.add_argument("--contexts", default="32768,131072")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--variants", default=",".join(VARIANTS), help="which of VARIANTS to time, comma-separated")
    p.add_argument("--against", type=Path, help="another tq_triton.py to time the variants on too")
    p.add_argument("--ir", action="store_true", help="write the compiled decode kernels' TTGIR to --out")
    args = p.parse_args()
    unknown = sorted(set(args.variants.split(",")) - set(VARIANTS))
    if unknown:
        p.error(f"no variant {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    if args.against and not args.against.is_file():
        p.error(f"--against {args.against}: no such file; give a copy of tq_triton.py, e.g. from `git show REV:PATH`")
    fmt, tq = bench.load_modules(interpret=False)
    modules = {"": tq}
    if args.against:
        modules["against "] = _import_copy("against", args.against.read_text())
    import torch
    import triton

    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rows: List[Dict[str, Any]] = []
    for head in (int(h) for h in args.heads.split(",")):
        rows += run_head(head, args, fmt, modules)
    if args.ir:  # every compiled decode kernel's Triton GPU IR, one file
        texts = []
        for cache in tq._decode_split_kernel.device_caches.values():
            for key, kernel in cache[0].items():
                ir = kernel.asm["ttgir"]
                texts.append(f"=== {key}\nconvert_layout: {ir.count('convert_layout')}, local_alloc: {ir.count('local_alloc')}, "
                             f"inline_asm: {ir.count('inline_asm')}\n{ir}")
        (args.out / "decode_ttgir.txt").write_text("\n".join(texts))
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "seconds": round(time.time() - started, 1), "variants": args.variants.split(","),
            "against": str(args.against) if args.against else None}
    (args.out / "tq_variants.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out / 'tq_variants.json'}: {len(rows)} timings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
