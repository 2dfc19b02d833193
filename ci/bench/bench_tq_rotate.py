"""TurboQuant's rotation of a decode step's rows: our Triton kernel against torch.matmul, same run.

    python3 ci/bench/bench_tq_rotate.py --out DIR      # CUDA GPU; writes DIR/turboquant_rotate.{json,md}

A decode step rotates few rows (each request's query heads; each new token's key heads). On an
H100, cuBLAS's float32 GEMM took 51 us for 16 rows of head 128, most of a 70 us batch-1 decode
call, so tq_triton.rotate does it with its own kernel. This times both, under CUDA graphs
(triton.testing.do_bench_cudagraph), for the row counts of batch 1 and 8 at Qwen3.5-like head
shapes, and checks they agree (relative L2 under 1e-6: both are float32 with IEEE products).
Exit 0 when every row agrees, 1 when one does not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_turboquant import load_modules, markdown_table

SHAPES = [  # (head size, query heads, KV heads): Qwen3.5-122B (256, 32, 2) and a head-128 model
    (256, 32, 2), (128, 16, 2)]
BATCHES = (1, 8)
TOLERANCE = 1e-6


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch
    import triton

    fmt, tq = load_modules(False)
    spec = fmt.tq_spec("turboquant_k3v4_nc")
    rows: List[Dict[str, Any]] = []
    failed = False
    for head, q_heads, kv_heads in SHAPES:
        rot = tq.tables(spec, head, "cuda").rotation_t
        for batch in BATCHES:
            for what, heads in (("query", q_heads), ("key", kv_heads)):
                x = torch.randn(batch, heads, head, device="cuda").to(torch.bfloat16)
                ours, theirs = tq.rotate(x, rot), torch.matmul(x.float(), rot)
                err = float((ours - theirs).norm() / theirs.norm())
                failed |= err > TOLERANCE
                rows.append({"head": head, "rows": f"{what} b{batch} ({batch * heads})",
                             "torch_matmul_us": round(triton.testing.do_bench_cudagraph(lambda: torch.matmul(x.float(), rot)) * 1000, 2),
                             "ours_us": round(triton.testing.do_bench_cudagraph(lambda: tq.rotate(x, rot)) * 1000, 2),
                             "rel_l2": f"{err:.1e}"})
                print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name()
    (args.out / "turboquant_rotate.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1) + "\n")
    (args.out / "turboquant_rotate.md").write_text(
        f"# TurboQuant rotation of a decode step's rows: {device}\n\nMedian microseconds per call under a CUDA graph, "
        "bf16 rows in, float32 out (what tq_decode and tq_store do before their kernels).\n\n"
        + markdown_table(rows, ["head", "rows", "torch_matmul_us", "ours_us", "rel_l2"]) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
