"""turboquant at work in a real vLLM 0.19.1 (marker vllm_runtime: installs vLLM, about 3 GB).

The mod is applied with its own run.sh to an overlay of the release's site-packages, then
mod_turboquant_probe.py runs under that release's python (CPU only; Triton kernels under
TRITON_INTERPRET=1) on config-only model folders: a hybrid Qwen3.5-MoE (DeltaNet + every 4th
layer full attention, head 256, 2 KV heads, the real model's DeltaNet state sizes) and a dense
Qwen3 (head 128). Each test below asserts one thing vLLM itself reported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest

from probekit import run_job
from tqmodels import DTYPES, dense_config, hybrid_config, model_dir
from vllmenv import applied_overlay, run_sh

pytestmark = pytest.mark.vllm_runtime

MOD = Path(__file__).resolve().parents[1] / "mods" / "turboquant"
PROBE = Path(__file__).resolve().parent / "mod_turboquant_probe.py"
VERSION = "0.19.1"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    tmp = tmp_path_factory.mktemp("turboquant")
    env, site = applied_overlay(MOD, VERSION, tmp, "v0.18.0")
    again = run_sh(MOD, site, tmp / "workspace")
    assert again.returncode == 0 and "already applied" in again.stdout, again.stdout + again.stderr
    hybrid, dense = model_dir(tmp / "qwen35", hybrid_config()), model_dir(tmp / "qwen3", dense_config())
    job = {
        "cache_dtypes": DTYPES + ["turboquant_2bit", "auto"],
        "models": {"hybrid": hybrid, "dense": dense}, "dense_model": dense,
        "engine_dtypes": ["turboquant_k3v4_nc", "turboquant_k8v4"],
        "head_sizes": {"hybrid": 256, "dense": 128},
        "layer_prefixes": {"hybrid": ["language_model.model.layers.3.self_attn.attn"],
                           "dense": ["model.layers.0.self_attn.attn", "model.layers.3.self_attn.attn"]},
        "forward": [{"kv_cache_dtype": "turboquant_k3v4_nc", "head_size": 128},
                    {"kv_cache_dtype": "turboquant_k8v4", "head_size": 256}],
    }
    return run_job(env, PROBE, [job], tmp, site, {"TRITON_INTERPRET": "1"})  # the Triton kernels on the CPU


def test_cache_config_accepts_the_four_upstream_names_only(report: Dict[str, Any]) -> None:
    got = report["cache_dtypes"]
    assert {name: got[name] for name in DTYPES} == {name: name for name in DTYPES}
    assert got["turboquant_2bit"].startswith("error") and got["auto"] == "auto"


def test_startup_line_on_the_hybrid_model(report: Dict[str, Any]) -> None:
    engine = report["engine"]["hybrid/turboquant_k3v4_nc"]
    # 2 KV heads x (96 key code bytes + 2 norm + 128 value code bytes + 4 scale/zero) per token
    assert engine["log"] == ["[turboquant] KV cache turboquant_k3v4_nc on 2 of 2 attention layers (boundary: none); "
                             "K 3 bit, V 4 bit, 460 bytes/token/layer (2048 in bf16)"]
    assert engine["skip"] == []  # hybrid: no boundary layers, as vLLM 0.21
    assert report["engine"]["hybrid/turboquant_k8v4"]["log"][0].endswith("K FP8, V 4 bit, 776 bytes/token/layer (2048 in bf16)")


def test_dense_model_keeps_two_boundary_layers_on_each_side(report: Dict[str, Any]) -> None:
    engine = report["engine"]["dense/turboquant_k3v4_nc"]
    assert engine["skip"] == ["0", "1", "6", "7"]
    assert "on 4 of 8 attention layers (boundary: 0, 1, 6, 7)" in engine["log"][0]


def test_backend_is_ours_on_quantised_layers_and_the_default_on_boundary_layers(report: Dict[str, Any]) -> None:
    dense = report["layers"]["dense"]
    boundary, quantised = dense["model.layers.0.self_attn.attn"], dense["model.layers.3.self_attn.attn"]
    assert (quantised["backend"], quantised["impl"], quantised["spec"]) == (
        "TURBOQUANT", "TurboQuantImpl", "TurboQuantAttentionSpec")
    assert boundary["backend"] != "TURBOQUANT" and boundary["kv_cache_dtype"] == "auto"
    assert (boundary["spec"], boundary["dtype"]) == ("FullAttentionSpec", "torch.bfloat16")
    # page of 16 tokens: packed 2 x 118 bytes against bf16 2 x 2 x 128 x 2 bytes
    assert (quantised["page_size_bytes"], boundary["page_size_bytes"]) == (16 * 236, 16 * 1024)
    assert report["enum"] == "TurboQuantBackend"
    # vLLM logs the backend it picks; ours is picked by the mod's hook, which names it instead, once
    # per process (the hybrid model's layers were made first, in the same process)
    assert report["layers"]["hybrid"]["selection_log"] == [
        "Using TURBOQUANT attention backend for --kv-cache-dtype turboquant_k3v4_nc (sparkmods turboquant)",
        "TurboQuant attention on sparkmods kernels: --kv-cache-dtype turboquant_k3v4_nc, head size 256"]
    # the selection line once per process; the kernels line once per distinct head size
    assert dense["selection_log"] == [
        "TurboQuant attention on sparkmods kernels: --kv-cache-dtype turboquant_k3v4_nc, head size 128"]


def test_hybrid_attention_pages_unify_with_the_deltanet_state_pages(report: Dict[str, Any]) -> None:
    hybrid = report["layers"]["hybrid"]["language_model.model.layers.3.self_attn.attn"]
    assert hybrid["backend"] == "TURBOQUANT" and hybrid["page_size_bytes"] == 16 * 460
    padded = report["engine"]["hybrid/turboquant_k3v4_nc"]["mamba_page_size_padded"]
    assert padded % 460 == 0 and (padded // 460) % 16 == 0  # attention block: a multiple of 16 tokens
    unify = report["unify"]
    assert {g["page"] for g in unify["groups"]} == {padded}, unify
    attention = [g for g in unify["groups"] if g["spec"] == "TurboQuantAttentionSpec"]
    assert attention == [{"spec": "TurboQuantAttentionSpec", "page": padded, "block": padded // 460, "layers": 2}]
    assert unify["manager"] == "FullAttentionManager"


@pytest.mark.parametrize("case", ["turboquant_k3v4_nc/128", "turboquant_k8v4/256"])
def test_forward_matches_the_reference_on_every_path(report: Dict[str, Any], case: str) -> None:
    """Prefill (dequantise + varlen attention), decode with a speculative-decode request
    (per-token rows through tq_decode), and a mixed batch, against the format's reference."""
    steps = report["forward"][case]
    assert (steps["prefill"]["num_decodes"], steps["prefill"]["prefill"]) == (0, True)
    assert (steps["decode"]["num_decodes"], steps["decode"]["num_decode_tokens"], steps["decode"]["prefill"]) == (
        2, 4, False)
    assert (steps["mixed"]["num_decodes"], steps["mixed"]["prefill"]) == (1, True)
    for name, step in steps.items():
        assert step["finite"], name
        assert step["max_abs_err"] <= 0.04, (name, step)  # bf16 output rounding of values up to ~4
