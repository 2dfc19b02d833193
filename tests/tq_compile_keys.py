"""Run as a script: which turboquant kernel variants a server would compile after warm_up, on a CPU.

Triton compiles a kernel once per key: its argument types, the constexprs, and what it
specialises (an integer divisible by 16, a pointer's alignment). vLLM's JIT monitor names a
kernel compiled while a request waits; the GPU end-to-end run fails turboquant on that. Here the
same keys come from Triton itself: a stand-in driver makes Triton bind arguments for a CUDA
target (sm_90) without a GPU, and knobs.runtime.jit_cache_hook records each key a launch asks
for and skips the compile and the launch (kernels do not run; nothing reads their output).

For each case: tq_triton.warm_up with the server's geometry and limits, then the calls the
attention implementation (sparkmods_turboquant.py) makes while serving, with its argument
layouts: query/key/value as views into one qkv buffer, block-table rows as a slice of the
persistent table (or index_select rows with speculative tokens), the prefill's whole table and
first row. Any key first seen after warm_up is a late compile.

    python3 tests/tq_compile_keys.py CASES.json   # prints a JSON list, one result per case

A case: dtype, head_size, q_heads, kv_heads, block_size, max_context, max_num_seqs,
speculative_tokens, max_batched_tokens, sm_count; optional "warm": false (skip warm_up) and
"specialize": [kernel names] (re-jit those kernels without their do_not_specialize, as a control).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List

FILES = Path(__file__).resolve().parents[1] / "mods" / "turboquant" / "files"


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


def serving_calls(torch: Any, triton: Any, fmt: Any, tq: Any, case: Dict[str, Any]) -> List[tuple]:
    """(label, call) for every launch pattern a server of this case makes after start-up."""
    spec = fmt.tq_spec(case["dtype"])
    dtype = torch.bfloat16
    head, hq, hkv, bs = case["head_size"], case["q_heads"], case["kv_heads"], case["block_size"]
    width = triton.cdiv(case["max_context"], bs)
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

    def store(n: int) -> Callable[[], None]:
        return lambda: tq.tq_store(key[:n].view(n, hkv, head), value[:n].view(n, hkv, head), cache, slots[:n], spec)

    def decode(batch: int) -> Callable[[], None]:
        rows = batch * (1 + k)
        if k:
            req = torch.arange(rows) // (1 + k)
            bt, lens = table.index_select(0, req), seq_lens.index_select(0, req)
        else:
            bt, lens = table[:batch], seq_lens[:batch]
        return lambda: tq.tq_decode(query[:rows], cache, bt, lens, 0.1, spec, out=output[:rows])

    def prefill(decodes: int, lengths: List[int]) -> Callable[[], None]:
        cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        torch.cumsum(torch.tensor(lengths, dtype=torch.int32), dim=0, out=cu[1:])
        return lambda: tq.tq_dequant_varlen(cache, table[:decodes + len(lengths)], cu, spec, head, dtype,
                                            first_row=decodes)

    for n in sorted({1, 2, 3, 15, 16, 17, 1023, 1024, 1025, 4096, seqs * (1 + k), tokens}):
        if n <= tokens:
            calls.append((f"store of {n} tokens", store(n)))
    calls += [(f"decode of {b} requests", decode(b)) for b in range(1, seqs + 1)]
    for decodes in sorted({0, 1, 5, 17, seqs - 1}):
        for lengths in ([1], [17], [5000], [3, 40000, 9], [7] * 17, [1] * (seqs - decodes)):
            if decodes + len(lengths) <= seqs:
                calls.append((f"prefill of {len(lengths)} requests after {decodes} decodes", prefill(decodes, lengths)))
    return calls


def run_case(torch: Any, triton: Any, fmt: Any, tq: Any, case: Dict[str, Any], seen: List[tuple]) -> Dict[str, Any]:
    """Warm up as the metadata builder does, then serve; the keys first asked for while serving."""
    for name in case.get("specialize", []):  # the control: a kernel that specialises its counts again
        setattr(tq, name, triton.jit(getattr(tq, name).fn))
    tq._SM_COUNT["cpu"] = case["sm_count"]
    del seen[:]
    if case.get("warm", True):
        tq.warm_up(fmt.tq_spec(case["dtype"]), case["head_size"], case["q_heads"], case["kv_heads"],
                   case["block_size"], case["max_context"], case["max_num_seqs"] * (1 + case["speculative_tokens"]),
                   torch.bfloat16, torch.device("cpu"))
    warm = {key for key, _ in seen}
    late: Dict[str, str] = {}
    calls = serving_calls(torch, triton, fmt, tq, case)
    for label, call in calls:
        del seen[:]
        call()
        for key, kernel in seen:
            if key not in warm and key not in late:
                late[key] = f"{kernel} at the {label}"
    return {"case": case, "warm_keys": len(warm), "serving_calls": len(calls), "late": sorted(late.values())}


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
    sys.path.insert(0, str(FILES))
    import tq_format as fmt
    import tq_triton as tq

    originals = {name: getattr(tq, name) for name in dir(tq) if name.endswith("_kernel")}
    results = []
    for case in cases:
        results.append(run_case(torch, triton, fmt, tq, case, seen))
        for name, kernel in originals.items():
            setattr(tq, name, kernel)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
