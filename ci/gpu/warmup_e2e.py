#!/usr/bin/env python3
"""Does int8-lm-head's start-up warm-up make the first call at every row count as fast as later ones?

One GPU, torch and Triton, no vLLM: the head module is loaded from the mod's patch (as vLLM would
import it). Two fresh processes, each with an empty Triton cache, on a Qwen3.5 head
(248320 x 3072, bf16, quantised by the mod): `cold` calls the head at each row count straight
away; `warm` runs the mod's warm_up first, as its loader does while vLLM starts. For each row
count: the first call's time and the steady time (median of later calls). The warm-up keeps its
promise when every first call of `warm` is within 10 % of steady (plus 50 us of launch noise).

    python3 ci/gpu/warmup_e2e.py --out "$OUT"      # writes warmup.json and warmup.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[2]
ROWS = [1, 2, 8, 16, 17, 32, 48, 64, 100, 128, 144, 256, 1024, 4096]
VOCAB, HIDDEN = 248320, 3072
TOLERANCE, NOISE_US = 0.10, 50.0


def measure(warm: bool) -> Dict[str, Any]:
    """In this process (its own empty Triton cache): first and steady microseconds per row count."""
    import torch

    sys.path.insert(0, str(REPO / "tools"))
    from sparkmods.tuning import load_mod_package

    work = Path(tempfile.mkdtemp())
    pkg = load_mod_package(REPO / "mods/int8-lm-head/patches/common/int8_lm_head.patch", "warm_int8", work)
    int8 = __import__(pkg.__name__ + ".int8_lm_head", fromlist=["int8_lm_head"])
    device = torch.device("cuda")
    weight = int8.quantize_head(torch.randn(VOCAB, HIDDEN, device=device, dtype=torch.bfloat16) * 0.02)
    warm_s = None
    if warm:
        start = time.perf_counter()
        int8.warm_up(weight, torch.bfloat16)
        torch.cuda.synchronize()
        warm_s = time.perf_counter() - start
    rows: Dict[int, Dict[str, float]] = {}
    for m in ROWS:
        x = torch.randn(m, HIDDEN, device=device, dtype=torch.bfloat16)
        times = []
        for _ in range(12):
            torch.cuda.synchronize()
            start = time.perf_counter()
            int8.int8_matmul(x, weight)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e6)
        rows[m] = {"first_us": times[0], "steady_us": statistics.median(times[2:])}
    return {"warm": warm, "warm_up_s": warm_s, "rows": rows, "warmup_rows": int8.warmup_rows(device),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "triton": __import__("triton").__version__}


def run(mode: str) -> Dict[str, Any]:
    env = dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp(prefix=f"triton-{mode}-"), PYTHONUNBUFFERED="1")
    out = subprocess.run([sys.executable, __file__, "--child", mode], env=env, capture_output=True, text=True,
                         check=False)
    if out.returncode:
        raise SystemExit(f"warmup_e2e: the {mode} process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(cold: Dict[str, Any], warm: Dict[str, Any]) -> str:
    lines = [f"# int8-lm-head warm-up on {warm['gpu']} (torch {warm['torch']}, Triton {warm['triton']})", "",
             f"Head {VOCAB} x {HIDDEN} bf16, quantised by the mod; each process with an empty Triton cache. "
             f"Warm-up: {warm['warm_up_s']:.2f} s for row counts {warm['warmup_rows']}.", "",
             "| rows | cold first (us) | cold steady | warm first | warm steady | warm first / steady |",
             "|---:|---:|---:|---:|---:|---:|"]
    for m in ROWS:
        c, w = cold["rows"][str(m)], warm["rows"][str(m)]
        lines.append(f"| {m} | {c['first_us']:.0f} | {c['steady_us']:.0f} | {w['first_us']:.0f} | "
                     f"{w['steady_us']:.0f} | {w['first_us'] / w['steady_us']:.2f} |")
    return "\n".join(lines) + "\n"


def kept(warm: Dict[str, Any]) -> List[str]:
    """Row counts whose first call after the warm-up was not within the tolerance of steady."""
    return [m for m, r in warm["rows"].items()
            if r["first_us"] > r["steady_us"] * (1 + TOLERANCE) + NOISE_US]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", choices=["cold", "warm"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child == "warm")))
        return 0
    if args.out is None:
        ap.error("--out is required")
    cold, warm = run("cold"), run("warm")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "warmup.json").write_text(json.dumps({"cold": cold, "warm": warm}, indent=1) + "\n")
    text = report(cold, warm)
    slow = kept(warm)
    text += f"\n{'Every' if not slow else 'Not every'} first call after the warm-up is within 10 % of steady" + (
        f" (slower: rows {', '.join(slow)})." if slow else ".") + "\n"
    (args.out / "warmup.md").write_text(text)
    print(text)
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
