"""turboquant's v0.21.0-kernels variant at work in a real vLLM 0.26.0 (marker vllm_runtime: about 3 GB).

vLLM 0.25.0-0.26.x cannot start any TurboQuant KV cache (the GPU e2e run of 0.26.0 failed with
"Unknown TurboQuant cache dtype: 'auto'"): the model runner shapes every attention layer whose
spec has no KVQuantMode as "auto", and the TurboQuant spec has none before 0.27. The probe
(mod_turboquant_shape_probe.py) runs vLLM's own engine config, Attention layers, grouping
and the GPU model runner's allocate + reshape on the CPU, once on the stock release and once
after the mod's run.sh, for the e2e tiny Qwen3.5-MoE (12 layers), the real Qwen3.5-122B-A10B
attention geometry (48 layers, full attention every 4th) and a dense Qwen3 (boundary layers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest

from probekit import run_job
from tqmodels import DTYPES, assert_forward_matches_reference, dense_config, hybrid_config, model_dir
from vllmenv import applied_overlay, vllm_env

pytestmark = pytest.mark.vllm_runtime

MOD = Path(__file__).resolve().parents[1] / "mods" / "turboquant"
PROBE = Path(__file__).resolve().parent / "mod_turboquant_shape_probe.py"
VERSION = "0.26.0"
# packed bytes per token and KV head (upstream's slot_size_aligned) at head 256 and 128
SLOT = {256: {"turboquant_k8v4": 388, "turboquant_4bit_nc": 262, "turboquant_k3v4_nc": 230,
              "turboquant_3bit_nc": 198},
        128: {"turboquant_k8v4": 196, "turboquant_4bit_nc": 134, "turboquant_k3v4_nc": 118,
              "turboquant_3bit_nc": 102}}
BLOCKS = 4  # the probe's NUM_BLOCKS
# vllm/platforms/cuda.py's default attention priorities (SM 8.x/9.x, not MLA); checked below
CUDA_PRIORITIES = ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT"]


def hybrid_with(layers: int) -> Dict[str, Any]:
    """hybrid_config (Qwen3.5-122B-A10B's dimensions) with `layers` layers, full attention every 4th."""
    config = hybrid_config()
    text = config["text_config"]
    text["num_hidden_layers"] = layers
    text["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    return config


def models(root: Path) -> Dict[str, Dict[str, Any]]:
    hybrid = {"model_type": "qwen3_5_moe", "heads": 8, "kv_heads": 2, "head_size": 256}
    return {
        "tiny": {**hybrid, "path": model_dir(root / "tiny", hybrid_with(12)), "attention": [3, 7, 11]},
        "qwen35-122b": {**hybrid, "path": model_dir(root / "q122", hybrid_with(48)),
                        "attention": list(range(3, 48, 4))},
        "dense": {"model_type": "qwen3", "heads": 4, "kv_heads": 2, "head_size": 128,
                  "path": model_dir(root / "dense", dense_config()), "attention": [0, 3, 7]},
    }


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("turboquant-shape")
    env, site = applied_overlay(MOD, VERSION, tmp, "v0.21.0-kernels")
    job = {"models": models(tmp / "models"), "dtypes": DTYPES, "cuda_priorities": CUDA_PRIORITIES}
    (tmp / "stock").mkdir()
    (tmp / "mod").mkdir()
    # with the mod, one step of the tiny model's first TurboQuant layer runs its kernels on the CPU
    return {"stock": run_job(env, PROBE, [job], tmp / "stock", None),
            "mod": run_job(env, PROBE, [{**job, "forward": ["tiny"]}], tmp / "mod", site, {"TRITON_INTERPRET": "1"})}


def test_the_probe_uses_the_release_cuda_priorities() -> None:
    """The probe cannot import vllm.platforms.cuda without libcuda, so it is told the list."""
    text = (vllm_env(VERSION).site / "vllm" / "platforms" / "cuda.py").read_text(encoding="utf-8")
    block = "".join(f"\n                AttentionBackendEnum.{name}," for name in CUDA_PRIORITIES)
    assert f"return [{block}\n            ]" in text


@pytest.mark.parametrize("model", ["tiny", "qwen35-122b", "dense"])
def test_stock_release_cannot_shape_the_turboquant_layers(reports: Dict[str, Dict[str, Any]], model: str) -> None:
    """The e2e failure, reproduced by vLLM's own code, on every model kind (no layer is skipped
    on the hybrids: the TurboQuant layers themselves get "auto")."""
    for dtype in DTYPES:
        got = reports["stock"][f"{model}/{dtype}"]
        assert got["error"] == ("ValueError: Unknown TurboQuant cache dtype: 'auto'. Valid presets: "
                                + ", ".join(DTYPES)), (dtype, got)
        tq = [v for v in got["layers"].values() if v["backend"] == "TURBOQUANT"]
        assert tq and all(v["kv_quant_mode"] == "NONE" and v["spec"] == "TQFullAttentionSpec" for v in tq)


@pytest.mark.parametrize("model", ["tiny", "qwen35-122b"])
def test_hybrid_caches_get_the_packed_shape_and_exactly_their_allocation(reports: Dict[str, Dict[str, Any]],
                                                                         model: str) -> None:
    for dtype in DTYPES:
        got = reports["mod"][f"{model}/{dtype}"]
        assert "error" not in got and got["skip"] == [], (dtype, got)  # hybrid: no boundary layers
        slot = SLOT[256][dtype]
        layers = got["layers"]
        assert {v["backend"] for v in layers.values()} == {"TURBOQUANT"}
        assert len(got["caches"]) == len(layers) == {"tiny": 3, "qwen35-122b": 12}[model]
        for name, cache in got["caches"].items():
            page = layers[name]["page_size_bytes"]
            block = page // (2 * slot)
            assert page == block * 2 * slot, (name, page)
            assert cache["shape"] == [BLOCKS, 2, block, slot] and cache["dtype"] == "torch.uint8", (name, cache)
            assert cache["bytes"] == cache["allocated"] == BLOCKS * page, (name, cache)


def test_dense_boundary_layers_keep_the_default_backend_and_bf16_shape(reports: Dict[str, Dict[str, Any]]) -> None:
    for dtype in DTYPES:
        got = reports["mod"][f"dense/{dtype}"]
        assert "error" not in got and got["skip"] == ["0", "1", "6", "7"], (dtype, got)
        boundary, quantised = got["layers"]["model.layers.0.self_attn.attn"], got["layers"]["model.layers.3.self_attn.attn"]
        assert boundary["backend"] != "TURBOQUANT" and boundary["kv_cache_dtype"] == "auto"
        assert quantised["backend"] == "TURBOQUANT" and quantised["kv_cache_dtype"] == dtype
        for name in ("model.layers.0.self_attn.attn", "model.layers.3.self_attn.attn", "model.layers.7.self_attn.attn"):
            cache, page = got["caches"][name], got["layers"][name]["page_size_bytes"]
            assert cache["bytes"] == cache["allocated"] == BLOCKS * page, (name, cache)
        assert got["caches"]["model.layers.3.self_attn.attn"]["shape"][-1] == SLOT[128][dtype]
        assert got["caches"]["model.layers.0.self_attn.attn"]["dtype"] == "torch.bfloat16"


@pytest.mark.parametrize("dtype", DTYPES)
def test_turboquant_layers_run_our_kernels_on_the_cache_vllm_shaped(reports: Dict[str, Dict[str, Any]],
                                                                     dtype: str) -> None:
    """Upstream's backend class (its spec and its (blocks, heads, block_size, slot) cache) with our
    impl and builder: a prefill and a decode step through them match the packed format's reference
    read from the same bytes, the runner's tensor viewed as dense pages."""
    assert_forward_matches_reference(reports["mod"][f"tiny/{dtype}"]["forward"])
