"""turboquant's and int8-lm-head's start-up warm-ups compile every kernel variant a server
launches afterwards.

Keys from Triton itself for an sm_90 target, on the CPU (tests/compile_keys.py, run as a
subprocess: this suite's other kernel tests import Triton in interpreter mode). The GPU
end-to-end run checks the same on a real server through vLLM's JIT monitor, for one shape; this
covers, for turboquant, every dtype, both Qwen3.5 attention shapes, MTP rows, short and long
--max-model-len, a GB10's and an H200's SM counts (split counts depend on them) and shared
memory (decode tiles are fitted to it), the 3-bit key lookup a GPU uses; for the
INT8 head, every row count to 400 in bf16 and 200 in fp16 (its own tests prove no larger count has a
key of its own, from its model of Triton's integer classes, which this checks against Triton).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from extras import INSTALL, need

need("torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip(f"needs triton from the kernels extra: {INSTALL} (Linux only)", allow_module_level=True)

SCRIPT = Path(__file__).resolve().parent / "compile_keys.py"
DTYPES = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
SHAPES = {"35b-a3b": (16, 2), "122b-a10b": (32, 2)}  # query heads, KV heads; head size 256
H200_SHARED, GB10_SHARED = 232448, 101376  # opt-in shared memory per block
# (max_context, max_num_seqs, speculative tokens, SMs, shared memory): a long-context H200 server,
# a short GB10 one with MTP, a 256k GB10 one with three speculative tokens
SERVERS = ((131072, 256, 0, 132, H200_SHARED), (4096, 8, 2, 48, GB10_SHARED), (262144, 64, 3, 48, GB10_SHARED))
BASE = {"mod": "turboquant", "head_size": 256, "block_size": 16, "max_batched_tokens": 8192}
CONTROL = {**BASE, "dtype": "turboquant_k3v4_nc", "q_heads": 16, "kv_heads": 2, "max_context": 131072,
           "max_num_seqs": 64, "speculative_tokens": 0, "sm_count": 132, "shared_memory": H200_SHARED}


def _case(dtype: str, shape: str, server: tuple) -> Dict[str, Any]:
    context, seqs, spec, sms, shared = server
    q, kv = SHAPES[shape]
    return {**BASE, "dtype": dtype, "q_heads": q, "kv_heads": kv, "max_context": context, "max_num_seqs": seqs,
            "speculative_tokens": spec, "sm_count": sms, "shared_memory": shared}


# the GPU end-to-end's server (a hybrid model: vLLM allocates 304-token blocks of 16-token pages, so a
# table row holds 2128 tokens for --max-model-len 2048), and one whose rounding crosses the context band
HYBRID = {**CONTROL, "max_context": 2048, "max_num_seqs": 16, "alloc_block": 304}
HYBRID_BAND = {**HYBRID, "max_context": 16300}
# a merge kernel that specialises its split count: on 48 SMs the warm-up runs batch 1, 3 and 6 first for
# each merge_rows (48, 32 and 16 splits, all divisible by 16); batches 4 (24 splits) and 7 (14)
# are the first counts of another class with the same merge rows
SPECIALISED = {**CONTROL, "max_num_seqs": 16, "sm_count": 48, "specialize": ["_decode_merge_kernel"]}
CASES = [*(_case(*c) for c in itertools.product(DTYPES, SHAPES, SERVERS)), HYBRID, HYBRID_BAND]
HEADS = [{"mod": "int8-lm-head", "vocab": 4096, "hidden": 2048, "dtype": "bfloat16", "max_rows": 400},
         {"mod": "int8-lm-head", "vocab": 4096, "hidden": 3072, "dtype": "float16", "max_rows": 200}]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> List[Dict[str, Any]]:
    cases = [*CASES, {**CONTROL, "warm": False}, SPECIALISED,
             *HEADS, {**HEADS[0], "warm": False, "max_rows": 200}, {**HYBRID_BAND, "warm_pages_only": True}]
    path = tmp_path_factory.mktemp("keys") / "cases.json"
    path.write_text(json.dumps(cases))
    done = subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [r["case"] for r in out] == cases
    return out


@pytest.mark.parametrize("index", range(len(CASES)),
                         ids=[f"{c['dtype']}-{c['q_heads']}q-{c['max_context']}-{c['max_num_seqs']}x{1 + c['speculative_tokens']}"
                              f"-{c['sm_count']}sm-{c.get('alloc_block', 16)}" for c in CASES])
def test_nothing_compiles_after_warm_up(results: List[Dict[str, Any]], index: int) -> None:
    result = results[index]
    assert result["serving_calls"] > result["case"]["max_num_seqs"] and result["warm_keys"] >= 4
    assert result["late"] == [], result["late"]


def test_without_warm_up_serving_compiles_every_kernel(results: List[Dict[str, Any]]) -> None:
    """The control that the recorder sees launches: the same server unwarmed compiles each kernel late."""
    late = results[len(CASES)]["late"]
    assert {entry.split()[0] for entry in late} == {"_store_kernel", "_rotate_kernel", "_rotate_few_kernel", "_dequant_kernel",
                                                    "_decode_split_kernel", "_decode_merge_kernel"}


def test_a_merge_kernel_that_specialises_its_split_count_compiles_late(results: List[Dict[str, Any]]) -> None:
    """The control that specialisation is seen: a merge kernel that specialises num_splits compiles
    at the first split count of another integer class than the warm-up's."""
    assert results[len(CASES) + 1]["late"] == ["_decode_merge_kernel at the decode of 4 requests",
                                               "_decode_merge_kernel at the decode of 7 requests"]


@pytest.mark.parametrize("index", range(len(HEADS)), ids=[f"{h['dtype']}-hidden{h['hidden']}" for h in HEADS])
def test_int8_head_compiles_nothing_after_warm_up(results: List[Dict[str, Any]], index: int) -> None:
    result = results[len(CASES) + 2 + index]
    assert result["case"] == HEADS[index] and result["serving_calls"] == HEADS[index]["max_rows"]
    assert result["warm_keys"] >= 10 and result["late"] == [], result["late"]


def test_an_unwarmed_int8_head_compiles_at_first_use_of_each_row_class(results: List[Dict[str, Any]]) -> None:
    """Triton's own keys agree with the head's model of them (triton_int_class): without the warm-up,
    one row count equal to 1, one divisible by 16 and one of neither compile in each dispatch band."""
    late = results[len(CASES) + 2 + len(HEADS)]["late"]
    rows = {int(entry.split(" of ")[1].split()[0]) for entry in late}
    assert {1, 2, 16, 17}.issubset(rows) and {entry.split()[0] for entry in late} >= {"_int8_head_kernel", "_rotate_rows_kernel"}


def test_a_warm_up_that_sizes_the_table_in_pages_misses_the_band_of_a_hybrid_models_table(
        results: List[Dict[str, Any]]) -> None:
    """The control for HYBRID_BAND: 16300 tokens in pages is a short table, in 304-token blocks a long
    one (16416); warmed for the first only, serving compiles the long band's decode late."""
    late = results[-1]["late"]
    assert results[-1]["case"]["warm_pages_only"] and results[CASES.index(HYBRID_BAND)]["late"] == []
    assert {entry.split()[0] for entry in late} == {"_decode_split_kernel", "_decode_merge_kernel"}, late
