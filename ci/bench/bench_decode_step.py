"""One attention layer's decode step as vLLM serves it: stock's bf16 cache against TurboQuant's.

    PYTHONPATH=VLLM_SITE python3 ci/bench/bench_decode_step.py --out DIR [--models 35b-a3b,122b-a10b]

The served benchmark measures a whole model; this one isolates what the TurboQuant mod changes in
it, per full-attention layer and decode step, under CUDA-graph replay (as the server runs decode):
  stock  reshape_and_cache_flash (this step's key and value into the bf16 cache) and vLLM's
         FlashAttention 3 decode, called as vLLM 0.26's FlashAttentionImpl calls it under full CUDA
         graphs (its default NHD cache layout, scheduler metadata with at most 32 splits); and the
         same decode on FlashAttention 2 (its own split choice: what a GB10 runs, FA3 needing 9.x);
  ours   tq_store_decode as the mod's forward calls it (the query and key rows rotated in one
         launch, then quantise and pack, split, merge); its store and decode also timed alone.
Both on the page their served logs name (STOCK_PAGE, TQ_PAGE), and with the L2 cache flushed before
every timed replay (a served step reads each layer's cache once, after the other layers' weights
went through L2); the SM clock is read after each timing. Each is timed alone and as the pair, at
the models' attention shapes (query heads from
benchlib/qwen35_shapes, 2 KV heads, head 256), a block table as wide as --table-tokens (the served
--max-model-len: both pick their split counts from it), and every batch x context; then one
profiled step of each names its kernels and their GPU time. Writes DIR/decode_step.json and .md.
Exit 0 when every case ran, 1 when one failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))  # e2e_parallel: nvidia-smi of this run's GPU
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))  # sparkmods, which e2e_parallel imports

from bench_turboquant import InputError, Parser, int_list, load_modules, markdown_table, median_us
from benchlib.qwen35_shapes import MODELS
from benchlib.report_main import report_main
from e2e_parallel import smi_numbers

KV_HEADS = 2
HEAD = 256
FA_SPLITS = 32  # vLLM's flash_attn_max_num_splits_for_cuda_graph default
# The attention block each served log names (its page matched to the DeltaNet state page), bf16 and
# turboquant_k3v4_nc. vLLM hands a backend that block as its kernel page when the backend takes
# it (v1/worker/utils.py select_common_block_size): both take multiples of 16.
STOCK_PAGE = {"35b-a3b": 1056, "122b-a10b": 2096}
TQ_PAGE = {"35b-a3b": 4672, "122b-a10b": 9280}
DTYPE = "turboquant_k3v4_nc"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = Parser(prog="bench_decode_step.py", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for decode_step.json/.md")
    p.add_argument("--models", default="35b-a3b,122b-a10b", help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--contexts", type=int_list, default=[1024, 32768, 131072])
    p.add_argument("--batches", type=int_list, default=[1, 8, 32])
    p.add_argument("--table-tokens", type=int, default=135168, help="block-table width in tokens (--max-model-len)")
    args = p.parse_args(list(argv))
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown or not args.models:
        raise InputError(f"--models {','.join(unknown) or '(none)'}: not one of {', '.join(MODELS)}")
    if max(args.contexts) > args.table_tokens:
        raise InputError(f"--contexts {max(args.contexts)} exceeds --table-tokens {args.table_tokens}")
    return args


def block_table(batch: int, context: int, table_tokens: int, page: int, generator: Any) -> Any:
    """[batch, pages of table_tokens] int32: each request's first pages of the context are distinct
    pages in random order (pages 1..), the rest of its row names page 0 (never read)."""
    import torch

    used, width = -(-context // page), -(-table_tokens // page)
    table = torch.zeros(batch, width, dtype=torch.int32)
    table[:, :used] = (torch.randperm(batch * used, generator=generator) + 1).view(batch, used).to(torch.int32)
    return table


def kernel_times(events: Sequence[Any], steps: int) -> List[Dict[str, Any]]:
    """GPU microseconds per step of each kernel name in a profiler's key averages (device time
    recorded by CUPTI), largest first; names cut to what identifies them."""
    rows = []
    for e in events:
        total = getattr(e, "device_time_total", None)
        if total is None:
            total = getattr(e, "cuda_time_total", 0)
        if total and getattr(e, "device_type", None) is not None and "cuda" in str(e.device_type).lower():
            rows.append({"kernel": str(e.key)[:60], "us": round(total / steps, 2), "calls": e.count // steps})
    return sorted(rows, key=lambda r: -r["us"])


def render(results: Dict[str, Any]) -> str:
    """The Markdown report: per model, one row per batch x context with each timing and the ratio
    of the pairs (stock / ours: above 1 ours is faster), then each profiled step's kernels."""
    out = [f"# One attention layer's decode step: {results['gpu']}, vLLM {results['vllm']}", "",
           f"Median microseconds per call under CUDA-graph replay, L2 flushed before each; block table {results['table_tokens']} tokens wide; "
           f"ours {DTYPE}; stock bf16 in vLLM's default (NHD) layout, FlashAttention {results['fa_version']}, at most 32 "
           "splits; each on the page its served log names (tokens: "
           + "; ".join(f"{m} stock {STOCK_PAGE[m]}, ours {TQ_PAGE[m]}" for m in STOCK_PAGE)
           + ")"
           + (f"; SM clock after the timings: median {results['sm_mhz']:g} MHz" if results.get("sm_mhz") else "")
           + ". Made by `ci/bench/bench_decode_step.py`.", ""]
    cols = ["batch", "context", "stock step", "ours step", "stock / ours", "fa decode", "ours decode", "stock write", "ours store",
            "fa2 decode"]
    for model in dict.fromkeys(r["model"] for r in results["steps"]):
        rows = []
        for r in (r for r in results["steps"] if r["model"] == model):
            ratio = round(r["stock_step"] / r["ours_step"], 2) if r.get("stock_step") and r.get("ours_step") else None
            rows.append({"batch": r["batch"], "context": r["context"], "stock step": r.get("stock_step"),
                         "ours step": r.get("ours_step"), "stock / ours": ratio, "fa decode": r.get("fa_decode"),
                         "ours decode": r.get("ours_decode"), "stock write": r.get("stock_write"), "ours store": r.get("ours_store"),
                         "fa2 decode": r.get("fa2_decode")})
        out += [f"## {model} ({MODELS[model].shape.num_heads} query heads)", "", markdown_table(rows, cols), ""]
    for prof in results["profiles"]:
        out += [f"### Kernels of one step: {prof['model']}, {prof['side']}, batch {prof['batch']}, context {prof['context']}", "",
                markdown_table(prof["kernels"], ["kernel", "calls", "us"]), ""]
    if results["failures"]:
        out += ["## Failures", ""] + [f"- {f}" for f in results["failures"]] + [""]
    return "\n".join(out)


class Layer:
    """One model's attention layer on the GPU: both caches filled for the largest batch and context."""

    def __init__(self, model: str, args: argparse.Namespace, fmt: Any, tq: Any) -> None:
        import torch
        from vllm import _custom_ops as ops
        from vllm.vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata

        self.torch, self.ops, self.fa, self.schedule = torch, ops, flash_attn_varlen_func, get_scheduler_metadata
        self.fmt, self.tq, self.spec = fmt, tq, fmt.tq_spec(DTYPE)
        self.model, self.args = model, args
        self.hq = MODELS[model].shape.num_heads
        self.page = STOCK_PAGE[model]
        self.gen = torch.Generator().manual_seed(7)
        tokens = max(args.batches) * max(args.contexts)
        stock_pages = max(args.batches) * -(-max(args.contexts) // self.page) + 1
        # vLLM 0.26's FlashAttention cache in memory order (blocks, block tokens, KV heads, K|V), the
        # NHD layout its impl reads after transposing the logical (blocks, heads, tokens, 2 D) view
        self.kv = torch.randn(stock_pages, self.page, KV_HEADS, 2 * HEAD, dtype=torch.bfloat16, device="cuda")
        self.k_cache, self.v_cache = self.kv.split(HEAD, dim=-1)
        self.tq_page = TQ_PAGE[model]
        tq_pages = tokens // self.tq_page + max(args.batches) + 1
        self.cache = torch.zeros(fmt.cache_shape(tq_pages, self.tq_page, KV_HEADS, HEAD, self.spec), dtype=torch.uint8, device="cuda")
        step = 16384
        for start in range(0, tq_pages * self.tq_page, step):  # every slot holds a real quantised token
            n = min(step, tq_pages * self.tq_page - start)
            kv = torch.randn(2, n, KV_HEADS, HEAD, dtype=torch.bfloat16, device="cuda")
            tq.tq_store(kv[0], kv[1], self.cache, torch.arange(start, start + n, device="cuda"), self.spec)
        self.scale = HEAD ** -0.5

    def inputs(self, batch: int, context: int, page: int) -> Dict[str, Any]:
        torch = self.torch
        bt = block_table(batch, context, self.args.table_tokens, page, self.gen).cuda()
        lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
        slot = bt[:, (context - 1) // page].long() * page + (context - 1) % page  # this step's token: the last
        return {"q": torch.randn(batch, self.hq, HEAD, dtype=torch.bfloat16, device="cuda"),
                "k": torch.randn(batch, KV_HEADS, HEAD, dtype=torch.bfloat16, device="cuda"),
                "v": torch.randn(batch, KV_HEADS, HEAD, dtype=torch.bfloat16, device="cuda"),
                "bt": bt, "lens": lens, "slot": slot, "out": torch.empty(batch, self.hq, HEAD, dtype=torch.bfloat16, device="cuda")}

    def stock(self, batch: int, context: int) -> Dict[str, Callable[[], Any]]:
        torch = self.torch
        x = self.inputs(batch, context, self.page)
        cu_q = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
        one = torch.ones((), dtype=torch.float32, device="cuda")
        meta = self.schedule(batch_size=batch, max_seqlen_q=1, max_seqlen_k=context, num_heads_q=self.hq, num_heads_kv=KV_HEADS,
                             headdim=HEAD, cache_seqlens=x["lens"], qkv_dtype=torch.bfloat16, cu_seqlens_q=cu_q,
                             page_size=self.page, causal=True, num_splits=FA_SPLITS)

        def write() -> None:
            self.ops.reshape_and_cache_flash(x["k"], x["v"], self.k_cache, self.v_cache, x["slot"], "auto", one, one)

        def decode(version: int) -> None:  # FA2 picks its own splits; FA3 takes vLLM's metadata and cap
            fa3 = {"scheduler_metadata": meta, "num_splits": FA_SPLITS} if version == 3 else {}
            self.fa(q=x["q"], k=self.k_cache, v=self.v_cache, out=x["out"], cu_seqlens_q=cu_q, max_seqlen_q=1,
                    seqused_k=x["lens"], max_seqlen_k=context, softmax_scale=self.scale, causal=True, block_table=x["bt"],
                    fa_version=version, **fa3)

        def step() -> None:
            write()
            decode(3)

        return {"stock_write": write, "fa_decode": lambda: decode(3), "stock_step": step, "fa2_decode": lambda: decode(2)}

    def ours(self, batch: int, context: int) -> Dict[str, Callable[[], Any]]:
        x = self.inputs(batch, context, self.tq_page)

        def store() -> None:
            self.tq.tq_store(x["k"], x["v"], self.cache, x["slot"], self.spec)

        def decode() -> None:
            self.tq.tq_decode(x["q"], self.cache, x["bt"], x["lens"], self.scale, self.spec, out=x["out"])

        def step() -> None:  # as the impl's forward runs it: queries and keys rotated in one launch
            self.tq.tq_store_decode(x["q"], x["k"], x["v"], self.cache, x["slot"], x["bt"], x["lens"], self.scale,
                                    self.spec, x["out"])

        return {"ours_store": store, "ours_decode": decode, "ours_step": step}


def profile(step: Callable[[], Any], steps: int = 20) -> List[Dict[str, Any]]:
    """Kernels of `steps` calls of step (after one unprofiled call) and their GPU time per step."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    step()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return kernel_times(prof.key_averages(), steps)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    import torch
    import vllm

    fmt, tq = load_modules(interpret=False)
    results: Dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "vllm": vllm.__version__, "fa_version": 3,
                               "table_tokens": args.table_tokens, "steps": [], "profiles": [], "failures": []}
    clocks: List[float] = []  # SM MHz right after each timing
    for model in args.models:
        layer = Layer(model, args, fmt, tq)
        for batch in args.batches:
            for context in args.contexts:
                row: Dict[str, Any] = {"model": model, "batch": batch, "context": context}
                for side, calls in (("stock", layer.stock), ("ours", layer.ours)):
                    try:
                        fns = calls(batch, context)
                        for name, fn in fns.items():
                            us, _ = median_us(fn, False, cold=True)
                            row[name] = None if us is None else round(us, 2)
                            clocks.extend(smi_numbers("clocks.sm") or [])
                        if batch in (min(args.batches), max(args.batches)) and context in (min(args.contexts), max(args.contexts)):
                            results["profiles"].append({"model": model, "side": side, "batch": batch, "context": context,
                                                        "kernels": profile(fns[f"{side}_step"])})
                    except Exception as exc:  # noqa: BLE001 - one failed case is reported, the rest still run
                        results["failures"].append(f"{model} {side} batch {batch} context {context}: {type(exc).__name__}: {str(exc)[:160]}")
                results["steps"].append(row)
                print(f"{model} b{batch} ctx {context}: {row}", flush=True)
        del layer
        torch.cuda.empty_cache()
    results["sm_mhz"] = statistics.median(clocks) if clocks else None
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    return report_main("bench_decode_step.py", "decode_step", argv, parse_args, run, render,
                       lambda results: bool(results["failures"]))


if __name__ == "__main__":
    sys.exit(main())
