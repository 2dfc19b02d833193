"""TurboQuant KV cache on a GPU: our Triton kernels next to bf16/fp8 caches and upstream vLLM 0.21's.

    python3 ci/bench/bench_turboquant.py --out DIR [--upstream-site SITE] [--sweep]
    python3 ci/bench/bench_turboquant.py --out DIR --smoke     # CPU, TRITON_INTERPRET=1, tiny shapes

Four sections, written to DIR/turboquant_bench.json and DIR/turboquant_bench.md:
  correctness  tq_decode against tq_format.ref_decode (the PyTorch reference) at realistic shapes
               (Qwen3.5-122B attention: head 256, 2 KV heads, 32 query heads), and both ours and
               upstream's decode against exact attention on the unquantised keys and values;
  distortion   MSE of unit vectors per bit width: the TurboQuant paper's figure, our codebook's
               (integral and measured) and upstream's codebook on the same rotated vectors;
  kv bytes     KV-cache bytes per token per layer for bf16, fp8 and each TurboQuant dtype (ours
               and upstream's slot size);
  decode time  median GPU time of one decode-attention call under a CUDA graph
               (triton.testing.do_bench_cudagraph; with --cold-l2 one replay at a time, the L2
               cache flushed before each, as a served step finds it) for: bf16 and fp8 caches through torch SDPA
               (fp8 is dequantised to bf16 first: what a cache without a fused kernel costs),
               vLLM's paged Triton attention for bf16 and fp8 when --upstream-site has vLLM,
               ours per dtype, and upstream 0.21's TurboQuant decode per dtype.
--upstream-site is a site-packages folder (or source tree) holding vLLM 0.21.x; it is put first on
sys.path. --sweep also times the decode in a few tile/warp/split/register configurations per
dtype and shape (sweep_configs), checks each against the reference, prints the best per shape
against the fastest bf16 yardstick and the DEFAULT_DECODE lines for tq_triton.py;
`--apply-defaults DIR/turboquant_bench.json` (CPU, no --out) writes the table default_table makes
from that run's sweep rows into mods/turboquant/files/tq_triton.py (then run
`python3 mods/turboquant/make_patches.py` and `sparkmods sync`). Each request's block table is cut
to its context (a server with max_model_len = context), so split counts follow the context.
Exit 0 when every correctness check passes, 1 when one fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "ci" / "bench"))  # benchlib, also when a test loads this file by path

from benchlib.int8_lm_head_kernel import fix_interpreter_scalars  # noqa: E402

MOD_FILES = REPO / "mods" / "turboquant" / "files"
UPSTREAM_MARKER = Path("vllm/v1/attention/ops/triton_turboquant_decode.py")
REL_TOLERANCE = 2e-2  # ours vs the PyTorch reference: relative L2 of the attention output
# Lloyd-Max MSE of a unit-variance Gaussian (Max, 1960), the large-D limit of the unit-vector MSE
GAUSSIAN_LLOYD_MAX = {1: 0.3634, 2: 0.1175, 3: 0.03454, 4: 0.009497}


class InputError(Exception):
    """A bad argument: main prints it as one line and exits 2."""


# ---------------------------------------------------------------------------------------------
# Loading our modules (optionally under the CPU interpreter) and upstream's
# ---------------------------------------------------------------------------------------------


def load_modules(interpret: bool) -> Tuple[ModuleType, ModuleType]:
    """(tq_format, tq_triton) from the mod folder.

    interpret=True runs the kernels on Triton's CPU interpreter. Triton reads TRITON_INTERPRET
    when a kernel is defined, including its own library kernels (tl.sum, tl.cdiv, ...) when
    triton is first imported, and once more when it lazily imports its gluon package at the
    first launch; so the variable is set around the first import of all of them and removed
    afterwards, and subprocesses started later do not inherit it. RuntimeError if triton was
    already imported for real kernels in this process.
    """
    if interpret and "triton" in sys.modules and not _interpreted(sys.modules["triton"]):
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set; load the TurboQuant modules first")
    with mod_import_window(interpret):
        import tq_format
        import tq_triton
        import triton.experimental.gluon  # noqa: F401  (imported lazily at the first launch otherwise)

        load_bf16_yardstick()  # defines Triton kernels too: inside the same TRITON_INTERPRET window
    if interpret:
        if not _interpreted(sys.modules["triton"]):
            raise RuntimeError("tq_triton was imported for real kernels earlier in this process; the CPU interpreter cannot run them")
        fix_interpreter_scalars()
    return tq_format, tq_triton


@contextlib.contextmanager
def mod_import_window(interpret: bool) -> Iterator[None]:
    """The mod folder first on sys.path (its modules import their siblings by name), and
    TRITON_INTERPRET=1 when interpret, for the imports inside; both as they were afterwards."""
    previous = os.environ.get("TRITON_INTERPRET")
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(MOD_FILES))
    try:
        yield
    finally:
        sys.path.remove(str(MOD_FILES))
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous


def load_bf16_yardstick() -> ModuleType:
    """ci/bench/benchlib/tq_bf16_decode.py (load_modules imports it, with the interpreter setting it needs)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tq_bf16_decode", Path(__file__).parent / "benchlib" / "tq_bf16_decode.py")
    assert spec is not None and spec.loader is not None
    if "tq_bf16_decode" not in sys.modules:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["tq_bf16_decode"] = module
    return sys.modules["tq_bf16_decode"]


def _interpreted(triton: ModuleType) -> bool:
    """Whether triton's own library kernels (and so ours) were defined for the CPU interpreter."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(triton.language.standard.sum, InterpretedFunction)


@dataclass
class Upstream:
    """vLLM 0.21's TurboQuant ops and paged Triton attention, imported from --upstream-site."""

    version: str
    store: Callable[..., Any]
    decode: Callable[..., Any]
    config: Any  # TurboQuantConfig class
    centroids: Callable[[int, int], Any]
    unified_attention: Optional[Callable[..., Any]] = None
    quant_mode: Any = None
    notes: List[str] = field(default_factory=list)


def load_upstream(site: Path) -> Upstream:
    """Import upstream's ops from site (first on sys.path); InputError if it is not vLLM >= 0.20."""
    sys.path.insert(0, str(site))
    import vllm
    from vllm.model_executor.layers.quantization.turboquant.centroids import get_centroids
    from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig
    from vllm.v1.attention.ops.triton_turboquant_decode import triton_turboquant_decode_attention
    from vllm.v1.attention.ops.triton_turboquant_store import triton_turboquant_store

    if not str(Path(vllm.__file__).resolve()).startswith(str(site.resolve())):
        raise InputError(f"--upstream-site {site}: imported vLLM from {vllm.__file__} instead; is another vLLM shadowing it?")
    up = Upstream(getattr(vllm, "__version__", "?"), triton_turboquant_store, triton_turboquant_decode_attention, TurboQuantConfig, get_centroids)
    try:
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention
        from vllm.v1.kv_cache_interface import KVQuantMode

        up.unified_attention, up.quant_mode = unified_attention, KVQuantMode
    except ImportError as exc:  # the yardstick is optional; the TurboQuant peer is not
        up.notes.append(f"vLLM paged Triton attention unavailable: {exc}")
    return up


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------


def int_list(text: str) -> List[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


class Parser(argparse.ArgumentParser):
    """argparse whose errors are InputError (one line, exit 2), not its own exit."""

    def error(self, message: str) -> None:
        raise InputError(message)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse and check the command line; InputError (exit 2) names what is wrong and what to do."""
    p = Parser(prog="bench_turboquant.py", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="folder for turboquant_bench.json/.md (required unless --apply-defaults)")
    p.add_argument("--apply-defaults", type=Path, metavar="JSON", help="write the sweep's DEFAULT_DECODE lines from this results file into tq_triton.py")
    p.add_argument("--upstream-site", type=Path, help="site-packages (or tree) with vLLM 0.21.x")
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes, no timings")
    p.add_argument("--sweep", action="store_true", help="also time tile configurations of our decode")
    p.add_argument("--cold-l2", action="store_true", help="flush the L2 cache before every timed decode (a served "
                   "step's condition); default: calls back to back")
    p.add_argument("--contexts", type=int_list, help="context lengths (default 4096,32768,131072)")
    p.add_argument("--batches", type=int_list, help="batch sizes (default 1,8)")
    p.add_argument("--dtypes", help="comma-separated TurboQuant dtypes (default: all four)")
    p.add_argument("--head-size", type=int, help="default 256 (Qwen3.5), 128 with --smoke")
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--q-heads", type=int, help="default 32 (Qwen3.5-122B), 4 with --smoke")
    p.add_argument("--block-size", type=int, default=16, help="KV block size in tokens (multiple of 16)")
    args = p.parse_args(list(argv))
    if args.out is None and args.apply_defaults is None:
        raise InputError("--out DIR is required (or --apply-defaults JSON)")
    if args.upstream_site is not None and not (args.upstream_site / UPSTREAM_MARKER).is_file():
        raise InputError(f"--upstream-site {args.upstream_site}: no {UPSTREAM_MARKER} there; point it at the site-packages of a vLLM >= 0.20 install")
    if args.smoke and args.upstream_site is not None:
        raise InputError("--smoke runs on the CPU interpreter and cannot time upstream's kernels; drop --upstream-site")
    smoke_defaults = {"head_size": 128, "q_heads": 4, "contexts": [1, 40, 100], "batches": [1, 2]}
    gpu_defaults = {"head_size": 256, "q_heads": 32, "contexts": [4096, 32768, 131072], "batches": [1, 8]}
    for name, default in (smoke_defaults if args.smoke else gpu_defaults).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.block_size % 16:
        raise InputError(f"--block-size {args.block_size}: must be a multiple of 16")
    if args.q_heads % args.kv_heads:
        raise InputError(f"--q-heads {args.q_heads} is not a multiple of --kv-heads {args.kv_heads}")
    return args


# ---------------------------------------------------------------------------------------------
# Workload: one set of keys/values/queries, caches built once at the largest shape
# ---------------------------------------------------------------------------------------------


@dataclass
class Workload:
    key: Any  # [B, L, Hkv, D] bf16 (per-channel scales mimic real keys' outlier channels)
    value: Any  # [B, L, Hkv, D] bf16
    query: Any  # [B, Hq, D] bf16
    block_table: Any  # [B, pages per request] int32, pages in random order
    num_blocks: int
    block_size: int
    scale: float

    @property
    def slot_mapping(self) -> Any:
        import torch

        b, length = self.key.shape[:2]
        pos = torch.arange(length, device=self.key.device)
        pages = self.block_table.long()[:, pos // self.block_size]
        return (pages * self.block_size + pos % self.block_size).reshape(b * length)


def make_workload(args: argparse.Namespace, device: Any) -> Workload:
    import torch

    gen = torch.Generator(device="cpu").manual_seed(1234)
    b, length, hkv, d = max(args.batches), max(args.contexts), args.kv_heads, args.head_size
    channel = torch.exp(0.5 * torch.randn(hkv, d, generator=gen))  # a few channels much larger
    key = torch.empty(b, length, hkv, d, dtype=torch.bfloat16, device=device)
    value = torch.empty_like(key)
    step = 8192
    for start in range(0, length, step):  # chunks keep the float32 temporaries small
        n = min(step, length - start)
        key[:, start:start + n] = (torch.randn(b, n, hkv, d, generator=gen) * channel).to(device=device, dtype=torch.bfloat16)
        value[:, start:start + n] = torch.randn(b, n, hkv, d, generator=gen).to(device=device, dtype=torch.bfloat16)
    query = torch.randn(b, args.q_heads, d, generator=gen).to(device=device, dtype=torch.bfloat16)
    pages = -(-length // args.block_size)
    perm = torch.randperm(b * pages, generator=gen)
    return Workload(key, value, query, perm.view(b, pages).to(device=device, dtype=torch.int32), b * pages, args.block_size, d ** -0.5)


def store_all(work: Workload, store: Callable[[Any, Any, Any, Any], None], cache: Any) -> None:
    """Write every token of the workload into cache, 16k tokens per call."""
    k = work.key.reshape(-1, *work.key.shape[2:])
    v = work.value.reshape(-1, *work.value.shape[2:])
    slots = work.slot_mapping
    step = 16384
    for start in range(0, k.shape[0], step):
        store(k[start:start + step], v[start:start + step], cache, slots[start:start + step])


def exact_attention(work: Workload, batch: int, context: int) -> Any:
    """float32 attention of the first `batch` queries over the unquantised first `context` tokens."""
    import torch

    outs = []
    hkv = work.key.shape[2]
    for b in range(batch):
        q = work.query[b].float().reshape(hkv, -1, work.query.shape[-1])
        k = work.key[b, :context].float().transpose(0, 1)
        v = work.value[b, :context].float().transpose(0, 1)
        p = torch.softmax(torch.einsum("hgd,hld->hgl", q, k) * work.scale, dim=-1)
        outs.append(torch.einsum("hgl,hld->hgd", p, v).reshape(-1, q.shape[-1]))
    return torch.stack(outs)


def rel_err(a: Any, b: Any) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


# ---------------------------------------------------------------------------------------------
# Upstream adapters (their signatures read from the 0.21.0 wheel)
# ---------------------------------------------------------------------------------------------


def _hadamard(d: int, device: Any) -> Any:
    import torch

    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(d)).to(device)


@dataclass
class UpstreamTQ:
    """Upstream's store/decode bound to one dtype, with the buffers its backend would pre-allocate."""

    up: Upstream
    name: str
    head_size: int
    device: Any

    def __post_init__(self) -> None:
        self.cfg = self.up.config.from_cache_dtype(self.name, self.head_size)
        self.hadamard = _hadamard(self.head_size, self.device)
        self.centroids = self.up.centroids(self.head_size, self.cfg.centroid_bits).to(self.device)
        c = self.centroids.sort().values
        self.midpoints = (c[1:] + c[:-1]) / 2

    def cache(self, num_blocks: int, block_size: int, num_kv_heads: int) -> Any:
        import torch

        return torch.zeros(num_blocks, block_size, num_kv_heads, self.cfg.slot_size_aligned, dtype=torch.uint8, device=self.device)

    def store(self, key: Any, value: Any, cache: Any, slots: Any) -> None:
        self.up.store(key, value, cache, slots, self.hadamard, self.midpoints, mse_bits=self.cfg.key_mse_bits,
                      key_packed_size=self.cfg.key_packed_size, value_quant_bits=self.cfg.effective_value_quant_bits, key_fp8=self.cfg.key_fp8)

    def decoder(self, query: Any, cache: Any, block_table: Any, seq_lens: Any, scale: float, splits: int = 32) -> Callable[[], Any]:
        import torch

        b, hq, d = query.shape
        mid = torch.empty(b, hq, splits, d + 1, dtype=torch.float32, device=self.device)
        out = torch.empty(b, hq, d, dtype=query.dtype, device=self.device)
        lse = torch.empty(b, hq, dtype=torch.float32, device=self.device)
        return lambda: self.up.decode(query=query, kv_cache=cache, block_table=block_table, seq_lens=seq_lens, Pi=self.hadamard,
                                      centroids=self.centroids, scale=scale, mse_bits=self.cfg.key_mse_bits,
                                      key_packed_size=self.cfg.key_packed_size, value_quant_bits=self.cfg.effective_value_quant_bits,
                                      key_fp8=self.cfg.key_fp8, norm_correction=self.cfg.norm_correction, PiT=self.hadamard,
                                      mid_o_buf=mid, output_buf=out, lse_buf=lse, max_num_kv_splits=splits)


def paged_triton_decoder(up: Upstream, work: Workload, batch: int, context: int, fp8: bool) -> Callable[[], Any]:
    """vLLM's own paged Triton attention (TRITON_ATTN backend) over a bf16 or fp8 paged cache,
    with the 3-D split-softmax buffers its backend allocates for small decode batches."""
    import torch

    assert up.unified_attention is not None
    hkv, d = work.key.shape[2], work.key.shape[3]
    hq = work.query.shape[1]
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    kc = torch.zeros(work.num_blocks, work.block_size, hkv, d, dtype=dtype, device=work.key.device)
    vc = torch.zeros_like(kc)
    slots = work.slot_mapping.view(work.key.shape[0], -1)[:batch, :context].reshape(-1)
    kc.view(-1, hkv, d)[slots] = work.key[:batch, :context].reshape(-1, hkv, d).to(dtype)
    vc.view(-1, hkv, d)[slots] = work.value[:batch, :context].reshape(-1, hkv, d).to(dtype)
    q = work.query[:batch].contiguous()
    out = torch.empty_like(q)
    dev = q.device
    cu_q = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    segments = 16
    seg_o = torch.empty(batch, hq, segments, triton_next_pow2(d), dtype=torch.float32, device=dev)
    seg_m = torch.empty(batch, hq, segments, dtype=torch.float32, device=dev)
    seg_s = torch.empty_like(seg_m)
    one = torch.ones(batch, hkv, dtype=torch.float32, device=dev)
    mode = up.quant_mode.FP8_PER_TENSOR if fp8 else up.quant_mode.NONE
    bt = work.block_table[:batch]
    return lambda: up.unified_attention(q=q, k=kc, v=vc, out=out, cu_seqlens_q=cu_q, max_seqlen_q=1, seqused_k=lens, max_seqlen_k=context,
                                        softmax_scale=work.scale, causal=True, window_size=(-1, -1), block_table=bt, softcap=0,
                                        q_descale=None, k_descale=one, v_descale=one, seq_threshold_3D=max(batch, 64),
                                        num_par_softmax_segments=segments, softmax_segm_output=seg_o, softmax_segm_max=seg_m,
                                        softmax_segm_expsum=seg_s, kv_quant_mode=mode)


def triton_next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


def distortion(fmt: ModuleType, up: Optional[Upstream], head_sizes: Sequence[int], count: int) -> List[Dict[str, Any]]:
    """Unit-vector MSE per bit width: paper, Gaussian Lloyd-Max, ours (integral, measured, +nc), upstream."""
    import torch

    rows = []
    for d in head_sizes:
        for bits in (1, 2, 3, 4):
            row = {"head_size": d, "bits": bits, "paper": fmt.PAPER_MSE[bits], "gaussian_lloyd_max": GAUSSIAN_LLOYD_MAX[bits],
                   "ours_integral": fmt.codebook_mse(d, bits), "ours_measured": fmt.unit_vector_mse(d, bits, count),
                   "ours_measured_nc": fmt.unit_vector_mse(d, bits, count, norm_correction=True)}
            if up is not None:
                gen = torch.Generator().manual_seed(0)
                x = torch.randn(count, d, generator=gen)
                x = x / x.norm(dim=-1, keepdim=True)
                h = _hadamard(d, "cpu")
                y = x @ h
                c = up.centroids(d, bits).float().sort().values
                idx = torch.bucketize(y, (c[1:] + c[:-1]) / 2)
                row["upstream_measured"] = float(((c[idx] @ h - x) ** 2).sum(-1).mean())
            rows.append(row)
    return rows


def kv_bytes(fmt: ModuleType, up: Optional[Upstream], names: Sequence[str], head_size: int, kv_heads: int) -> List[Dict[str, Any]]:
    rows = [{"kind": kind, "ours": fmt.kv_bytes_per_token(kind, head_size, kv_heads)} for kind in ("bf16", "fp8")]
    for name in names:
        row: Dict[str, Any] = {"kind": name, "ours": fmt.kv_bytes_per_token(name, head_size, kv_heads)}
        if up is not None:
            row["upstream"] = up.config.from_cache_dtype(name, head_size).slot_size_aligned * kv_heads
        rows.append(row)
    bf16 = rows[0]["ours"]
    for row in rows:
        row["vs_bf16"] = round(bf16 / row["ours"], 2)
    return rows


def median_us(fn: Callable[[], Any], smoke: bool, rep: int = 100, cold: bool = False) -> Tuple[Optional[float], str]:
    """Median GPU time of fn in microseconds under a CUDA graph (plain do_bench if capture fails);
    rep is the milliseconds spent timing (the sweep uses less). cold: the L2 cache is flushed
    before every call (cold_median_us); otherwise calls run back to back, and what fits in L2
    stays there between them."""
    if smoke:
        return None, "skipped (smoke)"
    from triton.testing import do_bench, do_bench_cudagraph

    fn()
    try:
        if cold:
            return cold_median_us(fn, rep), "cudagraph, cold L2"
        return 1e3 * do_bench_cudagraph(fn, rep=rep, return_mode="median"), "cudagraph"
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot be captured is still timed, and said so
        return 1e3 * do_bench(fn, warmup=25, rep=rep, return_mode="median"), f"eager ({type(exc).__name__})"


def cold_median_us(fn: Callable[[], Any], rep: int) -> float:
    """Median microseconds of single replays of fn's CUDA graph, each after a write through a
    buffer four times the L2 cache. A served decode step reads each layer's cache once, after the
    other layers' weights went through L2; replaying one call back to back instead keeps whatever
    part of the cache fits L2 on chip."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    flush = torch.empty(4 * max(getattr(props, "L2_cache_size", 0), 32 << 20), dtype=torch.int8, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            fn()
        times = []
        for _ in range(max(10, min(200, rep // 2))):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    times.sort()
    return 1e3 * times[len(times) // 2]


@dataclass
class Bench:
    args: argparse.Namespace
    fmt: ModuleType
    tq: ModuleType
    up: Optional[Upstream]
    work: Workload
    names: List[str]
    results: Dict[str, Any] = field(default_factory=dict)
    failures: List[str] = field(default_factory=list)

    def run(self) -> None:
        self.results["kv_bytes"] = kv_bytes(self.fmt, self.up, self.names, self.args.head_size, self.args.kv_heads)
        self.results["distortion"] = distortion(self.fmt, self.up, (128, 256) if not self.args.smoke else (self.args.head_size,), 2000 if self.args.smoke else 20000)
        correctness: List[Dict[str, Any]] = []
        timings: List[Dict[str, Any]] = []
        self.results["correctness"], self.results["timings"] = correctness, timings
        self.yardsticks(timings)
        for name in self.names:
            spec = self.fmt.tq_spec(name)
            ours = self.stored_cache(spec)
            peer = theirs = None
            if self.up is not None:
                peer = UpstreamTQ(self.up, name, self.args.head_size, self.work.key.device)
                theirs = peer.cache(self.work.num_blocks, self.args.block_size, self.args.kv_heads)
                store_all(self.work, peer.store, theirs)
            for batch in self.args.batches:
                for context in self.args.contexts:
                    ref = self._case(name, spec, ours, peer, theirs, batch, context, correctness, timings)
                    if self.args.sweep:
                        self._sweep(name, spec, ours, batch, context, ref)
            del ours, theirs

    def _case(self, name: str, spec: Any, ours: Any, peer: Optional[UpstreamTQ], theirs: Any, batch: int, context: int,
              correctness: List[Dict[str, Any]], timings: List[Dict[str, Any]]) -> Any:
        """Check and time ours (default config) and upstream's at one shape; returns the reference
        output (the PyTorch one, tq_format.ref_decode)."""
        work = self.work
        q, bt, lens = self.inputs(batch, context)
        out = self.tq.tq_decode(q, ours, bt, lens, work.scale, spec)
        ref = self.reference(q, ours, bt, lens, spec)
        exact = exact_attention(work, batch, context)
        row = {"dtype": name, "batch": batch, "context": context, "ours_vs_reference": rel_err(out, ref), "ours_vs_exact": rel_err(out, exact),
               "reference_vs_exact": rel_err(ref, exact)}
        if row["ours_vs_reference"] > REL_TOLERANCE:
            self.failures.append(f"{name} batch {batch} context {context}: ours vs reference {row['ours_vs_reference']:.3g} > {REL_TOLERANCE}")
        t_ours, how = median_us(lambda: self.tq.tq_decode(q, ours, bt, lens, work.scale, spec), self.args.smoke, cold=self.args.cold_l2)
        timings.append({"kind": f"ours {name}", "batch": batch, "context": context, "us": t_ours, "method": how})
        if peer is not None:
            decode = peer.decoder(q, theirs, bt, lens, work.scale)
            row["upstream_vs_exact"] = rel_err(decode(), exact)
            t_up, how = median_us(decode, False, cold=self.args.cold_l2)
            timings.append({"kind": f"upstream {name}", "batch": batch, "context": context, "us": t_up, "method": how})
        correctness.append(row)
        return ref

    def stored_cache(self, spec: Any) -> Any:
        """A packed cache of this dtype holding every token of the workload (our tq_store)."""
        import torch

        cache = torch.zeros(self.fmt.cache_shape(self.work.num_blocks, self.args.block_size, self.args.kv_heads, self.args.head_size, spec),
                            dtype=torch.uint8, device=self.work.key.device)
        store_all(self.work, lambda k, v, c, s: self.tq.tq_store(k, v, c, s, spec), cache)
        return cache

    def reference(self, q: Any, cache: Any, bt: Any, lens: Any, spec: Any) -> Any:
        """tq_format.ref_decode (the PyTorch reference) of every request, one at a time."""
        import torch

        return torch.cat([self.fmt.ref_decode(q[b:b + 1], cache, bt[b:b + 1], lens[b:b + 1], self.work.scale, spec) for b in range(q.shape[0])])

    def inputs(self, batch: int, context: int) -> Tuple[Any, Any, Any]:
        """Queries, block table and lengths of `batch` requests. The table keeps its full width (the
        largest context's pages), as vLLM passes one as wide as --max-model-len whatever the
        context: the decode picks its config and split count from that width, so a table cut to
        the context would time a config serving never runs."""
        import torch

        q = self.work.query[:batch].contiguous()
        bt = self.work.block_table[:batch].contiguous()
        return q, bt, torch.full((batch,), context, dtype=torch.int32, device=q.device)

    @property
    def table_tokens(self) -> int:
        """Tokens the block table can hold: what the decode reads as the longest context."""
        return self.work.block_table.shape[1] * self.work.block_size

    def yardsticks(self, timings: List[Dict[str, Any]]) -> None:
        """bf16 and fp8 caches over a contiguous cache: torch SDPA forced onto its flash kernel (one
        read of K and V per KV head: the query heads of a group ride along as query rows; the
        automatic choice ran a slow non-flash path on one H100), a split-KV Triton kernel of our
        program shape (tq_bf16_decode, checked against exact attention), and vLLM's paged kernel."""
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def flash(q: Any, k: Any, v: Any) -> Any:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, scale=work.scale)

        work = self.work
        hkv, d = work.key.shape[2], work.key.shape[3]
        for batch in self.args.batches:
            for context in self.args.contexts:
                q4 = work.query[:batch].reshape(batch, hkv, -1, d)
                k4 = work.key[:batch, :context].transpose(1, 2).contiguous()
                v4 = work.value[:batch, :context].transpose(1, 2).contiguous()
                split_kv = load_bf16_yardstick().bf16_decoder(self.tq, q4, k4, v4, work.scale, self.args.smoke)
                err = rel_err(split_kv(), exact_attention(work, batch, context))
                if err > REL_TOLERANCE:
                    self.failures.append(f"bf16 triton split-kv batch {batch} context {context}: vs exact {err:.3g} > {REL_TOLERANCE}")
                cases: List[Tuple[str, Callable[[], Any]]] = [("bf16 sdpa-flash", lambda: flash(q4, k4, v4)), ("bf16 triton split-kv", split_kv)]  # noqa: F821 - timed before the del below
                if not self.args.smoke:
                    k8, v8 = k4.to(torch.float8_e4m3fn), v4.to(torch.float8_e4m3fn)
                    cases.append(("fp8 dequant+sdpa-flash", lambda: flash(q4, k8.to(torch.bfloat16), v8.to(torch.bfloat16))))  # noqa: F821 - timed before the del below
                if self.up is not None and self.up.unified_attention is not None:
                    for fp8 in (False, True):
                        try:
                            cases.append((f"{'fp8' if fp8 else 'bf16'} paged vllm-triton", paged_triton_decoder(self.up, work, batch, context, fp8)))
                        except Exception as exc:  # noqa: BLE001 - report, do not stop the peer comparison
                            self.up.notes.append(f"paged {'fp8' if fp8 else 'bf16'} yardstick failed: {type(exc).__name__}: {exc}")
                for kind, fn in cases:
                    try:
                        us, how = median_us(fn, self.args.smoke, cold=self.args.cold_l2)
                    except Exception as exc:  # noqa: BLE001 - a yardstick that fails is reported, not fatal
                        us, how = None, f"failed: {type(exc).__name__}: {exc}"
                    timings.append({"kind": kind, "batch": batch, "context": context, "us": us, "method": how})
                del cases, q4, k4, v4, split_kv
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()

    def bandwidth(self) -> None:
        """GB/s of every timing (cache bytes read / time) and of a 1 GiB device copy (read + write);
        a bf16 yardstick below half the copy rate where the read would take >= 10 us at that rate
        is flagged in the notes: it is not a sound yardstick."""
        import torch

        copy_gbps = None
        if not self.args.smoke:
            src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda")
            dst = torch.empty_like(src)
            us, _ = median_us(lambda: dst.copy_(src), False)
            copy_gbps = 2 * src.numel() * 2 / us / 1e3 if us else None
            del src, dst
        self.results["copy_gbps"] = copy_gbps
        notes = self.results.setdefault("bandwidth_flags", [])
        for t in self.results["timings"]:
            kind = t["kind"].split()[0] if t["kind"].split()[0] in ("bf16", "fp8") else t["kind"].split()[-1]
            cache = t["batch"] * t["context"] * self.fmt.kv_bytes_per_token(kind, self.args.head_size, self.args.kv_heads)
            t["gbps"] = round(cache / t["us"] / 1e3, 1) if t["us"] else None
            if copy_gbps and t["kind"].startswith("bf16") and t["gbps"] and cache / copy_gbps / 1e3 >= 10 and t["gbps"] < 0.5 * copy_gbps:
                notes.append(f"{t['kind']} b{t['batch']} ctx {t['context']}: {t['gbps']} GB/s, under half the copy rate "
                             f"({copy_gbps:.0f} GB/s): not a sound yardstick")

    def _sweep(self, name: str, spec: Any, cache: Any, batch: int, context: int, ref: Any) -> None:
        """Time every candidate decode config at one shape; a config whose output differs from the
        reference by more than REL_TOLERANCE is a failure and gets no time (so it never becomes a
        default)."""
        q, bt, lens = self.inputs(batch, context)
        rows = self.results.setdefault("sweep", [])
        for cfg in sweep_configs(self.tq, self.args.head_size):
            row: Dict[str, Any] = {"dtype": name, "batch": batch, "context": context, "table_tokens": self.table_tokens,
                                   "config": cfg.label()}
            try:
                err = rel_err(self.tq.tq_decode(q, cache, bt, lens, self.work.scale, spec, config=cfg), ref)
                us, how = median_us(lambda: self.tq.tq_decode(q, cache, bt, lens, self.work.scale, spec, config=cfg), self.args.smoke, rep=20, cold=self.args.cold_l2)
            except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory: record and go on
                err, us, how = None, None, f"failed: {type(exc).__name__}: {str(exc)[:120]}"
            if err is not None and err > REL_TOLERANCE:
                self.failures.append(f"sweep {name} b{batch} ctx {context} {cfg.label()}: ours vs reference {err:.3g} > {REL_TOLERANCE}")
                us = None
            rows.append({**row, "vs_reference": err, "us": us, "method": how})


def sweep_configs(tq: ModuleType, head_size: int) -> List[Any]:
    """The decode configs the sweep times: the shipped defaults for this head size and a few tile,
    warp, split and register shapes around them, each with 3-bit values in 4 and in 8 fields
    (the same kernel for 4-bit values, timed again, so that one table entry serves every dtype).
    About twenty-five per shape keep a sweep of one head size within three minutes on an H100 once
    they are compiled."""
    cfg = tq.DecodeConfig
    found = [c for (head, _, _, _), c in tq.DEFAULT_DECODE.items() if head == head_size]
    if head_size >= 256:
        found += [cfg(32, 4, 2, 128, 4), cfg(64, 4, 2, 128, 4), cfg(64, 8, 2, 128, 4), cfg(32, 4, 3, 128, 4), cfg(32, 4, 2, 128, 2),
                  cfg(64, 4, 2, 128, 2), cfg(64, 8, 2, 256, 4), cfg(32, 4, 2, 128, 4, 128), cfg(128, 4, 2, 128, 2), cfg(64, 2, 3, 128, 4)]
    else:
        found += [cfg(64, 2, 2, 128, 4), cfg(128, 4, 2, 128, 2), cfg(64, 4, 2, 128, 4), cfg(32, 2, 2, 128, 4), cfg(64, 2, 3, 128, 4),
                  cfg(128, 2, 2, 128, 2), cfg(128, 4, 2, 256, 4), cfg(64, 2, 2, 128, 8), cfg(32, 4, 2, 128, 4)]
    found += [dataclasses.replace(c, value_fields=12 - c.value_fields) for c in found]
    return list(dict.fromkeys(found))


def table_tokens(row: Dict[str, Any]) -> int:
    """The block table's capacity a sweep row was timed with (older results: its context, as
    their tables were cut to it)."""
    return int(row.get("table_tokens", row["context"]))


def sweep_summary(tq: ModuleType, head_size: int, rows: Sequence[Dict[str, Any]], timings: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per (dtype, batch, context): the fastest config, the shipped default's time (what the
    decode-attention table measured) and the fastest bf16 yardstick's."""
    bf16 = {(t["batch"], t["context"]): fastest_bf16(timings, t["batch"], t["context"])[1] for t in timings}
    shapes: Dict[Tuple[str, int, int], List[Dict[str, Any]]] = {}
    for r in rows:
        shapes.setdefault((r["dtype"], r["batch"], r["context"]), []).append(r)
    out = []
    for (name, batch, context), group in shapes.items():
        timed = [r for r in group if r["us"] is not None]
        if not timed:
            continue
        best = min(timed, key=lambda r: r["us"])
        ref = bf16.get((batch, context))
        default = tq.default_decode_config(head_size, batch, table_tokens(group[0]), name).label()
        shipped = next((r["us"] for r in group if r["config"] == default), None)
        out.append({"dtype": name, "batch": batch, "context": context, "best": best["config"], "best_us": best["us"],
                    "default_us": shipped, "bf16_us": ref, "vs_bf16": None if ref is None else round(best["us"] / ref, 3)})
    return out


# a dtype gets its own DEFAULT_DECODE entry in a band when its own best config there is at least
# this much faster (geometric mean over its shapes) than the band's shared choice
OWN_ENTRY_GAIN = 1.03


def default_table(tq: ModuleType, head_size: int, rows: Sequence[Dict[str, Any]]) -> Dict[Tuple[int, str, str, str], str]:
    """Per (batch band, context band): the config with the smallest geometric-mean slowdown against
    the best config of each shape in the band, over every dtype (dtype "*"; only configs timed at
    every shape of the band qualify); and the same over one dtype's shapes where that choice beats
    the shared one by OWN_ENTRY_GAIN or more. Values are the labels of DecodeConfig."""
    best: Dict[Tuple[str, int, int], float] = {}
    for r in rows:
        if r["us"] is not None:
            key = (r["dtype"], r["batch"], r["context"])
            best[key] = min(best.get(key, math.inf), r["us"])
    # (band, dtype or "*") -> config -> log slowdowns; and the shapes each group must cover
    slowdowns: Dict[Tuple[Tuple[str, str], str], Dict[str, List[float]]] = {}
    shapes_in: Dict[Tuple[Tuple[str, str], str], set] = {}
    for r in rows:
        band = tq.shape_band(r["batch"], table_tokens(r))
        for group in ((band, "*"), (band, r["dtype"])):
            shapes_in.setdefault(group, set()).add((r["dtype"], r["batch"], r["context"]))
            if r["us"] is not None:
                slowdowns.setdefault(group, {}).setdefault(r["config"], []).append(math.log(r["us"] / best[(r["dtype"], r["batch"], r["context"])]))
    means = {group: {c: sum(v) / len(v) for c, v in by_config.items() if len(v) == len(shapes_in[group])} for group, by_config in slowdowns.items()}
    table = {}
    for (band, dtype), full in sorted(means.items()):
        if full and dtype == "*":
            table[(head_size, *band, "*")] = min(full, key=full.__getitem__)
    for (band, dtype), full in sorted(means.items()):
        shared = table.get((head_size, *band, "*"))
        if full and dtype != "*" and shared in full:
            own = min(full, key=full.__getitem__)
            if full[shared] - full[own] >= math.log(OWN_ENTRY_GAIN):
                table[(head_size, *band, dtype)] = own
    return table


def config_from_label(tq: ModuleType, label: str) -> Any:
    """DecodeConfig from its label (nN/wW/sS/cC/pP/rR/fF)."""
    n, w, st, c, pp, r, f = (int(x[1:]) for x in label.split("/"))
    return tq.DecodeConfig(n, w, st, c, pp, r, f)


def table_lines(tq: ModuleType, table: Dict[Tuple[int, str, str, str], str]) -> List[str]:
    """The DEFAULT_DECODE entries as Python source lines, and a '*' entry per head size for shapes
    the sweep did not cover: the many-requests long-context shared choice (where the time goes),
    else the first band's."""
    lines = []
    for head in sorted({k[0] for k in table}):
        entries = {k: v for k, v in table.items() if k[0] == head}
        shared = {k: v for k, v in entries.items() if k[3] == "*"}
        fallback = shared.get((head, "many", "long", "*")) or shared[min(shared)]
        for (h, batch_band, context_band, dtype), label in sorted(entries.items()) + [((head, "*", "*", "*"), fallback)]:
            c = config_from_label(tq, label)
            lines.append(f'    ({h}, "{batch_band}", "{context_band}", "{dtype}"): DecodeConfig({c.block_n}, {c.num_warps}, {c.num_stages}, '
                         f'{c.min_chunk}, {c.programs_per_sm}, {c.max_regs}, {c.value_fields}),')
    return lines


TABLE_START = "DEFAULT_DECODE: Dict[Tuple[int, str, str, str], DecodeConfig] = {\n"


def apply_defaults(results_path: Path, module_path: Path, tq: ModuleType) -> str:
    """Replace this head size's DEFAULT_DECODE entries in module_path by the choice default_table
    makes from the results' sweep rows; returns a one-line summary. InputError when the results
    hold no sweep, it timed nothing or the table is not found."""
    try:
        results = json.loads(results_path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"--apply-defaults {results_path}: cannot read it ({exc}); pass DIR/turboquant_bench.json of a --sweep run") from None
    if not results.get("sweep"):
        raise InputError(f"--apply-defaults {results_path}: no sweep in it; run the benchmark with --sweep first")
    head = results["meta"]["head_size"]
    table = default_table(tq, head, results["sweep"])
    if not table:
        raise InputError(f"--apply-defaults {results_path}: its sweep timed nothing (a --smoke run?); use a GPU run's results")
    source = module_path.read_text()
    start = source.find(TABLE_START)
    end = source.find("\n}\n", start)
    if start < 0 or end < 0:
        raise InputError(f"--apply-defaults: {module_path} has no DEFAULT_DECODE table; restore it from git")
    body = source[start + len(TABLE_START):end + 1].splitlines()
    kept = [line for line in body if not line.strip().startswith(f"({head},")]
    new = table_lines(tq, table)
    module_path.write_text(source[:start + len(TABLE_START)] + "\n".join(kept + new) + source[end:])
    return f"wrote {len(new)} DEFAULT_DECODE entries for head {head} into {module_path}"


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown_table(rows: Sequence[Dict[str, Any]], columns: Sequence[str]) -> str:
    """A Markdown table of rows (missing cells '-')."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def shape_label(batch: int, context: int) -> str:
    """'b8 128k' for batch 8 at 131072 tokens; contexts below 1024 stay in tokens."""
    return f"b{batch} {context // 1024}k" if context >= 1024 and context % 1024 == 0 else f"b{batch} {context}"


def timing_matrix(timings: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per kind, one column per (batch, context) in the order measured, in microseconds."""
    kinds: Dict[str, Dict[str, Any]] = {}
    for t in timings:
        kinds.setdefault(t["kind"], {"kind": t["kind"]})[shape_label(t["batch"], t["context"])] = t["us"]
    return list(kinds.values())


def fastest_bf16(timings: Sequence[Dict[str, Any]], batch: int, context: int) -> Tuple[Optional[str], Optional[float]]:
    """The fastest bf16-cache yardstick timed at this shape (kind, microseconds): the goal is
    measured against the best bf16 decode we have, not one that happens to run a slow path."""
    found = [(t["us"], t["kind"]) for t in timings if t["kind"].startswith("bf16 ") and t["batch"] == batch and t["context"] == context and t["us"]]
    if not found:
        return None, None
    us, kind = min(found)
    return kind, us


def verdicts(timings: Sequence[Dict[str, Any]]) -> List[str]:
    """Issue 18's goal, checked per dtype and shape: ours <= upstream; ours < the fastest bf16
    yardstick from 32k on."""
    by = {(t["kind"], t["batch"], t["context"]): t["us"] for t in timings}
    lines = []
    for (kind, batch, context), us in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        if not kind.startswith("ours ") or us is None:
            continue
        name = kind[len("ours "):]
        peer = by.get((f"upstream {name}", batch, context))
        bf16_kind, bf16 = fastest_bf16(timings, batch, context)
        parts = []
        if peer is not None:
            parts.append(f"{'OK' if us <= peer else 'SLOWER'} vs upstream ({us:.1f} vs {peer:.1f} us)")
        if bf16 is not None and context >= 32768:
            parts.append(f"{'OK' if us < bf16 else 'SLOWER'} vs {bf16_kind} ({us:.1f} vs {bf16:.1f} us)")
        if parts:
            lines.append(f"{name} b{batch} ctx {context}: " + "; ".join(parts))
    return lines


def render(results: Dict[str, Any]) -> str:
    """The Markdown report."""
    meta = results["meta"]
    out = [f"# TurboQuant kernels: {meta['device']}", "", f"head {meta['head_size']}, {meta['kv_heads']} KV heads, {meta['q_heads']} query heads, "
           f"block size {meta['block_size']}; upstream: {meta['upstream'] or 'not given'}", ""]
    out += ["## KV bytes per token per layer", "", markdown_table(results["kv_bytes"], ["kind", "ours", "upstream", "vs_bf16"]), ""]
    out += ["## Unit-vector MSE per bit width", "", markdown_table(results["distortion"], ["head_size", "bits", "paper", "gaussian_lloyd_max", "ours_integral",
                                                                                               "ours_measured", "ours_measured_nc", "upstream_measured"]), ""]
    out += ["## Correctness (relative L2 error of the attention output)", "",
            markdown_table(results["correctness"], ["dtype", "batch", "context", "ours_vs_reference", "ours_vs_exact", "reference_vs_exact", "upstream_vs_exact"]), ""]
    matrix = timing_matrix(results["timings"])
    if matrix:
        columns = ["kind"] + list(dict.fromkeys(c for row in matrix for c in row if c != "kind"))
        out += ["## Decode attention, median microseconds per call (CUDA graph replay)", "", markdown_table(matrix, columns), ""]
        rates = timing_matrix([{**t, "us": t.get("gbps")} for t in results["timings"]])
        out += [f"## Cache bytes read per second, GB/s (a 1 GiB device copy: {_fmt(results.get('copy_gbps'))} GB/s)", "",
                markdown_table(rates, columns), ""]
        out += [f"- FLAG: {line}" for line in results.get("bandwidth_flags", [])] + ([""] if results.get("bandwidth_flags") else [])
    out += ["## Goal check", ""] + [f"- {line}" for line in verdicts(results["timings"])] + [""]
    if results.get("sweep_best"):
        out += ["## Sweep: fastest decode config per shape (default = the shipped DEFAULT_DECODE entry, timed in the sweep)", "",
                markdown_table(results["sweep_best"], ["dtype", "batch", "context", "best", "best_us", "default_us", "bf16_us", "vs_bf16"]), ""]
        out += ["## DEFAULT_DECODE lines for tq_triton.py (or: bench_turboquant.py --apply-defaults DIR/turboquant_bench.json)", "", "```python"]
        out += results["default_table"] + ["```", ""]
    if results.get("notes"):
        out += ["## Notes", ""] + [f"- {n}" for n in results["notes"]] + [""]
    if results.get("failures"):
        out += ["## FAILED", ""] + [f"- {f}" for f in results["failures"]] + [""]
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        if args.apply_defaults is not None:
            print(apply_defaults(args.apply_defaults, MOD_FILES / "tq_triton.py", load_modules(interpret=False)[1]))
            return 0
        fmt, tq = load_modules(interpret=args.smoke)
        try:
            up = load_upstream(args.upstream_site) if args.upstream_site is not None else None
        except ImportError as exc:
            raise InputError(f"--upstream-site {args.upstream_site}: cannot import vLLM's TurboQuant ops ({exc}); install vLLM 0.21 with its dependencies there") from None
        names = [n.strip() for n in args.dtypes.split(",")] if args.dtypes else list(fmt.DTYPES)
        for name in names:
            fmt.tq_spec(name)
        fmt.check_head_size(args.head_size)
    except (InputError, ValueError) as exc:
        print(f"bench_turboquant.py: {exc}", file=sys.stderr)
        return 2
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("bench_turboquant.py: no CUDA device; run on the GPU machine, or use --smoke on a CPU", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    started = time.time()
    bench = Bench(args, fmt, tq, up, make_workload(args, device), names)
    bench.run()
    bench.bandwidth()
    results = bench.results
    results["meta"] = {"device": "cpu (TRITON_INTERPRET=1)" if args.smoke else torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": __import__("triton").__version__, "head_size": args.head_size, "kv_heads": args.kv_heads, "q_heads": args.q_heads,
                       "block_size": args.block_size, "batches": args.batches, "contexts": args.contexts,
                       "upstream": f"vLLM {up.version} ({args.upstream_site})" if up else None, "seconds": round(time.time() - started, 1)}
    results["notes"] = up.notes if up else []
    results["failures"] = bench.failures
    if results.get("sweep"):
        results["sweep_best"] = sweep_summary(tq, args.head_size, results["sweep"], results["timings"])
        results["default_table"] = table_lines(tq, default_table(tq, args.head_size, results["sweep"]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "turboquant_bench.json").write_text(json.dumps(results, indent=1) + "\n")
    report = render(results)
    (args.out / "turboquant_bench.md").write_text(report + "\n")
    print(report)
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
