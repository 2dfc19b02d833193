"""One sweep of the int8-lm-head: BF16, INT8 as dispatched and the physical limits, batch 1..1024.

    python3 ci/bench/sweep_int8_lm_head.py --out DIR [--quick] [--no-tune]

For three heads (Qwen3.5-122B-A10B 248320x3072, Qwen3-8B 151936x4096, Qwen3.5-35B-A3B
248320x2048) and every batch (rows = batch x (1 + speculative tokens)) it times
`torch.matmul(x, W.t())` with the BF16 weight (what vLLM's unquantized head runs) and the mod's
`int8_matmul` exactly as dispatched (DISPATCH in the module the patch installs), and puts both
next to their physical limits: max(bytes / HBM bandwidth, 2 M N K / tensor-core peak). It then
times candidate tiles of every kernel kind (gemv, mma, split, w8a8) per row band, and measures
the accuracy of each kind on final-norm-like hidden states (ci/bench/benchlib/int8_lm_head_hidden.py).
The table it suggests per band is the fastest candidate whose kind keeps top-1 agreement with
BF16 within TOP1_TOLERANCE_PP (1.0) percentage point of the gemv path's on every head (what
the table could be, reported, never applied; int8_lm_head_kernel.py --set-dispatch applies it).
Next to the candidates it times a BF16 Triton GEMM (the GEMV kernel on the BF16 weight), a
yardstick for what Triton reaches on these shapes.
Writes DIR/sweep.json, sweep.md, speedup.svg (and speedup.png with matplotlib) and prints a
compact summary. About 5 minutes on an H100 or H200; --quick: 5 batches, fewer candidates and
states.

The limits follow the device (DEVICE_LIMITS: datasheet figures by device name); on a device
not listed the bandwidth is the measured device-to-device copy, and the summary says so.
--hbm-tbs / --tc-tflops set others.

On a machine without a GPU the same pipeline runs on tiny shapes under Triton's interpreter:
    TRITON_INTERPRET=1 python3 ci/bench/sweep_int8_lm_head.py --out DIR --device cpu \\
        --dtype float16 --heads 300x64 --batches 1,3,17 --states 32
(the tests do this; the times are meaningless there).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from benchlib.int8_lm_head_hidden import Agreement, hidden_states, norm_model
from benchlib.int8_lm_head_kernel import enable_interpreter, load_kernel_module
from benchlib.int8_lm_head_report import points, write_outputs

HEADS = (("Qwen3.5-122B-A10B", 248320, 3072), ("Qwen3-8B", 151936, 4096), ("Qwen3.5-35B-A3B", 248320, 2048))
BATCHES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
QUICK_BATCHES = (1, 16, 64, 256, 1024)
# (part of the device name, HBM TB/s, its source, dense BF16 TFLOPS, its source); first match wins.
DEVICE_LIMITS = (
    ("H200", 4.8, "H200 datasheet, HBM3e", 989.4, "H200 datasheet, dense (1979 with sparsity)"),
    ("H100 PCIe", 2.0, "H100 PCIe datasheet, HBM2e", 756.0, "H100 PCIe datasheet, dense (1513 with sparsity)"),
    ("H100 NVL", 3.9, "H100 NVL datasheet, HBM3", 835.0, "H100 NVL datasheet, dense (1671 with sparsity)"),
    ("H100", 3.35, "H100 SXM5 datasheet, HBM3", 989.4, "H100 SXM5 datasheet, dense (1979 with sparsity)"),
    ("GB10", 0.273, "DGX Spark specifications, LPDDR5x", 125.0, "our assumption, see the mod README"),
)
UNKNOWN_TC_TFLOPS = 989.4
# Dense INT8 tensor-core rate over dense BF16: 2 on Hopper (H100 SXM5: 1979 TOPS against 989.4 TFLOPS)
# and on the H200; assumed the same on GB10 (not measured there).
INT8_TC_FACTOR = 2.0
STATES, QUICK_STATES, STATE_CHUNK = 8192, 512, 512  # 8192: a top-1 rate to ~0.1 point
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
# Candidate tiles, per row band of a suggested DISPATCH: (largest rows of the band, specs); a spec
# is (kernel, block_m, block_n, block_k, warps, stages). gemv: x rows on the left, the weight tile
# converted to bf16; mma: the converted weight tile on the left; split: x as two int8 parts on the
# INT8 tensor cores, no conversion; w8a8: x rounded to one int8 part, one INT8 product (half
# split's MMA work; its shared memory per stage is smaller, so deeper K tiles fit). Every batch
# times the candidates of its band (and the shipped tile); QUICK the first of each kind.
_MANY = (("split", 128, 128, 128, 8, 4), ("split", 128, 128, 128, 8, 3), ("split", 128, 128, 64, 8, 5),
         ("split", 64, 256, 128, 8, 3), ("split", 128, 64, 128, 8, 4), ("split", 256, 64, 128, 8, 3),
         ("gemv", 128, 128, 64, 4, 3), ("gemv", 256, 128, 64, 8, 3), ("mma", 256, 128, 64, 8, 4),
         ("w8a8", 128, 128, 128, 8, 4), ("w8a8", 64, 256, 128, 8, 3), ("w8a8", 128, 256, 128, 8, 3),
         ("w8a8", 256, 128, 128, 8, 3), ("w8a8", 128, 128, 256, 8, 3))
CANDIDATE_BANDS = (
    (16, (("gemv", 16, 32, 256, 4, 4), ("split", 16, 32, 256, 4, 4), ("split", 16, 64, 256, 4, 4),
          ("split", 16, 128, 128, 4, 4), ("split", 16, 64, 512, 4, 3), ("gemv", 16, 64, 256, 4, 4),
          ("w8a8", 16, 64, 256, 4, 4), ("w8a8", 16, 128, 256, 4, 4))),
    (32, (("gemv", 32, 64, 256, 4, 4), ("split", 32, 64, 256, 4, 4), ("split", 32, 128, 128, 4, 4),
          ("split", 32, 64, 128, 4, 5), ("gemv", 32, 32, 256, 4, 4), ("w8a8", 32, 64, 256, 4, 4),
          ("w8a8", 32, 128, 256, 4, 4))),
    (64, (("split", 64, 128, 128, 4, 4), ("gemv", 64, 128, 64, 4, 3), ("split", 64, 128, 64, 4, 5),
          ("split", 64, 256, 128, 8, 3), ("split", 64, 64, 128, 4, 4), ("mma", 64, 64, 128, 4, 4),
          ("w8a8", 64, 64, 128, 4, 4), ("w8a8", 64, 128, 128, 4, 4), ("w8a8", 64, 128, 256, 4, 3))),
    (128, (("split", 128, 128, 128, 8, 4), ("gemv", 128, 128, 64, 4, 3), ("split", 128, 128, 128, 8, 3),
           ("split", 128, 128, 64, 8, 5), ("split", 64, 256, 128, 8, 3), ("split", 128, 64, 128, 8, 4),
           ("gemv", 128, 128, 64, 8, 3), ("w8a8", 128, 128, 128, 8, 4), ("w8a8", 64, 256, 128, 8, 3),
           ("w8a8", 128, 128, 256, 8, 3))),
    (256, _MANY),
    (None, _MANY),
)
KINDS = ("gemv", "mma", "split", "w8a8")  # every kind is timed and its accuracy measured
# The suggested table keeps a kind only if, on every head, its top-1 agreement with BF16 is at
# most this many percentage points below the gemv path's (gemv is the reference INT8 path:
# weight rounding only, FP32 products of the bf16 hidden states).
# One point: the rotated W8A8 kind (x rounded to INT8 per row after the head's rotation) costs
# 0.34-0.76 points on the three heads (results/int8-lm-head-sweep-any-h100/) and is the only kind that keeps
# INT8 at or above BF16 speed once the head turns compute-bound (>= ~192 rows); the weight-only
# kinds there run at 0.8x. For scale: BF16 itself disagrees with exact FP32 logits on ~2 % of
# these states (near-ties), and the mean logit error stays under 1 % of the logit RMS.
TOP1_TOLERANCE_PP = 1.0
# The BF16 Triton yardstick: the GEMV kernel on the BF16 weight, at these tiles (best one kept).
YARDSTICK = (("gemv", 128, 256, 64, 8, 3), ("gemv", 128, 128, 64, 8, 4), ("gemv", 64, 128, 64, 4, 4))
YARDSTICK_FROM = 48  # rows; below, the yardstick is not timed (the BF16 head is memory-bound)


class SweepError(Exception):
    """Bad input or a machine that cannot run the sweep; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class Head:
    model: str
    n: int
    k: int

    @property
    def name(self) -> str:
        return f"{self.n}x{self.k}"


def parse_heads(text: Optional[str]) -> List[Head]:
    if text is None:
        return [Head(*h) for h in HEADS]
    heads = []
    for part in text.split(","):
        n, sep, k = part.strip().partition("x")
        if not sep or not n.isdigit() or not k.isdigit() or int(n) == 0 or int(k) == 0:
            raise SweepError(f"--heads {text!r}: expected VOCABxHIDDEN[,...] such as 248320x3072")
        heads.append(Head("custom", int(n), int(k)))
    return heads


def parse_batches(text: Optional[str], quick: bool) -> List[int]:
    if text is None:
        return list(QUICK_BATCHES if quick else BATCHES)
    try:
        batches = sorted({int(b) for b in text.split(",")})
    except ValueError:
        raise SweepError(f"--batches {text!r}: expected positive integers separated by commas") from None
    if not batches or batches[0] < 1:
        raise SweepError(f"--batches {text!r}: expected positive integers separated by commas")
    return batches


def make_timer(device: torch.device, quick: bool) -> Callable[[Callable[[], object]], float]:
    """Median microseconds of fn: triton.testing.do_bench on CUDA, a short loop elsewhere."""
    if device.type == "cuda":
        from triton.testing import do_bench

        rep = 40 if quick else 100

        def cuda_time(fn: Callable[[], object]) -> float:
            return 1e3 * do_bench(fn, warmup=20, rep=rep, return_mode="median")

        return cuda_time

    def loop_time(fn: Callable[[], object]) -> float:
        fn()
        samples = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            samples.append(1e6 * (time.perf_counter() - start))
        return statistics.median(samples)

    return loop_time


def device_limits(name: str, copy_tbs: Optional[float]) -> Tuple[float, str, float, str]:
    """(HBM TB/s, source, dense BF16 TFLOPS, source) for a device name; measured copy when unknown."""
    for part, hbm, hbm_source, tc, tc_source in DEVICE_LIMITS:
        if part in name:
            return hbm, hbm_source, tc, tc_source
    if copy_tbs is None:  # not a GPU (interpreter runs): figures for the pipeline only
        _, hbm, _, tc, _ = next(row for row in DEVICE_LIMITS if row[0] == "H100")
        return hbm, f"{name}: H100 SXM5 figure, for the pipeline only", tc, f"{name}: H100 SXM5 figure"
    return (round(copy_tbs, 2), f"{name} not in DEVICE_LIMITS: measured device copy", UNKNOWN_TC_TFLOPS,
            f"{name} not in DEVICE_LIMITS: H100/H200 figure assumed")


def limits(head: Head, m: int, hbm_tbs: float, tc_tflops: float) -> Tuple[float, float]:
    """(BF16, INT8) lower bounds in microseconds: max(bytes / bandwidth, flops / peak).

    The INT8 peak is INT8_TC_FACTOR times the BF16 one: the INT8 head's many-row path (w8a8)
    runs on the INT8 tensor cores.
    """
    act = m * head.k * 2 + m * head.n * 2
    compute = 2 * m * head.n * head.k / (tc_tflops * 1e12)
    bf16 = max((head.n * head.k * 2 + act) / (hbm_tbs * 1e12), compute)
    int8 = max((head.n * head.k + head.n * 4 + act) / (hbm_tbs * 1e12), compute / INT8_TC_FACTOR)
    return 1e6 * bf16, 1e6 * int8


def describe(cfg) -> str:
    return f"{cfg.kernel} {cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"


def make_weight(head: Head, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Gaussian rows (std 0.02) with a log-normal spread of row norms, as LM heads have."""
    w = torch.randn(head.n, head.k, generator=gen, device=gen.device) * 0.02
    w *= torch.exp(0.3 * torch.randn(head.n, 1, generator=gen, device=gen.device))
    return w.to(dtype)


def band_of(m: int) -> int:
    """Index of the CANDIDATE_BANDS entry that serves m rows."""
    return next(i for i, (limit, _) in enumerate(CANDIDATE_BANDS) if limit is None or m <= limit)


def band_specs(m: int, quick: bool) -> Tuple[tuple, ...]:
    """The candidate specs timed at m rows: the band's, or under quick its first of each kind."""
    specs = CANDIDATE_BANDS[band_of(m)][1]
    if not quick:
        return specs
    first: Dict[str, tuple] = {}
    for spec in specs:
        first.setdefault(spec[0], spec)
    return tuple(first.values())


def time_candidates(mod, qw, x: torch.Tensor, specs: Sequence[tuple], timer, failed: set) -> Dict[str, Optional[float]]:
    """Microseconds per candidate tile; None for one that fails to compile or launch (named once in failed)."""
    times: Dict[str, Optional[float]] = {}
    for spec in specs:
        cfg = mod.KernelConfig(*spec)
        try:
            times[describe(cfg)] = timer(lambda: mod.int8_matmul(x, qw, cfg))
        except Exception as exc:  # noqa: BLE001 - e.g. Triton OutOfResources: reported, not fatal
            failed.add(f"{describe(cfg)}: {type(exc).__name__}")
            times[describe(cfg)] = None
    return times


def sweep_head(mod, head: Head, batches: Sequence[int], args, timers: tuple, gen: torch.Generator,
               failed: set) -> Tuple[list, dict]:
    """Speed rows of one head and its candidate timings per batch.

    timers: the one for the shipped INT8 and BF16 times (longer runs, twice each) and a shorter
    one for the candidates, which keeps the whole sweep within one GPU call.
    """
    timer, candidate_timer = timers
    device, dtype = gen.device, DTYPES[args.dtype]
    w = make_weight(head, gen, dtype)
    qw = mod.quantize_head(w)
    dense = mod.Int8Weight(w, torch.ones(head.n, dtype=torch.float32, device=device))  # the BF16 yardstick
    rows, tuned = [], {}
    for m in batches:
        x = torch.randn(m, head.k, generator=gen, device=device).to(dtype)
        cfg = mod.pick_config(m, device)
        int8_runs = [timer(lambda: mod.int8_matmul(x, qw)) for _ in range(2)]
        bf16_runs = [timer(lambda: torch.matmul(x, w.t())) for _ in range(2)]
        t8, t16 = min(int8_runs), min(bf16_runs)
        lim16, lim8 = limits(head, m, args.hbm_tbs, args.tc_tflops)
        row = {
            "head": head.name, "model": head.model, "batch": m,
            "bf16_us": t16, "int8_us": t8, "int8_config": describe(cfg), "speedup": t16 / t8,
            "spread_pct": 100 * max(max(int8_runs) / t8, max(bf16_runs) / t16) - 100,
            "bf16_limit_us": lim16, "int8_limit_us": lim8, "limit_speedup": lim16 / lim8,
            "bf16_pct_of_limit": 100 * lim16 / t16, "int8_pct_of_limit": 100 * lim8 / t8,
        }
        if not args.no_tune:
            specs = tuple(dict.fromkeys(band_specs(m, args.quick) + (dataclasses.astuple(cfg),)))
            times = time_candidates(mod, qw, x, specs, candidate_timer, failed)
            tuned[m] = times
            done = {name: t for name, t in times.items() if t is not None}
            if done:
                best = min(done, key=done.__getitem__)
                row.update(best_us=done[best], best_config=best, best_speedup=t16 / done[best])
            if m >= YARDSTICK_FROM:
                stick = time_candidates(mod, dense, x, YARDSTICK, candidate_timer, failed).values()
                stick = [t for t in stick if t is not None]
                row["triton_bf16_us"] = min(stick) if stick else None
        rows.append(row)
    return rows, tuned


def accuracy_configs(mod) -> Dict[str, object]:
    """One config per kernel kind for the accuracy run: the first DISPATCH ships, else its first candidate.

    The tile does not change what a kind computes beyond FP32 summation order (gemv, mma) or
    not at all (split, w8a8: exact INT32 sums).
    """
    kinds: Dict[str, object] = {}
    for _, cfg in mod.DISPATCH:
        kinds.setdefault(cfg.kernel, cfg)
    for _, specs in CANDIDATE_BANDS:
        for spec in specs:
            kinds.setdefault(spec[0], mod.KernelConfig(*spec))
    return {kind: kinds[kind] for kind in KINDS}


def accuracy(mod, head: Head, states: int, args, gen: torch.Generator) -> Dict[str, dict]:
    """Per kernel kind: INT8 against BF16 (and both against FP32) on final-norm-like hidden states."""
    dtype = DTYPES[args.dtype]
    w = make_weight(head, gen, dtype)
    qw = mod.quantize_head(w)
    wf = w.float()
    model = norm_model(head.k, gen)
    kinds = accuracy_configs(mod)
    agreements = {kind: Agreement() for kind in kinds}
    for start in range(0, states, STATE_CHUNK):
        x = hidden_states(model, w, min(STATE_CHUNK, states - start), gen, dtype)
        bf16, ref = torch.matmul(x, w.t()), x.float() @ wf.t()
        for kind, cfg in kinds.items():
            agreements[kind].add(mod.int8_matmul(x, qw, cfg), bf16, ref)
    return {f"{head.name} {kind}": agreement.result() for kind, agreement in agreements.items()}


def dispatch_line(limit: Optional[int], name: str) -> str:
    """One DISPATCH entry in the module's own syntax, from a describe() name."""
    kernel, tile, warps, stages = name.split()
    bm, bn, bk = tile.split("x")
    return (f"    ({limit}, KernelConfig({kernel.upper()}, block_m={bm}, block_n={bn}, block_k={bk}, "
            f"num_warps={warps[1:]}, num_stages={stages[1:]})),")


def top1_drops(acc: Dict[str, dict]) -> Dict[str, float]:
    """Per kind: the largest drop, over heads, of its top-1 agreement with BF16 below gemv's, in points."""
    drops: Dict[str, float] = {}
    for key, a in acc.items():
        head, kind = key.rsplit(" ", 1)
        drop = 100 * (acc[f"{head} gemv"]["top1_int8_vs_bf16"] - a["top1_int8_vs_bf16"])
        drops[kind] = max(drops.get(kind, drop), drop)
    return drops


def tuning_summary(mod, tuned: Dict[str, dict], device: torch.device, acc: Dict[str, dict]) -> dict:
    """Per candidate band: the shipped tile(s) against the fastest candidate the accuracy rule allows.

    The geo-mean runs over every head and batch of the band, among candidates timed at all of
    them. The suggestion is the lowest geo-mean among kinds whose top-1 drop against gemv
    (top1_drops) is at most TOP1_TOLERANCE_PP; the fastest candidate of any kind is reported
    next to it with its own drop, so each band says what its speed costs in agreement. A band
    no tuned batch falls in keeps the shipped tile (ratio None: not tuned). Adjacent bands with
    the same suggested tile make one DISPATCH entry.
    """
    drops = top1_drops(acc)
    bands, entries, lower = [], [], 0
    for limit, _ in CANDIDATE_BANDS:
        in_band = [m for per in tuned.values() for m in per if lower < m and (limit is None or m <= limit)]
        shipped = sorted({describe(mod.pick_config(m, device)) for m in in_band}) or [describe(mod.table_config(limit or lower + 1))]
        samples: Dict[str, List[Optional[float]]] = {}
        for head_times in tuned.values():
            for m, times in head_times.items():
                if lower < m and (limit is None or m <= limit):
                    for name, t in times.items():
                        samples.setdefault(name, []).append(t)
        lower = limit or lower
        count = max((len(ts) for ts in samples.values()), default=0)
        complete = {n: ts for n, ts in samples.items() if len(ts) == count and all(t is not None for t in ts)}
        geo = {n: math.exp(statistics.fmean(math.log(t) for t in ts)) for n, ts in complete.items()}
        allowed = {n: t for n, t in geo.items() if drops[n.split()[0]] <= TOP1_TOLERANCE_PP}
        best = min(allowed, key=allowed.__getitem__) if allowed else shipped[0]
        fastest = min(geo, key=geo.__getitem__) if geo else best
        ratio = geo[shipped[0]] / geo[best] if len(shipped) == 1 and shipped[0] in geo else None
        bands.append({"limit": limit, "shipped": ", ".join(shipped), "suggested": best, "ratio": ratio,
                      "top1_drop_pp": drops[best.split()[0]], "fastest": fastest,
                      "fastest_top1_drop_pp": drops[fastest.split()[0]],
                      "fastest_gain": geo[best] / geo[fastest] if best in geo else None})
        if entries and entries[-1][1] == best:
            entries.pop()
        entries.append((limit, best))
    lines = [dispatch_line(limit, name) for limit, name in entries]
    return {"bands": bands, "top1_tolerance_pp": TOP1_TOLERANCE_PP, "top1_drops_pp": drops,
            "dispatch_python": "DISPATCH = (\n" + "\n".join(lines) + "\n)"}


def copy_tbs(device: torch.device, quick: bool) -> Optional[float]:
    """A device-to-device copy of 1 GiB, bytes read plus written per second (CUDA only)."""
    if device.type != "cuda":
        return None
    src = torch.empty(1024**3, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    us = make_timer(device, quick)(lambda: dst.copy_(src))
    return 2 * src.numel() / (us * 1e-6) / 1e12


def set_limits(args, name: str, copy: Optional[float]) -> None:
    """Fill the limits the command line left open from the device's figures."""
    hbm, hbm_source, tc, tc_source = (None, "", None, "")
    if args.hbm_tbs is None or args.tc_tflops is None:
        hbm, hbm_source, tc, tc_source = device_limits(name, copy)
    if args.hbm_tbs is None:
        args.hbm_tbs, args.hbm_source = hbm, args.hbm_source or hbm_source
    if args.tc_tflops is None:
        args.tc_tflops, args.tc_source = tc, args.tc_source or tc_source
    args.hbm_source = args.hbm_source or "given with --hbm-tbs"
    args.tc_source = args.tc_source or "given with --tc-tflops"


def run(args) -> dict:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SweepError("no CUDA device: run on a GPU machine, or pass --device cpu with TRITON_INTERPRET=1")
    enable_interpreter()
    with tempfile.TemporaryDirectory() as tmp:
        mod = load_kernel_module(Path(tmp))
    if mod.triton is None:
        raise SweepError("Triton is not importable: install triton (3.6 was used for the committed results)")
    if device.type != "cuda" and not mod._interpreted():
        raise SweepError(f"--device {args.device} runs the Triton kernels only under TRITON_INTERPRET=1; set it")
    torch.backends.cuda.matmul.allow_tf32 = False  # the FP32 reference stays FP32
    heads = parse_heads(args.heads)
    batches = parse_batches(args.batches, args.quick)
    states = args.states or (QUICK_STATES if args.quick else STATES)
    timers = (make_timer(device, args.quick), make_timer(device, True))
    gen = torch.Generator(device=device).manual_seed(2024)
    started = time.perf_counter()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{device.type} (Triton interpreter)"
    copy = copy_tbs(device, args.quick)
    set_limits(args, name, copy)
    rows, tuned, acc, failed = [], {}, {}, set()
    for head in heads:
        head_rows, tuned[head.name] = sweep_head(mod, head, batches, args, timers, gen, failed)
        rows += head_rows
        acc.update(accuracy(mod, head, states, args, gen))
        print(f"{head.name}: done at {time.perf_counter() - started:.0f} s", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {
        "device": name,
        "torch": torch.__version__, "triton": mod.triton.__version__, "dtype": args.dtype, "quick": args.quick,
        "copy_tbs": copy,
        "limits": {"hbm_tbs": args.hbm_tbs, "hbm_source": args.hbm_source, "tc_tflops": args.tc_tflops,
                   "tc_source": args.tc_source},
        "failed_candidates": sorted(failed),
        "dispatch": [[limit, describe(cfg)] for limit, cfg in mod.DISPATCH],
        "heads": [dataclasses.asdict(h) for h in heads],
        "rows": rows, "accuracy": acc,
        "tuning": None if args.no_tune else tuning_summary(mod, tuned, device, acc),
        "tuning_times": {h: {str(m): t for m, t in per.items()} for h, per in tuned.items()},
        "seconds": time.perf_counter() - started,
    }


def summary(data: dict) -> str:
    """A few lines: limits, speed-ups (as dispatched and best candidate) per head, bands, accuracy."""
    lim = data["limits"]
    lines = [f"{data['device']}: {data['seconds']:.0f} s; limits {lim['hbm_tbs']} TB/s ({lim['hbm_source']}), "
             f"{lim['tc_tflops']} TFLOPS ({lim['tc_source']}); copy "
             + ("not measured" if data["copy_tbs"] is None else f"{data['copy_tbs']:.2f} TB/s")]
    for head in data["heads"]:
        name = f"{head['n']}x{head['k']}"
        rows = [r for r in data["rows"] if r["head"] == name]
        lines.append(f"{name} speed-up shipped: " + " ".join(f"{r['batch']}:{r['speedup']:.2f}" for r in rows))
        if any("best_speedup" in r for r in rows):
            lines.append(f"{name} speed-up best:    " + " ".join(
                f"{r['batch']}:{r['best_speedup']:.2f}" for r in rows if "best_speedup" in r))
    for band in (data.get("tuning") or {}).get("bands", []):
        ratio = "-" if band["ratio"] is None else f"{band['ratio']:.3f}"
        line = (f"band <= {band['limit'] or 'rest'}: shipped {band['shipped']} / best {band['suggested']} = {ratio}, "
                f"top-1 {points(band['top1_drop_pp'])} vs gemv")
        if band["fastest"] != band["suggested"]:
            gain = "-" if band["fastest_gain"] is None else f"{band['fastest_gain']:.3f}x faster"
            line += f"; fastest {band['fastest']} ({gain}, top-1 {points(band['fastest_top1_drop_pp'])}: excluded)"
        lines.append(line)
    for key, a in data["accuracy"].items():
        lines.append(f"{key}: top-1 INT8=BF16 {100 * a['top1_int8_vs_bf16']:.2f} % over {a['states']} states, "
                     f"max |INT8-BF16| {a['max_abs_int8_vs_bf16']:.4f}, mean {a['mean_abs_int8_vs_bf16']:.5f}")
    if data.get("failed_candidates"):
        lines.append("failed: " + "; ".join(data["failed_candidates"]))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for sweep.json, sweep.md and the plot")
    parser.add_argument("--quick", action="store_true", help="5 batches, 1 candidate a kind and band, 512 states")
    parser.add_argument("--no-tune", action="store_true", help="skip timing the candidate tiles")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu under TRITON_INTERPRET=1")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="hidden-state and head dtype")
    parser.add_argument("--heads", help="VOCABxHIDDEN[,...] instead of the three Qwen heads")
    parser.add_argument("--batches", help="comma-separated row counts instead of 1..1024")
    parser.add_argument("--states", type=int, help=f"hidden states for the accuracy check (default {STATES})")
    parser.add_argument("--hbm-tbs", type=float, help="HBM bandwidth in TB/s (default: the device's, DEVICE_LIMITS)")
    parser.add_argument("--hbm-source", default="", help="where the --hbm-tbs figure comes from")
    parser.add_argument("--tc-tflops", type=float, help="dense BF16 TFLOPS (default: the device's, DEVICE_LIMITS)")
    parser.add_argument("--tc-source", default="", help="where the --tc-tflops figure comes from")
    args = parser.parse_args(argv)
    try:
        if args.states is not None and args.states < 1:
            raise SweepError(f"--states {args.states}: must be at least 1")
        if args.device not in ("cuda", "cpu") and not args.device.startswith("cuda:"):
            raise SweepError(f"--device {args.device!r}: expected cuda, cuda:N or cpu")
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SweepError(f"--out {args.out}: cannot create the folder ({exc.strerror}); pass a writable folder") from None
        data = run(args)
    except SweepError as exc:
        print(f"sweep_int8_lm_head: {exc}", file=sys.stderr)
        return 2
    (args.out / "sweep.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    written = ["sweep.json", *write_outputs(data, args.out)]
    print(summary(data))
    print(f"wrote {', '.join(written)} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
