"""Probe for test_mod_hybrid_runtime.py, run by the python of a venv where vLLM is installed.

`python tests/mod_hybrid_probe.py JOB.json` reads {"cases": [{"name", "checkpoint",
"map": [names], "layers": [...], "env": {...}, "load": [...]}]} and prints one line `PROBE-REPORT {json}`, per case: what
the release's INCConfig, built by vLLM's own
VllmConfig from the checkpoint (so `maybe_update_config` runs as in `vllm serve`) and given
the model class's name mapper and fused-module table (vLLM's `configure_quant_config`),
decides for each layer. It holds no tests (pytest does not collect it). Top-level imports
are stdlib only.

Layers are real vLLM objects with the module names the Qwen3.5-MoE model gives them. They
are built unquantized on the meta device and then handed to `get_quant_method`, the call
every LinearBase makes in its constructor. Routed experts are built for real with the INC
config (FusedMoE, later FusedMoEFactory). Some releases pick the FP8 or INT4 *kernel* in the
method's constructor, and a machine without a GPU has none; the dispatch, which is what the
mod changes, has happened by then. In that case the report describes the method whose
constructor raised (found in the traceback: its class and its quant_config's FP8 block size)
and adds the error.

Layer kinds: merged (MergedColumnParallelLinear: input, outputs), row (RowParallelLinear:
input, output), replicated (ReplicatedLinear: input, output), torch (torch.nn.Linear, not
a vLLM LinearBase), experts (experts, top_k, input, intermediate). The report's "layers"
list follows the job's.

A case's "env" is set while vLLM builds its config (the mod reads its settings then). Each of
its "load" layers (merged or row, plus "shards": the checkpoint modules it loads) is built for
real on the CPU with the INC config, its FP8 weights and scales are loaded from the checkpoint
through the parameters' own weight loaders, vLLM's post-load step runs, and one forward pass is
compared with the product computed here from the stored bytes, block by block.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Dict, List

from probekit import LogLines, emit, free_port

MOD_LOGGER = "vllm.model_executor.layers.quantization.sparkmods_hybrid_fp8"
STATE_ATTR = "_sparkmods_hybrid_fp8"


def _build(spec: Dict[str, Any]) -> Any:
    import torch
    from vllm.model_executor.layers.linear import (
        MergedColumnParallelLinear,
        ReplicatedLinear,
        RowParallelLinear,
    )

    kind = spec["kind"]
    with torch.device("meta"):
        if kind == "merged":
            return MergedColumnParallelLinear(spec["input"], spec["outputs"], bias=False,
                                              quant_config=None, prefix=spec["prefix"])
        if kind == "row":
            return RowParallelLinear(spec["input"], spec["output"], bias=False,
                                     quant_config=None, prefix=spec["prefix"])
        if kind == "replicated":
            return ReplicatedLinear(spec["input"], spec["output"], bias=False,
                                    quant_config=None, prefix=spec["prefix"])
        if kind == "torch":
            return torch.nn.Linear(spec["input"], spec["output"], bias=False)
    raise ValueError(f"unknown layer kind {kind!r}")


def _experts(config: Any, spec: Dict[str, Any]) -> Dict[str, Any]:
    """Build the routed experts with the INC config, as the MoE block does."""
    import torch
    from vllm.model_executor.layers import fused_moe

    make = getattr(fused_moe, "FusedMoEFactory", None) or fused_moe.FusedMoE
    out: Dict[str, Any] = {"layer": getattr(make, "__name__", str(make))}


    def build() -> Any:
        with torch.device("meta"):
            layer = make(num_experts=spec["experts"], top_k=spec["top_k"], hidden_size=spec["input"],
                         intermediate_size=spec["intermediate"], quant_config=config, prefix=spec["prefix"])
        return getattr(layer, "routed_experts", layer).quant_method  # 0.26+ wraps them in a MoERunner

    out.update(_outcome(build))
    return out


def _started(tb: Any) -> Any:
    """The quantization method whose constructor the traceback passes through, if any."""
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    for frame, _ in traceback.walk_tb(tb):
        obj = frame.f_locals.get("self")
        if frame.f_code.co_name == "__init__" and isinstance(obj, QuantizeMethodBase):
            return obj
    return None


def _describe(method: Any) -> Dict[str, Any]:
    """Class, FP8 block size and FP8-serialized flag of a (possibly half-built) method."""
    config = getattr(method, "quant_config", None)
    block = getattr(config, "weight_block_size", None)
    return {
        "method": type(method).__name__ if method is not None else None,
        "block": list(block) if block is not None else None,
        "checkpoint_fp8": getattr(config, "is_checkpoint_fp8_serialized", None),
    }


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _outcome(call: Any) -> Dict[str, Any]:
    """What call returns; or the error it raises and the method it was constructing then."""
    try:
        return _describe(call())
    except Exception as exc:  # noqa: BLE001 - the probe reports any error of vLLM's to the test
        out = _describe(_started(exc.__traceback__))
        out["error"] = _first_line(exc)
        return out


def _decide(config: Any, spec: Dict[str, Any]) -> Dict[str, Any]:
    """The patched decision, and INC's own (`_inc_get_quant_method`) when the mod is in."""
    if spec["kind"] == "experts":
        return _experts(config, spec)
    layer = _build(spec)
    prefix = spec["prefix"]
    out: Dict[str, Any] = {"layer": type(layer).__name__, "bits": config.get_layer_config(layer, prefix)[0]}
    out.update(_outcome(lambda: config.get_quant_method(layer, prefix)))
    original = getattr(config, "_inc_get_quant_method", None)
    if original is not None:
        out["inc"] = _outcome(lambda: original(layer, prefix))
    return out


def _tensors(checkpoint: str, names: List[str]) -> Dict[str, Any]:
    from safetensors import safe_open

    found: Dict[str, Any] = {}
    for path in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            held = set(fh.keys())
            found.update({name: fh.get_tensor(name) for name in names if name in held})
    return found


def _reference(weight: Any, scale: Any, block: List[int]) -> Any:
    """float32 weight of stored block-FP8 bytes, one block at a time."""
    out = weight.float()
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            out[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]] *= scale[i, j]
    return out


def _load(config: Any, spec: Dict[str, Any], checkpoint: str) -> Dict[str, Any]:
    """Build, load, process and run one layer for real; how far its output is from the reference."""
    import torch
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear

    if spec["kind"] == "merged":
        layer = MergedColumnParallelLinear(spec["input"], spec["outputs"], bias=False, quant_config=config,
                                           params_dtype=torch.bfloat16, prefix=spec["prefix"])
    else:
        layer = RowParallelLinear(spec["input"], spec["output"], bias=False, quant_config=config,
                                  params_dtype=torch.bfloat16, prefix=spec["prefix"])
    stored = _tensors(checkpoint, [f"{m}.{p}" for m in spec["shards"] for p in ("weight", "weight_scale_inv")])
    block = list(getattr(config, STATE_ATTR).block)
    refs = []
    for shard, module in enumerate(spec["shards"]):
        weight, scale = stored[f"{module}.weight"], stored[f"{module}.weight_scale_inv"]
        for name, tensor in (("weight", weight), ("weight_scale_inv", scale)):
            param = getattr(layer, name)
            if spec["kind"] == "merged":
                param.weight_loader(param, tensor, shard)
            else:
                param.weight_loader(param, tensor)
        refs.append(_reference(weight, scale, block))
    layer.quant_method.process_weights_after_loading(layer)
    x = torch.randn(3, spec["input"], generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    expected = x.float() @ torch.cat(refs).t()
    out = layer(x)
    got = (out[0] if isinstance(out, tuple) else out).float()
    return {
        "method": type(layer.quant_method).__name__,
        "scale_kept": hasattr(layer, "weight_scale_inv"),
        "weight_dtype": str(layer.weight.dtype) if isinstance(getattr(layer, "weight", None), torch.Tensor) else None,
        "max_error": float((got - expected).abs().max() / expected.abs().max()),
    }


def _case(case: Dict[str, Any]) -> Dict[str, Any]:
    saved = {key: os.environ.get(key) for key in case.get("env", {})}
    os.environ.update(case.get("env", {}))
    try:
        return _case_in_env(case)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _case_in_env(case: Dict[str, Any]) -> Dict[str, Any]:
    from vllm.config import DeviceConfig, LoadConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized
    from vllm.model_executor.model_loader.utils import configure_quant_config, get_model_architecture

    lines = LogLines()
    logging.getLogger(MOD_LOGGER).addHandler(lines)
    logging.getLogger(MOD_LOGGER).setLevel(logging.INFO)
    model_config = ModelConfig(model=case["checkpoint"], dtype="bfloat16", enforce_eager=True)
    try:
        vllm_config = VllmConfig(model_config=model_config, load_config=LoadConfig(),
                                 device_config=DeviceConfig(device="cpu"))
    except Exception as exc:  # noqa: BLE001 - the probe reports any error of vLLM's to the test
        return {"error": f"{type(exc).__name__}: {exc}", "log": lines.lines}  # whole: pydantic wraps it
    finally:
        logging.getLogger(MOD_LOGGER).removeHandler(lines)
    config = vllm_config.quant_config
    report: Dict[str, Any] = {"config": type(config).__name__, "layers": [], "log": lines.lines}
    with set_current_vllm_config(vllm_config):
        if not model_parallel_is_initialized():
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
            initialize_model_parallel(1, 1)
        model_class, report["arch"] = get_model_architecture(model_config)
        configure_quant_config(config, model_class)
        mapper = model_class.hf_to_vllm_mapper
        report["mapped"] = {name: mapper._map_name(name) for name in case.get("map", [])}
        state = getattr(config, STATE_ATTR, None)
        report["state"] = None if state is None else {"layers": sorted(state.layers), "block": list(state.block)}
        for spec in case.get("layers", []):
            report["layers"].append(_decide(config, spec))
        report["load"] = [_outcome_of_load(config, spec, case["checkpoint"]) for spec in case.get("load", [])]
    return report


def _outcome_of_load(config: Any, spec: Dict[str, Any], checkpoint: str) -> Dict[str, Any]:
    try:
        return _load(config, spec, checkpoint)
    except Exception as exc:  # noqa: BLE001 - the probe reports any error of vLLM's to the test
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return {"error": f"{_first_line(exc)} ({Path(where.filename).name}:{where.lineno})"}


def main(argv: List[str]) -> int:
    job = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    report = {case["name"]: _case(case) for case in job["cases"]}
    emit(report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
