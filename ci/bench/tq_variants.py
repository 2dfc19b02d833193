"""TurboQuant decode variants side by side on a GPU: the shipped kernel with and without one of
its code paths, each checked against the PyTorch reference and timed beside the bf16 yardstick
(torch SDPA forced onto flash) in the same run.

    python3 ci/bench/tq_variants.py --out DIR [--heads 256,128] [--dtypes ...] [--contexts ...]

A variant is a name and the module attributes it replaces for its timing (VARIANTS); the
shipped kernel is "shipped". Writes DIR/tq_variants.json and prints a table (median us per
call under a CUDA graph). An exploration tool: the committed figures come from
bench_turboquant.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_turboquant as bench  # noqa: E402

# name -> function(tq module) returning {attribute: replacement}
def _config(label: str) -> Callable[[ModuleType], Dict[str, Any]]:
    """The decode with one DecodeConfig (label as in DecodeConfig.label) at every shape."""
    def make(tq: ModuleType) -> Dict[str, Any]:
        cfg = bench.config_from_label(tq, label)
        return {"default_decode_config": lambda head_size, batch=1, max_context=0, dtype="*": cfg}
    return make


VARIANTS: Dict[str, Callable[[ModuleType], Dict[str, Any]]] = {
    "shipped": lambda tq: {},
    "gather-keys": lambda tq: {"key_lookup": lambda spec, device: False},  # 3-bit centroids from the table in memory
    **{label: _config(label) for label in ("n64/w2/s3/c128/p4/r0/f8", "n128/w4/s2/c128/p2/r0/f8", "n64/w2/s3/c128/p4/r0/f4")},
}


def run_head(head: int, args: argparse.Namespace, fmt: ModuleType, tq: ModuleType) -> List[Dict[str, Any]]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ns = bench.parse_args(["--out", str(args.out), "--head-size", str(head), "--contexts", args.contexts, "--batches", args.batches])
    work = bench.make_workload(ns, torch.device("cuda"))
    rows: List[Dict[str, Any]] = []
    for batch in ns.batches:
        for context in ns.contexts:
            q = work.query[:batch].contiguous()
            k = work.key[:batch, :context].transpose(1, 2).contiguous()
            v = work.value[:batch, :context].transpose(1, 2).contiguous()
            qq = q.view(batch, ns.kv_heads, -1, head)

            def flash() -> Any:
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return F.scaled_dot_product_attention(qq, k, v, scale=work.scale)

            us, _ = bench.median_us(flash, False)
            rows.append({"head": head, "kind": "bf16 sdpa-flash", "batch": batch, "context": context, "us": us})
            del k, v
    for name in [n.strip() for n in args.dtypes.split(",")]:
        spec = fmt.tq_spec(name)
        cache = torch.zeros(fmt.cache_shape(work.num_blocks, ns.block_size, ns.kv_heads, head, spec), dtype=torch.uint8, device="cuda")
        bench.store_all(work, lambda k, v, c, s: tq.tq_store(k, v, c, s, spec), cache)
        for batch in ns.batches:
            for context in ns.contexts:
                q = work.query[:batch].contiguous()
                bt = work.block_table[:batch, :-(-context // ns.block_size)].contiguous()
                lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
                ref = torch.cat([fmt.ref_decode(q[b:b + 1], cache, bt[b:b + 1], lens[b:b + 1], work.scale, spec) for b in range(batch)])
                for variant, make in VARIANTS.items():
                    saved = {attr: getattr(tq, attr) for attr in make(tq)}
                    for attr, value in make(tq).items():
                        setattr(tq, attr, value)
                    try:
                        err = bench.rel_err(tq.tq_decode(q, cache, bt, lens, work.scale, spec), ref)
                        us, _ = bench.median_us(lambda: tq.tq_decode(q, cache, bt, lens, work.scale, spec), False)
                    finally:
                        for attr, value in saved.items():
                            setattr(tq, attr, value)
                    rows.append({"head": head, "kind": f"{name} {variant}", "batch": batch, "context": context, "us": us, "vs_reference": err})
                    print(f"head {head} {name} {variant} b{batch} {context}: {us:.1f} us, err {err:.2e}", flush=True)
        del cache
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--heads", default="256,128")
    p.add_argument("--dtypes", default="turboquant_k3v4_nc,turboquant_3bit_nc")
    p.add_argument("--contexts", default="32768,131072")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--ir", action="store_true", help="write the compiled decode kernels' TTGIR to --out")
    args = p.parse_args()
    fmt, tq = bench.load_modules(interpret=False)
    import torch

    started = time.time()
    rows: List[Dict[str, Any]] = []
    for head in (int(h) for h in args.heads.split(",")):
        rows += run_head(head, args, fmt, tq)
    if args.ir:  # every compiled decode kernel's Triton GPU IR, one file
        args.out.mkdir(parents=True, exist_ok=True)
        texts = []
        for cache in tq._decode_split_kernel.device_caches.values():
            for key, kernel in cache[0].items():
                ir = kernel.asm["ttgir"]
                texts.append(f"=== {key}\nconvert_layout: {ir.count('convert_layout')}, local_alloc: {ir.count('local_alloc')}, "
                             f"inline_asm: {ir.count('inline_asm')}\n{ir}")
        (args.out / "decode_ttgir.txt").write_text("\n".join(texts))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "seconds": round(time.time() - started, 1), "variants": list(VARIANTS)}
    (args.out / "tq_variants.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    for r in rows:
        print(f"{r['head']:>4} {r['kind']:<34} b{r['batch']} {r['context']:>6}: {r['us']:8.1f} us" + (f"  err {r['vs_reference']:.2e}" if "vs_reference" in r else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
