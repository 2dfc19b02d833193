"""turboquant's v0.27.0-kernels variant in a real vLLM 0.33.0 (marker vllm_runtime: about 3 GB).

From 0.29 a backend declares a KVCacheLayout instead of a cache shape, and each layer gets the
logical (blocks, heads, block_size, slot) view of memory in that layout's order. The probe
(mod_turboquant_shape_probe.py, `layout_forward`) builds vLLM 0.33.0's own engine config and
Attention layer for the tiny hybrid model, packs the spec with upstream's customize_spec, lays a
cache out by the layout upstream's backend declares, and runs a prefill and a decode step through
the impl and builder that backend now names, with the Triton kernels on the CPU.
"""

from __future__ import annotations

from typing import Any, Dict

import pytest

from probekit import run_job
from test_mod_turboquant_shape import MOD, PROBE, SLOT, models
from tqmodels import DTYPES, assert_forward_matches_reference
from vllmenv import applied_overlay

pytestmark = pytest.mark.vllm_runtime

VERSION = "0.33.0"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    tmp = tmp_path_factory.mktemp("turboquant-layouts")
    env, site = applied_overlay(MOD, VERSION, tmp, "v0.27.0-kernels")
    job = {"models": {"tiny": models(tmp / "models")["tiny"]}, "dtypes": DTYPES,
           "cuda_priorities": ["FLASH_ATTN", "TURBOQUANT"], "layout_forward": True}
    (tmp / "mod").mkdir()
    return run_job(env, PROBE, [job], tmp / "mod", site, {"TRITON_INTERPRET": "1"})


@pytest.mark.parametrize("dtype", DTYPES)
def test_turboquant_layers_run_our_kernels_on_a_layout_ordered_cache(report: Dict[str, Any], dtype: str) -> None:
    got = report[f"tiny/{dtype}"]
    assert got["layout"] == "LBNHC"  # upstream's declared order: token-major pages, heads inside
    assert got["content"] % (2 * SLOT[256][dtype]) == 0  # the page holds upstream's bytes per token
    assert_forward_matches_reference(got["forward"])
    # a backend built on upstream's TurboQuant class (0.33's ULTRAQUANT) keeps upstream's impl and
    # vLLM's separate store call, which the patched class attribute would otherwise switch off
    assert got["subclass"] == {"impl": "vllm.v1.attention.backends.turboquant_attn.TurboQuantAttentionImpl",
                               "stores_in_forward": False}
