"""hybrid-int4-fp8: the checkpoint analysis of the module the mod adds to vLLM (fast tier).

The module is taken from the mod's own new-file patch and imported without vLLM (it only
imports vLLM inside the hooks), then fed real safetensors headers of ckptfactory
checkpoints. What it does inside vLLM is test_mod_hybrid_runtime.py's job.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import ModuleType
from typing import Any, Dict

import pytest

import ckptfactory as cf
from realmods import assert_all_exact, load_patched_module

MOD = Path(__file__).resolve().parents[1] / "mods" / "hybrid-int4-fp8"
PATCH = MOD / "patches" / "common" / "sparkmods_hybrid_fp8.patch"
SHARED = [f"model.language_model.layers.{i}.mlp.shared_expert.{p}"
          for i in range(cf.Shape().num_layers) for p in ("gate_proj", "up_proj", "down_proj")]


def headers(root: Path) -> Dict[str, Any]:
    """name -> header entry for every .safetensors file in root, as vLLM's helper returns them."""
    merged: Dict[str, Any] = {}
    for path in sorted(root.glob("*.safetensors")):
        with open(path, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            merged.update(json.loads(fh.read(size)))
    return merged


@pytest.fixture(scope="module")
def hyb(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return load_patched_module(PATCH, tmp_path_factory.mktemp("module"), "sparkmods_hybrid_fp8")


@pytest.fixture(scope="module")
def hybrid_headers(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """Default Shape: shared intermediate 192, so every FP8 scale has a partial last block."""
    s = cf.Shape()
    root = tmp_path_factory.mktemp("hybrid")
    cf.write_checkpoint(root, cf.main_specs(s, attn="int4", experts="int4", shared="fp8"),
                        config=cf.model_config(s, cf.autoround_config(s)),
                        extra_files={"model_extra_tensors.safetensors": cf.mtp_specs(s)}, index_extra=False)
    return headers(root)


def test_finds_exactly_the_fp8_shared_experts(hyb: ModuleType, hybrid_headers: Dict[str, Any]) -> None:
    found = hyb.find_fp8_layers(hybrid_headers)
    assert sorted(found) == sorted(SHARED)  # INT4, BF16, MTP and __metadata__ entries are not
    assert found["model.language_model.layers.0.mlp.shared_expert.gate_proj"] == ([192, 256], [2, 2])
    assert found["model.language_model.layers.0.mlp.shared_expert.down_proj"] == ([256, 192], [2, 2])


def test_block_size_survives_partial_last_blocks(hyb: ModuleType, hybrid_headers: Dict[str, Any]) -> None:
    # 192 rows in 2 blocks: floor and ceil division both say 96; the real block is 128
    assert hyb.block_size(hyb.find_fp8_layers(hybrid_headers)) == (128, 128)
    assert hyb.block_size({"a": ([192, 256], [2, 2])}) == (128, 128)


def test_block_size_that_is_not_a_power_of_two(hyb: ModuleType) -> None:
    assert hyb.block_size({"a": ([960, 480], [10, 5])}) == (96, 96)
    assert hyb.block_size({"a": ([64, 64], [1, 1])}) == (64, 64)


def test_disagreeing_layers_name_both(hyb: ModuleType) -> None:
    with pytest.raises(ValueError, match=r"axis 0 of (a|b) .* and (a|b) "):
        hyb.block_size({"a": ([256, 256], [2, 2]), "b": ([512, 256], [2, 2])})
    with pytest.raises(ValueError, match="axis 0 of a "):
        hyb.block_size({"a": ([10, 10], [9, 1])})  # no block size gives 9 blocks of 10 rows


def test_only_2d_block_scales_count(hyb: ModuleType) -> None:
    per_tensor = {"x.weight": {"dtype": "F8_E4M3", "shape": [128, 128]},
                  "x.weight_scale_inv": {"dtype": "F32", "shape": [1]}}
    with pytest.raises(ValueError, match=r"x: float8 weight .* expected 2-D block scales"):
        hyb.find_fp8_layers(per_tensor)
    too_many = {"x.weight": {"dtype": "F8_E4M3", "shape": [4, 4]},
                "x.weight_scale_inv": {"dtype": "F32", "shape": [8, 1]}}
    with pytest.raises(ValueError, match="one per block"):
        hyb.find_fp8_layers(too_many)
    # no scale sibling, or not float8: not a block-FP8 layer at all
    assert hyb.find_fp8_layers({"y.weight": {"dtype": "F8_E4M3", "shape": [4, 4]},
                                "z.weight": {"dtype": "BF16", "shape": [4, 4]},
                                "z.weight_scale_inv": {"dtype": "F32", "shape": [1, 1]}}) == {}


def test_fused_layers_are_named_by_their_shards(hyb: ModuleType) -> None:
    packed = {"gate_up_proj": ["gate_proj", "up_proj"], "qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    assert hyb.shard_names("m.layers.0.mlp.shared_expert.gate_up_proj", packed) == [
        "m.layers.0.mlp.shared_expert.gate_proj", "m.layers.0.mlp.shared_expert.up_proj"]
    assert hyb.shard_names("m.layers.0.mlp.shared_expert.down_proj", packed) == [
        "m.layers.0.mlp.shared_expert.down_proj"]
    assert hyb.shard_names("qkv_proj", packed) == ["q_proj", "k_proj", "v_proj"]
    # exact names only: a module merely containing a fused name is not fused
    assert hyb.shard_names("m.my_gate_up_proj", packed) == ["m.my_gate_up_proj"]


@pytest.mark.parametrize("setting, capability, mode", [
    (None, (9, 0), "bf16"),          # H100/H200: the FP8 kernels lose to bf16 there
    ("", (9, 0), "bf16"),
    (" AUTO ", (9, 0), "bf16"),
    ("auto", (12, 1), "fp8"),        # DGX Spark (GB10)
    ("auto", (10, 0), "fp8"),        # not measured: the mod's own path
    ("auto", (8, 9), "fp8"),
    ("auto", None, "fp8"),           # no GPU known
    ("fp8", (9, 0), "fp8"),          # forced either way
    ("bf16", (12, 1), "bf16"),
])
def test_compute_mode_by_setting_and_gpu(hyb: ModuleType, setting: Any, capability: Any, mode: str) -> None:
    got, why = hyb.compute_mode(setting, capability)
    assert got == mode
    assert why.startswith(f"{hyb.COMPUTE_ENV}=")
    if capability is not None and (setting or "").strip().lower() in ("", "auto"):
        assert f"compute capability {capability[0]}.{capability[1]}" in why


@pytest.mark.parametrize("setting", ["int4", "fp16", "bf16,fp8", "1"])
def test_compute_mode_refuses_unknown_settings(hyb: ModuleType, setting: str) -> None:
    with pytest.raises(ValueError, match=r"^sparkmods hybrid-int4-fp8: SPARKMODS_HYBRID_FP8_COMPUTE=.*auto, fp8, bf16"):
        hyb.compute_mode(setting, (9, 0))


@pytest.mark.network
def test_every_release_gets_an_exact_variant() -> None:
    """sparkmods check over every release >= 0.18.0: each hunk applies at its stated line."""
    assert_all_exact(MOD)


