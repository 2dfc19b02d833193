#!/usr/bin/env python3
"""GB10 readiness: compile every kernel of int8-lm-head and turboquant, with every config the
mods can pick, for sm_121a (DGX Spark's GB10) and sm_90a (H100), on a CPU machine.

Why without a GPU: Triton compiles for any target (triton.compile of an ASTSource with a
GPUTarget), and its wheel ships ptxas for Blackwell, so what a Spark would compile at its first
launch (shared memory, registers, spills) is known here. A config that fits an H100's 227 KiB
but not a GB10's 99 KiB would fail with OutOfResources in the middle of serving.

Configs: every DISPATCH entry of the INT8 head after the mod's shared-memory fitting for that
target, in bf16 and fp16 and with and without a K tail, its row coding and rotation kernels;
for every TurboQuant dtype and head size (powers of two 16-512): the store kernel, the decode
with every DEFAULT_DECODE entry a (batch, context) band picks, after fitting (3-bit keys: the
PRMT lookup, KEY3_PAIR_ASM; 4-bit values: VALUE4_ASM), the split merge at every split count and column order,
the query/key rotation and the prefill dequantisation. Scalar arguments that only address memory (G = 16 query heads per
KV head, 32 query heads, page size 16) take Qwen3.5's values; pointers and strides are
specialised as 16-aligned, as the real tensors are.

    python3 ci/gb10_readiness.py --write ci/bench/results/gb10-readiness-any-cpu   # the committed table
    python3 ci/gb10_readiness.py --json FILE                              # rows only (the test)

Each row: target, kernel, config, shared bytes (Triton's launch check compares them with the
device's opt-in limit), registers and spill bytes (ptxas -v), the mod's byte model for it, for
the TurboQuant decode the SASS instructions of its tile loop (sm_90a only: the nvdisasm of
Triton's wheel, CUDA 12.8, does not read sm_121a; the decode is bound by issuing them on an H200,
so fewer is faster there), and the problems found. Exit 1 when any row has a problem. Nothing is
cached between runs: Triton's cache goes to a fresh temporary folder.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib.metadata
import io
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
SM121_SHARED = 101376  # GB10: opt-in shared memory per block (99 KiB)
SM90_SHARED = 232448  # H100: 227 KiB
TARGETS: Dict[str, Tuple[int, int]] = {"sm_121a": (121, SM121_SHARED), "sm_90a": (90, SM90_SHARED)}
HEAD_SIZES = (16, 32, 64, 128, 256, 512)
GROUP, Q_HEADS, PAGE = 16, 32, 16
BANDS = ((1, 4096), (1, 32768), (8, 4096), (8, 32768))  # one shape per DEFAULT_DECODE (batch, context) band
RESULTS = REPO / "ci" / "bench" / "results" / "gb10-readiness-any-cpu"
COMMAND = "python3 ci/gb10_readiness.py --write ci/bench/results/gb10-readiness-any-cpu"

# A job: (module, kernel name, label, constexprs, pointer dtypes, 16-divisible ints, options, model bytes or None)
Job = Tuple[str, str, str, Dict[str, Any], Dict[str, str], Tuple[str, ...], Dict[str, int], Optional[int]]


def load_modules(workdir: Path) -> Tuple[ModuleType, ModuleType, ModuleType]:
    """(int8_lm_head from its patch, tq_format, tq_triton from the mod folder): what the mods install."""
    sys.path[:0] = [str(REPO / "ci" / "bench"), str(REPO / "mods" / "turboquant" / "files")]
    import tq_format
    import tq_triton

    from benchlib import int8_lm_head_kernel

    return int8_lm_head_kernel.load_kernel_module(workdir), tq_format, tq_triton


def int8_jobs(mod: ModuleType, target: str) -> List[Job]:
    smem = TARGETS[target][1]
    jobs: List[Job] = []
    for limit, _ in mod.DISPATCH:
        cfg = mod.choose_config(limit or 4096, mod.DISPATCH, smem)
        label = f"rows<={limit or 'rest'} {cfg.kernel} {cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"
        kernel = "_int8_head_split_kernel" if cfg.kernel in (mod.SPLIT, mod.W8A8) else mod._KERNEL_FNS[cfg.kernel].__name__
        extra = {"LO": mod.LO_STEPS if cfg.kernel == mod.SPLIT else 0} if cfg.kernel in (mod.SPLIT, mod.W8A8) else {}
        for dtype in ("bf16", "fp16"):
            for even_k in (1, 0):
                consts = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "EVEN_K": even_k, **extra}
                ptrs = ({"hi_ptr": "i8", "lo_ptr": "i8", "xscale_ptr": "fp32"} if extra else {"x_ptr": dtype})
                ptrs = {**ptrs, "w_ptr": "i8", "scale_ptr": "fp32", "out_ptr": dtype}
                jobs.append(("int8", kernel, f"{label} {dtype} even_k={even_k}", consts, ptrs,
                             ("N", "K", "stride_xm", "stride_hm", "stride_wn", "stride_om"),
                             {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}, mod.shared_memory_estimate(cfg)))
    for dtype in ("bf16", "fp16"):
        for lo in (mod.LO_STEPS, 0):
            jobs.append(("int8", "_split_rows_kernel", f"split_rows {dtype} LO={lo}", {"BLOCK_K": 1024, "LO": lo},
                         {"x_ptr": dtype, "hi_ptr": "i8", "lo_ptr": "i8", "xscale_ptr": "fp32"}, ("K", "stride_xm", "stride_hm"), {}, None))
        block = mod.ROTATION_BLOCK_MIN
        while block <= mod.ROTATION_BLOCK_MAX:
            for block_m, block_n in ((16, 32), (64, 64)):  # rotate_rows: few rows, many rows
                consts = {"BLOCK": block, "BLOCK_M": block_m, "BLOCK_N": min(block_n, block), "BLOCK_K": min(64, block)}
                jobs.append(("int8", "_rotate_rows_kernel", f"rotate block {block} {block_m}x{min(block_n, block)} {dtype}", consts,
                             {"x_ptr": dtype, "r_ptr": dtype, "out_ptr": dtype}, ("stride_xm", "stride_om"), {"num_warps": 4}, None))
            block *= 2
    return jobs


def tq_jobs(fmt: ModuleType, tq: ModuleType, target: str) -> List[Job]:
    smem = TARGETS[target][1]
    jobs: List[Job] = []
    cache_ptrs = {"cache_ptr": "u8", "bt_ptr": "i32", "lens_ptr": "i32"}
    for head in HEAD_SIZES:
        for name in sorted(fmt.DTYPES):
            spec = fmt.tq_spec(name)
            layout = tq._layout_constants(spec, fmt.slot_layout(spec, head), PAGE)
            n_mid = (1 << (spec.value_bits if spec.key_fp8 else spec.key_bits)) - 1
            keys = "bf16" if spec.key_fp8 else "fp32"  # codebook keys are rotated into float32 first
            for rows in (1, tq.ROTATE_FEW_ROWS + 1):  # a decode step's tokens, a prefill's
                tokens = tq.store_tokens(rows)
                jobs.append(("tq", "_store_kernel", f"store {name} head {head} tokens {tokens}",
                             {"D": head, "BLOCK_SIZE": PAGE, "NORM_CORRECTION": int(spec.norm_correction), "N_MID": n_mid,
                              "N_MID_P": 1 << (n_mid - 1).bit_length(), "BLOCK_T": tokens, **layout},
                             {"key_ptr": keys, "value_ptr": "bf16", "cache_ptr": "u8", "slot_ptr": "i64", "centroid_ptr": "fp32",
                              "midpoint_ptr": "fp32"}, ("stride_kt", "stride_kh", "stride_vt", "stride_vh", "page_stride"),
                             {"num_warps": tq.store_warps(head, tokens)}, None))
            picked = {}
            for batch, context in BANDS:
                chosen = tq.default_decode_config(head, batch, context, name)
                cfg = tq.fitted_decode_config(chosen, spec, head, GROUP, smem)
                picked[cfg.label() if cfg else f"{chosen.label()} (does not fit)"] = cfg or chosen
            for label, cfg in sorted(picked.items()):
                lut = int(spec.key_bits == 3 and not spec.key_fp8)
                options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages, **({"maxnreg": cfg.max_regs} if cfg.max_regs else {})}
                jobs.append(("tq", "_decode_split_kernel", f"decode {name} head {head} {label}" + (" PRMT" if lut else ""),
                             {"G": GROUP, "GP": max(16, GROUP), "D": head, "BLOCK_SIZE": PAGE, "BLOCK_N": cfg.block_n,
                              "MIN_CHUNK": cfg.min_chunk, "VALUE_FIELDS": cfg.value_fields if spec.value_bits == 3 else 4,
                              "PTX": 1, **layout},
                             {"q_ptr": keys, **cache_ptrs, "centroid_ptr": "fp16", "part_o_ptr": "fp32", "part_lse_ptr": "fp32"},
                             ("stride_qb", "stride_qh", "page_stride"), options,
                             tq.decode_shared_bytes(cfg, spec, head, GROUP)))
            jobs.append(("tq", "_dequant_kernel", f"dequant {name} head {head}",
                         {"H": 2, "D": head, "BLOCK_SIZE": PAGE, "BLOCK_T": 16, **layout},
                         {"cache_ptr": "u8", "bt_ptr": "i32", "cu_ptr": "i32", "centroid_ptr": "fp32", "k_ptr": keys, "v_ptr": "bf16"},
                         ("page_stride",), {"num_warps": 4}, None))
        cfg = tq.default_decode_config(head)
        for rows in sorted({tq.merge_rows(splits) for splits in range(1, tq.MAX_SPLITS + 1)}):  # every split count
            for fields in (4, 8):  # the split kernel's field-major columns: 4-bit values, 3-bit values' two layouts
                jobs.append(("tq", "_decode_merge_kernel", f"merge head {head} rows {rows} fields {fields}",
                             {"HQ": Q_HEADS, "D": head, "MERGE_ROWS": rows, "MERGE_COLS": min(tq.MERGE_COLS, head),
                              "BLOCK_N": cfg.block_n, "MIN_CHUNK": cfg.min_chunk, "FIELDS": fields},
                             {"part_o_ptr": "fp32", "part_lse_ptr": "fp32", "lens_ptr": "i32", "out_ptr": "bf16"},
                             ("stride_ob", "stride_oh"), {"num_warps": 4}, None))
        jobs.append(("tq", "_rotate_kernel", f"rotate head {head} rows 64",
                     {"D": head, "BLOCK_R": 64, "BLOCK_C": min(64, head), "BLOCK_K": min(32, head)},
                     {"x_ptr": "bf16", "r_ptr": "fp32", "out_ptr": "fp32"}, ("stride_x",), {"num_warps": 4}, None))
        jobs.append(("tq", "_rotate_few_kernel", f"rotate head {head} few rows",
                     {"D": head, "BLOCK_C": tq.rotate_few_columns(head), "ROWS_PER": tq.ROTATE_ROWS_PER},
                     {"x_ptr": "bf16", "y_ptr": "bf16", "r_ptr": "fp32", "out_ptr": "fp32"}, ("stride_x", "stride_y"),
                     {"num_warps": 4}, None))
    return jobs


_WORKER: Dict[str, ModuleType] = {}


def _worker_init(workdir: str) -> None:
    int8, _fmt, tq = load_modules(Path(workdir))
    _WORKER.update(int8=int8, tq=tq)


def compile_job(target: str, job: Job) -> Dict[str, Any]:
    """One compile: shared bytes, registers and spills, and what is wrong with them."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, kernel, label, consts, ptrs, divisible, options, model = job
    fn = getattr(_WORKER[module], kernel)
    unset = [p.name for p in fn.params if p.is_constexpr and p.name not in consts]
    if unset:  # it would compile as a runtime argument: another kernel than the one served
        raise ValueError(f"{kernel} {label}: no value for its constexpr {', '.join(unset)}")
    signature = {a: "constexpr" if a in consts else (f"*{ptrs[a]}" if a in ptrs else ("fp32" if a == "sm_scale" else "i32"))
                 for a in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if a in ptrs or a in divisible}
    row: Dict[str, Any] = {"target": target, "mod": {"int8": "int8-lm-head", "tq": "turboquant"}[module], "kernel": kernel,
                           "config": label, "model_bytes": model}
    log = io.StringIO()
    capability, limit = TARGETS[target]
    try:
        with knobs.nvidia.scope(), contextlib.redirect_stdout(log):
            knobs.nvidia.dump_ptxas_log = True
            compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs),
                                      target=GPUTarget("cuda", capability, 32), options=options)
    except Exception as exc:  # noqa: BLE001 - any compile failure is this row's finding
        row["problems"] = [f"does not compile: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"]
        return row
    text = log.getvalue()
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    row.update(shared=compiled.metadata.shared, registers=int(regs.group(1)) if regs else None,
               spill_stores=int(spills.group(1)) if spills else None, spill_loads=int(spills.group(2)) if spills else None)
    if "PRMT" in label:
        row["prmt"] = "prmt.b32" in compiled.asm["ptx"]
    if kernel == "_decode_split_kernel":
        row.update(loop_mix(disassemble(compiled.asm["cubin"])))
    row["problems"] = problems(row, limit)
    return row


def disassemble(cubin: bytes) -> str:
    """SASS of a cubin by the nvdisasm Triton's wheel ships ("" where it has none)."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        try:
            done = subprocess.run([str(tool), "-c", str(path)], capture_output=True, text=True, timeout=120, check=False)
        except OSError:
            return ""
    return done.stdout if done.returncode == 0 else ""


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
_SASS_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_SASS_BRANCH = re.compile(r"\bBRA\s+`\((\.L_x_\d+)\)")


def loop_mix(sass: str) -> Dict[str, Any]:
    """Instructions of the longest loop in a kernel's SASS (the span of its longest backward
    branch) and its three commonest opcodes: the decode's per-tile work, a proxy for its speed
    where the decode is bound by issuing instructions rather than by memory."""
    labels: Dict[str, int] = {}
    pending: List[str] = []
    code: List[Tuple[int, str, str]] = []
    for line in sass.splitlines():
        label = _SASS_LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        found = _SASS_LINE.search(line)
        if found:
            address = int(found.group(1), 16)
            labels.update({name: address for name in pending})
            pending = []
            code.append((address, found.group(2), line))
    spans = [(labels[b.group(1)], address) for address, _, line in code
             if (b := _SASS_BRANCH.search(line)) and labels.get(b.group(1), address) < address]
    if not spans:
        return {"loop_instructions": None, "loop_ops": None}
    first, last = max(spans, key=lambda span: span[1] - span[0])
    ops: Dict[str, int] = {}
    for address, op, _ in code:
        if first <= address <= last:
            ops[op] = ops.get(op, 0) + 1
    common = sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    return {"loop_instructions": sum(ops.values()), "loop_ops": ", ".join(f"{op} {n}" for op, n in common)}


def problems(row: Dict[str, Any], limit: int) -> List[str]:
    """What stops a compiled row from serving: over the target's shared memory, a byte model that
    undercounts (the fitting rule could then pick a config that does not fit), a lost PRMT.
    Spills cost speed, not a launch: they are reported in their own columns (spilling())."""
    out = []
    if row["shared"] > limit:
        out.append(f"needs {row['shared']} bytes of shared memory, {row['target']} has {limit}")
    if row["registers"] is None or row["spill_stores"] is None:
        out.append("ptxas reported no register or spill figures")
    if row["model_bytes"] is not None and row["shared"] > row["model_bytes"] + SCRATCH_RESERVE:
        out.append(f"the byte model counts {row['model_bytes']} (+{SCRATCH_RESERVE} reserve) < {row['shared']} allocated")
    if row.get("prmt") is False:
        out.append("the 3-bit key lookup lost its prmt.b32 instructions")
    return out


SCRATCH_RESERVE = 8 * 1024  # kt.SCRATCH_RESERVE, checked equal in load_jobs


def spilling(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The rows whose kernel spills registers to local memory."""
    return [r for r in rows if r.get("spill_stores") or r.get("spill_loads")]


def load_jobs(workdir: Path) -> List[Tuple[str, Job]]:
    """Every (target, job), deduplicated (bands that pick the same config compile once)."""
    int8, fmt, tq = load_modules(workdir)
    if tq.kt.SCRATCH_RESERVE != SCRATCH_RESERVE:
        raise RuntimeError("SCRATCH_RESERVE differs from mods/turboquant/files/sparkmods_kerneltune.py")
    out, seen = [], set()
    for target in TARGETS:
        for job in int8_jobs(int8, target) + tq_jobs(fmt, tq, target):
            key = (target, job[1], json.dumps(job[3], sort_keys=True), json.dumps(job[4], sort_keys=True), json.dumps(job[6], sort_keys=True))
            if key not in seen:
                seen.add(key)
                out.append((target, job))
    return out


def run(workers: int) -> List[Dict[str, Any]]:
    """Compile every job in fresh processes (no Triton cache from before, no interpreter mode)."""
    os.environ.pop("TRITON_INTERPRET", None)
    with tempfile.TemporaryDirectory(prefix="gb10-readiness-") as tmp:
        os.environ["TRITON_CACHE_DIR"] = str(Path(tmp) / "triton-cache")
        workdir = Path(tmp) / "int8"
        workdir.mkdir()
        jobs = load_jobs(workdir)
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init,
                                                    initargs=(str(workdir),)) as pool:
            futures = [pool.submit(compile_job, target, job) for target, job in jobs]
            rows = []
            for done, future in enumerate(futures, 1):
                rows.append(future.result())
                if sys.stderr.isatty():
                    print(f"\r{done}/{len(futures)} compiled", end="", file=sys.stderr, flush=True)
    return rows


def markdown(rows: List[Dict[str, Any]], seconds: float, triton_version: str) -> str:
    lines = ["# GB10 readiness: every kernel config the mods can pick, compiled for sm_121a and sm_90a", "",
             f"Regenerate: `{COMMAND}` (CPU only, Triton {triton_version}; {seconds:.0f} s on a 2-core machine shared with other work). "
             "Checked by `tests/test_gb10_readiness.py`.", "",
             f"Limits: sm_121a (GB10) {SM121_SHARED} bytes of shared memory per block, sm_90a (H100) {SM90_SHARED}. "
             "`model` is the mod's byte model of the config (the fitting rule lowers a config until it plus "
             f"{SCRATCH_RESERVE} bytes fits the device); `-` where the kernel's tile is fixed. `loop`: the SASS "
             "instructions of the TurboQuant decode's tile loop and its commonest opcodes (sm_90a: Triton's nvdisasm "
             "does not read sm_121a).", "",
             f"{len(rows)} compiles, {sum(1 for r in rows if r['problems'])} with problems, "
             f"{len(spilling(rows))} spilling registers (sm_121a: {len(spilling([r for r in rows if r['target'] == 'sm_121a']))}).", "",
             "| target | mod | kernel | config | shared bytes | model | registers | spills (st/ld) | loop (SASS) | problems |",
             "|---|---|---|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        loop = f"{r['loop_instructions']} ({r['loop_ops']})" if r.get("loop_instructions") else "-"
        lines.append(f"| {r['target']} | {r['mod']} | `{r['kernel']}` | {r['config']} | {r.get('shared', '-')} | "
                     f"{r['model_bytes'] if r['model_bytes'] is not None else '-'} | {r.get('registers', '-')} | "
                     f"{r.get('spill_stores', '-')}/{r.get('spill_loads', '-')} | {loop} | {'; '.join(r['problems']) or 'none'} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("--write", type=Path, metavar="DIR", help="write DIR/readiness.json and DIR/readiness.md")
    out.add_argument("--json", type=Path, metavar="FILE", help="write the rows as JSON to FILE")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel compiles (default: CPU count)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    rows = run(max(1, args.workers))
    seconds = time.monotonic() - start
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    else:
        args.write.mkdir(parents=True, exist_ok=True)
        version = importlib.metadata.version("triton")
        (args.write / "readiness.json").write_text(json.dumps({"command": COMMAND, "triton": version, "rows": rows}, indent=1) + "\n",
                                                   encoding="utf-8")
        (args.write / "readiness.md").write_text(markdown(rows, seconds, version), encoding="utf-8")
    bad = [r for r in rows if r["problems"]]
    for r in bad:
        print(f"{r['target']} {r['kernel']} {r['config']}: {'; '.join(r['problems'])}", file=sys.stderr)
    print(f"{len(rows)} compiles in {seconds:.0f} s, {len(bad)} with problems, {len(spilling(rows))} spilling", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
