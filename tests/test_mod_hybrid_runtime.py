"""hybrid-int4-fp8 at work in real vLLM releases (marker vllm_runtime: installs vLLM).

For the newest release each variant was verified on (or the one vLLM and mods folder the
nightly heal names: vllmenv.runtime_releases, runtime_mods): install it from PyPI (vllmenv, cached),
apply the mod to a private copy of its site-packages with the mod's own run.sh, and run
mod_hybrid_probe.py under that release's python on tiny Qwen3.5-MoE checkpoints from
ckptfactory. The probe builds INCConfig through vLLM's VllmConfig (so the mod's
maybe_update_config hook reads the checkpoint as in `vllm serve`), maps names with the model
class's own mapper and asks get_quant_method about real layer objects; it also reports
INC's own answer (`_inc_get_quant_method`, the original method the mod wraps) for each.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List

import pytest

import ckptfactory as cf
from probekit import run_job
from vllmenv import run_sh, runtime_mods, runtime_releases, vllm_env

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.vllm_runtime

MOD = runtime_mods() / "hybrid-int4-fp8"
PROBE = Path(__file__).resolve().parent / "mod_hybrid_probe.py"
SHAPE = replace(cf.Shape(), shared_intermediate=384)  # vLLM's FP8 merged layers need n*128 outputs
COMPUTE_ENV = "SPARKMODS_HYBRID_FP8_COMPUTE"
BASE = "language_model.model.layers"  # Qwen3_5MoeForConditionalGeneration's module names
H, SI = SHAPE.hidden, SHAPE.shared_intermediate
# Releases whose INC routes INT4 experts to these methods (Marlin, MoE-WNA16 or AutoGPTQ MoE).
INT4_MOE_METHODS = {"GPTQMarlinMoEMethod", "MoeWNA16Method", "AutoGPTQMoEMethod"}
# Without a GPU some releases fail inside a method's constructor, choosing its kernel; the
# probe then reports that method and the error (see mod_hybrid_probe.py).


def newest_verified() -> List[str]:
    """The newest verified release of every variant in the manifest."""
    manifest = tomllib.loads((MOD / "mod.toml").read_text(encoding="utf-8"))
    return [variant["verified"][-1] for variant in manifest["variant"]]


def layers() -> List[Dict[str, Any]]:
    shared = f"{BASE}.3.mlp.shared_expert"
    return [
        {"prefix": f"{shared}.gate_up_proj", "kind": "merged", "input": H, "outputs": [SI, SI]},
        {"prefix": f"{shared}.down_proj", "kind": "row", "input": SI, "output": H},
        {"prefix": f"{BASE}.0.mlp.shared_expert.gate_up_proj", "kind": "merged", "input": H, "outputs": [SI, SI]},
        {"prefix": f"{BASE}.1.mlp.shared_expert.gate_up_proj", "kind": "merged", "input": H, "outputs": [SI, SI]},
        {"prefix": f"{BASE}.0.linear_attn.in_proj_ba", "kind": "merged", "input": H, "outputs": [4, 4]},
        {"prefix": f"{shared}.down_proj", "kind": "torch", "input": SI, "output": H},
        {"prefix": f"{BASE}.3.self_attn.o_proj", "kind": "row", "input": H, "output": H},
        {"prefix": f"{BASE}.3.mlp.experts", "kind": "experts", "experts": SHAPE.num_experts, "top_k": 2,
         "input": H, "intermediate": SHAPE.moe_intermediate},
    ]


def write_hybrid(root: Path, bf16_up_proj_of_layer1: bool = False) -> Path:
    """AutoRound INT4 checkpoint whose shared experts are block FP8 (one shard BF16 if asked)."""
    specs = cf.main_specs(SHAPE, attn="int4", experts="int4", shared="fp8")
    if bf16_up_proj_of_layer1:
        up = "model.language_model.layers.1.mlp.shared_expert.up_proj"
        specs = [s for s in specs if not s.name.startswith(up + ".")]
        specs += cf._linear(up, SI, H, "bf16")
    return cf.write_checkpoint(root, specs, config=cf.model_config(SHAPE, cf.autoround_config(SHAPE)),
                               extra_files={"model_extra_tensors.safetensors": cf.mtp_specs(SHAPE)},
                               index_extra=False)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    base = tmp_path_factory.mktemp("hybrid-ckpt")
    return {
        "hybrid": write_hybrid(base / "hybrid"),
        "partial": write_hybrid(base / "partial", bf16_up_proj_of_layer1=True),
        "int4": cf.write_int4_autoround(base / "int4", SHAPE, mtp="indexed"),
    }


def run_probe(version: str, tmp: Path, checkpoints: Dict[str, Path]) -> Dict[str, Any]:
    env = vllm_env(version)
    site = env.overlay(tmp / "site")
    applied = run_sh(MOD, site, tmp / "workspace")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "applied variant" in applied.stdout, applied.stdout
    again = run_sh(MOD, site, tmp / "workspace")
    assert again.returncode == 0 and "already applied" in again.stdout, again.stdout + again.stderr
    cases = [{"name": name, "checkpoint": str(path), "layers": layers(),
              "map": ["model.language_model.layers.3.mlp.shared_expert.gate_proj.weight"]}
             for name, path in checkpoints.items()]
    shared = "model.language_model.layers.3.mlp.shared_expert"
    cases.append({"name": "bf16", "checkpoint": str(checkpoints["hybrid"]), "layers": layers(),
                  "env": {COMPUTE_ENV: "bf16"}, "load": [
                      {"prefix": f"{BASE}.3.mlp.shared_expert.gate_up_proj", "kind": "merged", "input": H,
                       "outputs": [SI, SI], "shards": [f"{shared}.gate_proj", f"{shared}.up_proj"]},
                      {"prefix": f"{BASE}.3.mlp.shared_expert.down_proj", "kind": "row", "input": SI,
                       "output": H, "shards": [f"{shared}.down_proj"]}]})
    cases.append({"name": "bad-setting", "checkpoint": str(checkpoints["hybrid"]), "env": {COMPUTE_ENV: "int4"}})
    return run_job(env, PROBE, cases, tmp, site)


@pytest.fixture(scope="module", params=runtime_releases(newest_verified))
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           checkpoints: Dict[str, Path]) -> Dict[str, Any]:
    return run_probe(request.param, tmp_path_factory.mktemp(f"hybrid-{request.param}"), checkpoints)


def by_prefix(case: Dict[str, Any], prefix: str, kind: str = "") -> Dict[str, Any]:
    specs = layers()
    for spec, result in zip(specs, case["layers"]):
        if spec["prefix"] == prefix and (not kind or spec["kind"] == kind):
            return result
    raise KeyError(prefix)


def test_scan_finds_every_shared_expert_and_the_block_size(report: Dict[str, Any]) -> None:
    case = report["hybrid"]
    assert case["config"] == "INCConfig"
    # maybe_update_config ran, and apply_vllm_mapper renamed the layers to vLLM's names
    assert case["mapped"] == {"model.language_model.layers.3.mlp.shared_expert.gate_proj.weight":
                              f"{BASE}.3.mlp.shared_expert.gate_proj.weight"}
    expected = {f"{BASE}.{i}.mlp.shared_expert.{p}" for i in range(SHAPE.num_layers)
                for p in ("gate_proj", "up_proj", "down_proj")}
    assert case["state"] == {"layers": sorted(expected), "block": [128, 128]}
    assert len(case["log"]) == 1 and "12 block-FP8 layers" in case["log"][0], case["log"]
    assert "use vLLM's FP8 linear method" in case["log"][0], case["log"]  # auto with no GPU known: FP8


def test_shared_experts_get_vllms_fp8_method(report: Dict[str, Any]) -> None:
    case = report["hybrid"]
    for prefix, kind in [(f"{BASE}.3.mlp.shared_expert.gate_up_proj", "merged"),
                         (f"{BASE}.3.mlp.shared_expert.down_proj", "row"),
                         (f"{BASE}.0.mlp.shared_expert.gate_up_proj", "merged")]:
        got = by_prefix(case, prefix, kind)
        assert got["bits"] == 16
        assert (got["method"], got["block"], got["checkpoint_fp8"]) == ("Fp8LinearMethod", [128, 128], True), got
        # an error here can only be the FP8 kernel this CPU lacks, met inside Fp8LinearMethod
        assert "sparkmods" not in got.get("error", ""), got
        assert got["inc"]["method"] == "UnquantizedLinearMethod", got  # what stock INC would do


def test_other_layers_keep_incs_choice(report: Dict[str, Any]) -> None:
    case = report["hybrid"]
    ba = by_prefix(case, f"{BASE}.0.linear_attn.in_proj_ba")
    assert ba["bits"] == 16 and ba["method"] == ba["inc"]["method"] == "UnquantizedLinearMethod", ba
    # not a vLLM LinearBase: never FP8, whatever its name
    plain = by_prefix(case, f"{BASE}.3.mlp.shared_expert.down_proj", "torch")
    assert plain["method"] == plain["inc"]["method"] and plain["method"] in (None, "UnquantizedLinearMethod"), plain
    # an INT4 dense layer: same answer (or the same missing-kernel error) as INC's
    o_proj = by_prefix(case, f"{BASE}.3.self_attn.o_proj")
    assert o_proj["bits"] == 4 and {k: o_proj[k] for k in o_proj["inc"]} == o_proj["inc"], o_proj
    experts = by_prefix(case, f"{BASE}.3.mlp.experts")
    assert experts["method"] in INT4_MOE_METHODS, experts


def test_half_fp8_fused_layer_is_a_clear_error(report: Dict[str, Any]) -> None:
    got = by_prefix(report["partial"], f"{BASE}.1.mlp.shared_expert.gate_up_proj")
    assert got["error"].startswith("ValueError: sparkmods hybrid-int4-fp8:"), got
    assert "make all of its shards FP8 or none" in got["error"], got
    assert by_prefix(report["partial"], f"{BASE}.3.mlp.shared_expert.gate_up_proj")["method"] == "Fp8LinearMethod"


def test_plain_int4_checkpoint_is_untouched(report: Dict[str, Any], checkpoints: Dict[str, Path]) -> None:
    case = report["int4"]
    assert case["state"] is None
    assert case["log"] == [f"sparkmods hybrid-int4-fp8: no block-FP8 layers in {checkpoints['int4']}"]
    got = by_prefix(case, f"{BASE}.3.mlp.shared_expert.gate_up_proj")
    assert got["method"] == got["inc"]["method"] == "UnquantizedLinearMethod", got


def test_bf16_setting_loads_fp8_and_computes_its_dequantisation(report: Dict[str, Any]) -> None:
    case = report["bf16"]
    assert len(case["log"]) == 1 and "12 block-FP8 layers" in case["log"][0], case["log"]
    assert f"compute in bf16, dequantised at load ({COMPUTE_ENV}=bf16;" in case["log"][0], case["log"]
    for prefix, kind in [(f"{BASE}.3.mlp.shared_expert.gate_up_proj", "merged"),
                         (f"{BASE}.3.mlp.shared_expert.down_proj", "row")]:
        got = by_prefix(case, prefix, kind)
        assert got["method"] == "SparkmodsDequantizedFp8LinearMethod" and "error" not in got, got
    # in_proj_ba is bf16 in the checkpoint: INC's answer stands whatever the setting
    ba = by_prefix(case, f"{BASE}.0.linear_attn.in_proj_ba")
    assert ba["method"] == "UnquantizedLinearMethod", ba
    # loaded through vLLM's own weight loaders (fused shards, partial last blocks), then bf16 only
    for loaded in case["load"]:
        assert "error" not in loaded, loaded
        assert loaded["method"] == "SparkmodsDequantizedFp8LinearMethod" and not loaded["scale_kept"], loaded
        assert loaded["weight_dtype"] in ("torch.bfloat16", None), loaded  # None: the CPU GEMM repacked it
        assert loaded["max_error"] < 0.02, loaded  # bf16 rounding of weights and product, not a wrong block


def test_unknown_setting_stops_the_config_with_its_name(report: Dict[str, Any]) -> None:
    error = report["bad-setting"]["error"]
    assert f"{COMPUTE_ENV}='int4' is not one of auto, fp8, bf16" in error, error
