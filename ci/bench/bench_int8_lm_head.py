"""Benchmark the int8-lm-head Triton kernel against bf16 torch.matmul on a CUDA GPU.

    python3 ci/bench/bench_int8_lm_head.py --out DIR [--peak-tbs 3.35] [--sweep]

For each head shape and batch it reports the kernel's median time, the bytes it must move
(INT8 weight + FP32 scales + bf16 activations in and logits out) over that time, that rate
as a fraction of the stated peak HBM bandwidth and of a measured device-to-device copy, and
the speed-up over `torch.matmul(x, W.t())` with the bf16 weight (what vLLM's unquantized
head runs). Each configuration is timed twice; the spread between the two runs is shown.
--sweep also times candidate GEMV-kernel tiles on the first shape (batches 1, 16, 64, 256);
sweep_int8_lm_head.py is the batch 1..1024 sweep of both kernels.
Needs torch and Triton, not vLLM.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import tempfile
from pathlib import Path

import torch

from benchlib.int8_lm_head_kernel import load_kernel_module

SHAPES = ((248320, 3072), (151936, 4096), (32001, 2048))
BATCHES = (1, 2, 4, 8, 16)
LARGER = (32, 64, 256)


def median_ms(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=50, rep=300, return_mode="median")


def copy_tbs() -> float:
    """Device-to-device copy of 2 GiB, counting bytes read plus bytes written."""
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3) / 1e12


def bench_shape(mod, n: int, k: int, batches, peak: float, copy: float) -> list:
    w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
    qw = mod.quantize_head(w)
    rows = []
    for m in batches:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        int8_runs = [median_ms(lambda: mod.int8_matmul(x, qw)) for _ in range(2)]
        bf16_runs = [median_ms(lambda: torch.matmul(x, w.t())) for _ in range(2)]
        t8, t16 = min(int8_runs), min(bf16_runs)
        act = m * k * 2 + m * n * 2
        bytes8 = qw.nbytes + act
        bytes16 = n * k * 2 + act
        rows.append({
            "shape": f"{n}x{k}",
            "batch": m,
            "int8_us": round(t8 * 1e3, 1),
            "int8_spread_pct": round(100 * (max(int8_runs) - t8) / t8, 1),
            "int8_TBs": round(bytes8 / (t8 * 1e-3) / 1e12, 3),
            "int8_pct_peak": round(100 * bytes8 / (t8 * 1e-3) / (peak * 1e12), 1),
            "int8_pct_copy": round(100 * bytes8 / (t8 * 1e-3) / (copy * 1e12), 1),
            "bf16_us": round(t16 * 1e3, 1),
            "bf16_TBs": round(bytes16 / (t16 * 1e-3) / 1e12, 3),
            "bf16_pct_peak": round(100 * bytes16 / (t16 * 1e-3) / (peak * 1e12), 1),
            "speedup": round(t16 / t8, 2),
        })
        print(json.dumps(rows[-1]), flush=True)
    return rows


# Candidate tiles: decode batches (one 16-row block), then larger batches (taller blocks).
SWEEP_GRIDS = (
    ((1, 16), ((16,), (32, 64, 128), (128, 256, 512), (4, 8), (3, 4))),
    ((64, 256), ((32, 64, 128), (64, 128, 256), (64, 128), (4, 8), (3, 4))),
)


def sweep(mod, n: int, k: int) -> list:
    """Time candidate tile configurations (the table in pick_config came from this)."""
    w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
    qw = mod.quantize_head(w)
    del w
    rows = []
    for batches, grid in SWEEP_GRIDS:
        for m, (bm, bn, bk, warps, stages) in itertools.product(batches, itertools.product(*grid)):
            if bm > m and m > 16:
                continue
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            cfg = mod.KernelConfig(mod.GEMV, bm, bn, bk, warps, stages)
            try:
                ms = median_ms(lambda: mod.int8_matmul(x, qw, cfg))
            except Exception as exc:  # noqa: BLE001 - a config that does not fit is reported, not fatal
                rows.append({"batch": m, "config": dataclasses.asdict(cfg), "error": type(exc).__name__})
                continue
            tbs = (qw.nbytes + m * k * 2 + m * n * 2) / (ms * 1e-3) / 1e12
            rows.append({"batch": m, "config": dataclasses.asdict(cfg), "us": round(ms * 1e3, 1), "TBs": round(tbs, 3)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def shared_memory_report(mod, k: int) -> list:
    """Triton's compiled shared-memory size of each tile shape next to pick_config's estimate,
    for this GPU's budget and for a 99 KiB one (sm_12x parts such as GB10)."""
    small_budget = 101376 - 8 * 1024
    rows = []
    for limit, cfg in mod.DISPATCH:
        m = limit or 256
        real_budget = mod._shared_memory
        mod._shared_memory = lambda _device: small_budget
        try:
            small = mod.pick_config(m, torch.device("cuda", torch.cuda.current_device()))
        finally:
            mod._shared_memory = real_budget
        for label, c in (("this GPU", cfg), ("99 KiB budget", small)):
            x = torch.empty(m, k, dtype=torch.bfloat16, device="cuda")
            q = torch.empty(1024, k, dtype=torch.int8, device="cuda")
            s = torch.empty(1024, dtype=torch.float32, device="cuda")
            out = torch.empty(m, 1024, dtype=torch.bfloat16, device="cuda")
            # the split kernel takes x as hi, lo (int8) and a row scale
            rows_in = (*mod.split_rows(x),) if c.kernel == mod.SPLIT else (x,)
            extra = {"LO": mod.LO_STEPS} if c.kernel == mod.SPLIT else {}
            compiled = mod._KERNEL_FNS[c.kernel].warmup(
                *rows_in, q, s, out, m, 1024, k, k, k, 1024, grid=(1,), BLOCK_M=c.block_m, BLOCK_N=c.block_n,
                BLOCK_K=c.block_k, EVEN_K=k % c.block_k == 0, num_warps=c.num_warps, num_stages=c.num_stages,
                **extra)
            rows.append({"batch_up_to": limit, "budget": label, "config": dataclasses.asdict(c),
                         "estimate": mod.shared_memory_estimate(c), "compiled": compiled.metadata.shared})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(rows: list, peak: float, copy: float, device: str) -> str:
    lines = [
        f"Device: {device}. Peak HBM bandwidth taken as {peak} TB/s; measured device-to-device "
        f"copy: {copy:.2f} TB/s (read + write).",
        "",
        "| head (vocab x hidden) | batch | INT8 kernel (us) | INT8 TB/s | % of peak | % of copy "
        "| bf16 matmul (us) | bf16 TB/s | speed-up |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['batch']} | {r['int8_us']} | {r['int8_TBs']:.2f} | {r['int8_pct_peak']} "
            f"| {r['int8_pct_copy']} | {r['bf16_us']} | {r['bf16_TBs']:.2f} | {r['speedup']}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for bench.json and bench.md")
    parser.add_argument("--peak-tbs", type=float, default=3.35,
                        help="peak HBM bandwidth in TB/s (default 3.35: H100 SXM5 80GB HBM3)")
    parser.add_argument("--sweep", action="store_true", help="also time candidate tile configurations")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_int8_lm_head: no CUDA device", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        mod = load_kernel_module(Path(tmp))
    if mod.triton is None:
        print("bench_int8_lm_head: Triton is not importable", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    copy = copy_tbs()
    print(json.dumps({"device": device, "copy_TBs": round(copy, 3), "peak_TBs": args.peak_tbs}), flush=True)
    rows = []
    for i, (n, k) in enumerate(SHAPES):
        rows += bench_shape(mod, n, k, BATCHES + (LARGER if i == 0 else ()), args.peak_tbs, copy)
        torch.cuda.empty_cache()
    result = {"device": device, "torch": torch.__version__, "triton": mod.triton.__version__,
              "peak_TBs": args.peak_tbs, "copy_TBs": round(copy, 3), "rows": rows}
    result["shared_memory"] = shared_memory_report(mod, SHAPES[0][1])
    if args.sweep:
        result["sweep"] = sweep(mod, *SHAPES[0])
    table = markdown(rows, args.peak_tbs, copy, device)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        (args.out / "bench.md").write_text(table, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
