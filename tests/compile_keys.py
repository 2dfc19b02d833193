"""Run as a script: which Triton kernel variants of turboquant and int8-lm-head a server would
compile after the mod's start-up warm-up, found on a CPU.

Triton compiles a kernel once per key: its argument types, the constexprs, and what it
specialises (an integer equal to 1 or divisible by 16, a pointer's alignment). vLLM's JIT
monitor names a kernel compiled while a request waits; the GPU end-to-end run fails a mod on
that. Here the keys come from Triton itself: a stand-in driver makes Triton bind arguments for a
CUDA target (sm_90) without a GPU, and knobs.runtime.jit_cache_hook records each key a launch
asks for and skips the compile and the launch (kernels do not run; nothing reads their output).
Any key first asked for after the warm-up is a late compile.

turboquant: what tq_triton.warm_up runs (compile_variants, so that a failure is raised, not logged)
with the server's geometry and limits, then the calls the attention
implementation (sparkmods_turboquant.py) makes while serving (tq_store_decode: a step's store
and its decode rows; tq_dequant_varlen for a prefill), with its argument layouts:
query/key/value as views into one qkv buffer, block-table rows as a slice of the persistent
table (or index_select rows with speculative tokens), the prefill's whole table and first row.
int8-lm-head: warm_up on the head, then int8_matmul at every row count up to max_rows (vLLM
computes logits on the real row count of each step: the sampled rows, or every prompt token
with prompt logprobs), on hidden states as vLLM hands them (contiguous rows). Its Triton path is
forced as on a GPU; the head is small, its sizes of the same integer classes as Qwen3.5's
(vocabulary and hidden size divisible by 16), which is all a key sees of them.

    python3 tests/compile_keys.py CASES.json   # prints a JSON list, one result per case

A case names its "mod". turboquant: dtype, head_size, q_heads, kv_heads, block_size,
max_context, max_num_seqs, speculative_tokens, max_batched_tokens, sm_count, shared_memory (opt-in
bytes per block: the decode tiles are fitted to it), optionally alloc_block (vLLM's allocation
block, a multiple of block_size: a hybrid model's is larger, and a table row holds whole ones) and
"warm_pages_only": true (a control: the warm-up sizes the table in pages). int8-lm-head:
vocab, hidden, dtype (bfloat16 or float16), max_rows. Either: optional "warm": false (skip the
warm-up) and "specialize": [kernel names] (re-jit those kernels without their
do_not_specialize, as a control).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List

REPO = Path(__file__).resolve().parents[1]
FILES = REPO / "mods" / "turboquant" / "files"


class CudaTargetDriver:
    """The calls JITFunction.run makes of the active driver before it compiles, for an sm_90 target."""

    def __init__(self, torch: Any, target: Any) -> None:
        self.torch, self.target = torch, target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def get_active_torch_device(self) -> Any:
        return self.torch.device("cpu")

    def is_active(self) -> bool:
        return True


def turboquant_calls(torch: Any, triton: Any, fmt: Any, tq: Any, case: Dict[str, Any]) -> List[tuple]:
    """(label, call) for every launch pattern a turboquant server of this case makes after start-up."""
    spec = fmt.tq_spec(case["dtype"])
    dtype = torch.bfloat16
    head, hq, hkv, bs = case["head_size"], case["q_heads"], case["kv_heads"], case["block_size"]
    alloc = case.get("alloc_block", bs)  # vLLM sizes a row in allocation blocks of whole pages
    width = triton.cdiv(case["max_context"], alloc) * (alloc // bs)
    seqs, k = case["max_num_seqs"], case["speculative_tokens"]
    tokens = max(case["max_batched_tokens"], seqs * (1 + k))
    qkv = torch.zeros(tokens, (hq + 2 * hkv) * head, dtype=dtype)
    query = qkv[:, :hq * head].view(-1, hq, head)
    key = qkv[:, hq * head:(hq + hkv) * head]
    value = qkv[:, (hq + hkv) * head:]
    output = torch.zeros(tokens, hq, head, dtype=dtype)
    cache = torch.zeros(fmt.cache_shape(4, bs, hkv, head, spec), dtype=torch.uint8)
    table = torch.zeros(seqs, width, dtype=torch.int32)
    seq_lens = torch.ones(seqs, dtype=torch.int32)
    slots = torch.zeros(tokens, dtype=torch.int64)
    calls: List[tuple] = []

    def step(decodes: int, stored: int) -> Callable[[], None]:
        """forward's store and decode: `decodes` requests' rows, `stored` tokens (theirs first)."""
        rows = decodes * (1 + k)
        if k:
            req = torch.arange(rows) // (1 + k)
            bt, lens = table.index_select(0, req), seq_lens.index_select(0, req)
        else:
            bt, lens = table[:decodes], seq_lens[:decodes]
        return lambda: tq.tq_store_decode(query[:rows], key[:stored].view(stored, hkv, head),
                                          value[:stored].view(stored, hkv, head), cache, slots[:stored], bt, lens,
                                          0.1, spec, output[:rows])

    def prefill(decodes: int, lengths: List[int]) -> Callable[[], None]:
        cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        torch.cumsum(torch.tensor(lengths, dtype=torch.int32), dim=0, out=cu[1:])
        return lambda: tq.tq_dequant_varlen(cache, table[:decodes + len(lengths)], cu, spec, head, dtype,
                                            first_row=decodes)

    for n in sorted({1, 2, 3, 15, 16, 17, 1023, 1024, 1025, 4096, seqs * (1 + k), tokens}):
        if n <= tokens:
            calls.append((f"store of {n} tokens", step(0, n)))
    calls += [(f"decode of {b} requests", step(b, b * (1 + k))) for b in range(1, seqs + 1)]
    for decodes in sorted({1, 5, 17, seqs - 1}):
        for n in sorted({decodes * (1 + k) + 1, decodes * (1 + k) + 1500, tokens}):
            if 0 < decodes < seqs and n <= tokens:
                calls.append((f"store of {n} tokens with {decodes} decodes", step(decodes, n)))
    for decodes in sorted({0, 1, 5, 17, seqs - 1}):
        for lengths in ([1], [17], [1500], [3, 3000, 9], [7] * 17, [1] * (seqs - decodes)):
            if decodes + len(lengths) <= seqs:
                calls.append((f"prefill of {len(lengths)} requests after {decodes} decodes", prefill(decodes, lengths)))
    return calls


def int8_calls(torch: Any, mod: Any, head: Any, case: Dict[str, Any]) -> List[tuple]:
    """(label, call) for int8_matmul at every row count the logits processor can hand it."""
    dtype = getattr(torch, case["dtype"])

    def matmul(rows: int) -> Callable[[], None]:
        return lambda: mod.int8_matmul(torch.zeros(rows, case["hidden"], dtype=dtype), head)

    return [(f"logits of {m} rows", matmul(m)) for m in range(1, case["max_rows"] + 1)]


def late_compiles(seen: List[tuple], warm_up: Callable[[], None], calls: List[tuple]) -> Dict[str, Any]:
    """Run warm_up, then the calls; the keys first asked for by a call, each with the first call asking."""
    del seen[:]
    warm_up()
    warm = {key for key, _ in seen}
    late: Dict[str, str] = {}
    for label, call in calls:
        del seen[:]
        call()
        for key, kernel in seen:
            if key not in warm and key not in late:
                late[key] = f"{kernel} at the {label}"
    return {"warm_keys": len(warm), "serving_calls": len(calls), "late": sorted(late.values())}


def run_case(torch: Any, triton: Any, modules: Dict[str, Any], case: Dict[str, Any], seen: List[tuple]) -> Dict[str, Any]:
    """One case: its mod's warm-up as the server runs it (unless "warm" is false), then its serving calls."""
    if case["mod"] == "turboquant":
        fmt, tq = modules["tq_format"], modules["tq_triton"]
        tq._SM_COUNT["cpu"] = case["sm_count"]
        tq._device_tuning = lambda index: (case["shared_memory"], tq.DEFAULT_DECODE)  # a GPU without a tune file
        rows = case["max_num_seqs"] * (1 + case["speculative_tokens"])
        bs, context = case["block_size"], case["max_context"]
        tables = ([triton.cdiv(context, bs) * bs] if case.get("warm_pages_only")
                  else tq.table_capacities(context, (bs, case.get("alloc_block", bs))))
        args = (fmt.tq_spec(case["dtype"]), case["head_size"], case["q_heads"], case["kv_heads"], bs, tables, rows,
                torch.bfloat16, torch.device("cpu"))
        warm_up, calls = (lambda: tq.compile_variants(*args)), turboquant_calls(torch, triton, fmt, tq, case)
    else:
        mod, dtype = modules["int8_lm_head"], getattr(torch, case["dtype"])
        head = mod.quantize_head(torch.randn(case["vocab"], case["hidden"], dtype=dtype))
        warm_up, calls = (lambda: mod.warm_up(head, dtype)), int8_calls(torch, mod, head, case)
    result = late_compiles(seen, warm_up if case.get("warm", True) else (lambda: None), calls)
    return {"case": case, **result}


def load_modules(torch: Any, workdir: Path) -> Dict[str, Any]:
    """The mods' kernel modules as they install them, making a GPU's choices on CPU tensors:
    turboquant's files (decode tiles fitted to the case's shared memory, its inline assembly),
    int8-lm-head's from its patch (its Triton path, its warm-up)."""
    sys.path[:0] = [str(FILES), str(REPO / "ci" / "bench")]
    import tq_format
    import tq_triton

    from benchlib.int8_lm_head_kernel import load_kernel_module

    gpu = torch.device("cuda", 0)  # a name only: the choices a GPU makes, on CPU tensors
    decode_config, inline_ptx = tq_triton.decode_config, tq_triton.inline_ptx
    tq_triton.decode_config = lambda spec, head, group, batch, context, device: decode_config(
        spec, head, group, batch, context, gpu)
    tq_triton.inline_ptx = lambda device: inline_ptx(gpu)
    int8 = load_kernel_module(workdir)
    int8._triton_ok = lambda x2d, weight: True
    int8.WARMUP_DEVICE_TYPES = ("cpu",)
    return {"tq_format": tq_format, "tq_triton": tq_triton, "int8_lm_head": int8}


def main(argv: List[str]) -> int:
    cases = json.loads(Path(argv[0]).read_text())
    import torch
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    driver.set_active(CudaTargetDriver(torch, GPUTarget("cuda", 90, 32)))
    seen: List[tuple] = []

    def record(*, key: Any, fn: Any, **_: Any) -> bool:
        seen.append((f"{fn.name} {key}", fn.name))
        return True  # skip the compile and the launch

    knobs.runtime.jit_cache_hook = record
    with tempfile.TemporaryDirectory() as workdir:
        modules = load_modules(torch, Path(workdir))
        results = []
        for case in cases:
            module = modules["tq_triton" if case["mod"] == "turboquant" else "int8_lm_head"]
            kernels = {name: getattr(module, name) for name in case.get("specialize", [])}
            for name, kernel in kernels.items():  # the control: a kernel that specialises its counts again
                setattr(module, name, triton.jit(kernel.fn))
            try:
                results.append(run_case(torch, triton, modules, case, seen))
            finally:
                for name, kernel in kernels.items():
                    setattr(module, name, kernel)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
