"""Probe run by test_mod_turboquant_shape.py under a real vLLM 0.25-0.26 (stock, or with the mod).

Not a pytest module: `python mod_turboquant_shape_probe.py JOB.json` in the vLLM venv
(overlay site first on PYTHONPATH when the mod is applied) prints one PROBE-REPORT line.

For each model and TurboQuant dtype it runs what `vllm serve --kv-cache-dtype DTYPE` runs up to
the KV-cache tensors: the engine config (boundary layers), vLLM's Attention layer for every
full-attention layer (backend, spec, KVQuantMode), vLLM's grouping of those specs, and then the
GPU model runner's own `_allocate_kv_cache_tensors` and `_reshape_kv_cache_tensors` on the CPU
(under the current vLLM config, as the worker calls them). The runner object carries only the
attributes those two methods read; every value in it comes from vLLM's own code above.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probekit import emit

NUM_BLOCKS = 4


def _layer_prefix(model_type: str, index: int) -> str:
    head = "language_model.model" if model_type == "qwen3_5_moe" else "model"
    return f"{head}.layers.{index}.self_attn.attn"


def _cuda_backend(priorities: List[str], kv_cache_dtype: str) -> Any:
    """The first backend of CUDA's priority list whose class takes this cache dtype: the
    criterion that sends TurboQuant layers to TURBOQUANT and kept layers to FLASH_ATTN on a GPU
    (vllm.platforms.cuda itself cannot be imported without libcuda)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    for name in priorities:
        cls = AttentionBackendEnum[name].get_class()
        if cls.supports_kv_cache_dtype(kv_cache_dtype):
            return cls
    raise ValueError(f"no backend of {priorities} takes {kv_cache_dtype}")


def _attention_layers(cfg: Any, model: Dict[str, Any], priorities: List[str], no_skip: bool = False) -> Dict[str, Any]:
    """vLLM's Attention layer at each full-attention index, on the backend a GPU would pick
    for the cache dtype vLLM's own skip-layer rule gave the layer."""
    import torch
    from vllm.model_executor.layers.attention import Attention

    torch.set_default_dtype(torch.bfloat16)
    out = {}
    for i in model["attention"]:
        prefix = _layer_prefix(model["model_type"], i)
        args = dict(num_heads=model["heads"], head_size=model["head_size"], scale=model["head_size"] ** -0.5,
                    num_kv_heads=model["kv_heads"], cache_config=cfg.cache_config)
        # the layer's cache dtype by vLLM's own skip-layer rule; on a hybrid model no layer is
        # skipped, and vLLM 0.33's CPU platform refuses to pick a backend for a TurboQuant dtype
        given = {"attn_backend": _cuda_backend(priorities, cfg.cache_config.cache_dtype)} if no_skip else {}
        dtype = Attention(**args, prefix=prefix + ".dtype", **given).kv_cache_dtype
        out[prefix] = Attention(**args, prefix=prefix, attn_backend=_cuda_backend(priorities, dtype))
    return out


def _attention_groups(gid: int, group: Any, layers: Dict[str, Any]) -> List[Any]:
    """The runner's attention groups of one KV-cache group (initialize_attn_backend's rule: one
    per backend and per layer spec, the layer's own spec taken out of UniformTypeKVCacheSpecs)."""
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs
    from vllm.v1.worker.utils import AttentionGroup

    by_key: Dict[Any, Any] = {}
    for name in group.layer_names:
        spec = group.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            spec = spec.kv_cache_specs[name]
        backend = layers[name].attn_backend
        by_key.setdefault((backend.full_cls_name(), spec), AttentionGroup(backend, [], spec, gid)).layer_names.append(name)
    return list(by_key.values())


def _shape(cfg: Any, layers: Dict[str, Any], forward: bool = False) -> Dict[str, Any]:
    """The runner's allocation and reshape of these layers' KV caches."""
    import torch
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheTensor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    specs = {name: layer.get_kv_cache_spec(cfg) for name, layer in layers.items()}
    groups = get_kv_cache_groups(cfg, specs)
    tensors = [KVCacheTensor(size=NUM_BLOCKS * specs[name].page_size_bytes, shared_by=[name]) for name in specs]
    runner = object.__new__(GPUModelRunner)
    runner.device, runner.cache_config, runner.runner_only_attn_layers = torch.device("cpu"), cfg.cache_config, set()
    runner.kv_cache_config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=tensors, kv_cache_groups=groups)
    runner.attn_groups = [_attention_groups(gid, g, layers) for gid, g in enumerate(groups)]
    out: Dict[str, Any] = {
        "layers": {name: {"backend": layer.attn_backend.get_name(), "kv_cache_dtype": layer.kv_cache_dtype,
                          "spec": type(specs[name]).__name__, "kv_quant_mode": specs[name].kv_quant_mode.name,
                          "page_size_bytes": specs[name].page_size_bytes} for name, layer in layers.items()},
        "groups": [{"spec": type(g.kv_cache_spec).__name__, "layers": len(g.layer_names)} for g in groups],
    }
    try:
        raw = runner._allocate_kv_cache_tensors(runner.kv_cache_config)
        caches = runner._reshape_kv_cache_tensors(raw, [g.kv_cache_spec.block_size for g in groups])
    except Exception as exc:  # noqa: BLE001 - the test asserts on the message
        out["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return out
    out["caches"] = {name: {"shape": list(t.shape), "dtype": str(t.dtype), "bytes": t.numel() * t.element_size(),
                            "allocated": raw[name].numel()} for name, t in caches.items()}
    if forward:
        name = next(n for n, layer in layers.items() if layer.attn_backend.get_name() == "TURBOQUANT")
        out["forward"] = _forward(cfg, layers[name], specs[name], caches[name])
    return out


def _forward(cfg: Any, layer: Any, spec: Any, cache: Any) -> Dict[str, Any]:
    """One prefill of two requests and one decode step through the impl vLLM built for the layer
    and the builder its backend names, on the cache tensor the runner shaped; each output row
    against the packed format's reference over the same bytes (TRITON_INTERPRET=1: on the CPU)."""
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.sparkmods_turboquant import pages, warm_up_shape
    from vllm.v1.attention.ops import sparkmods_tq_format as fmt

    impl, backend = layer.impl, layer.attn_backend
    builder = backend.get_builder_cls()(spec, ["l"], cfg, torch.device("cpu"))
    torch.manual_seed(0)
    heads, hkv, head = impl.num_heads, impl.num_kv_heads, impl.head_size
    view = pages(cache, hkv)
    block = view.shape[1]
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    scale = head ** -0.5
    tq = fmt.tq_spec(layer.kv_cache_dtype)

    def step(query_lens: List[int], seq_lens: List[int]) -> Dict[str, Any]:
        qsl = torch.tensor([0] + list(torch.tensor(query_lens).cumsum(0)), dtype=torch.int32)
        n = int(qsl[-1])
        slots = torch.cat([table[r, torch.arange(s - q, s) // block].long() * block + torch.arange(s - q, s) % block
                           for r, (q, s) in enumerate(zip(query_lens, seq_lens))])
        common = CommonAttentionMetadata(
            query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            num_reqs=len(seq_lens), num_actual_tokens=n, max_query_len=max(query_lens), max_seq_len=max(seq_lens),
            block_table_tensor=table, slot_mapping=slots)
        meta = builder.build(0, common)
        # vLLM hands the layer flat [tokens, heads * head] projections and a flat output buffer
        q = torch.randn(n, heads * head).to(torch.bfloat16)
        k, v = torch.randn(n, hkv * head).to(torch.bfloat16), torch.randn(n, hkv * head).to(torch.bfloat16)
        if not backend.forward_includes_kv_cache_update:  # as vLLM's attention layer decides
            impl.do_kv_cache_update(layer, k, v, cache, slots)
        out = torch.full((n, heads * head), float("nan"), dtype=torch.bfloat16)
        impl.forward(layer, q, k, v, cache, meta, output=out)
        worst = 0.0
        for r, (ql, sl) in enumerate(zip(query_lens, seq_lens)):
            for i in range(ql):
                t, length = int(qsl[r]) + i, sl - ql + 1 + i
                ref = fmt.ref_decode(q[t:t + 1].view(1, heads, head), view, table[r:r + 1], [length], scale, tq)
                worst = max(worst, float((out[t].view(heads, head).float() - ref[0].float()).abs().max()))
        return {"num_decode_tokens": meta.num_decode_tokens, "max_abs_err": worst,
                "finite": bool(torch.isfinite(out).all())}

    prefill = step([block + 3, 5], [block + 3, 5])
    warm = warm_up_shape(spec, cfg)
    with_mtp = SimpleNamespace(**{name: getattr(cfg, name) for name in (
        "model_config", "cache_config", "parallel_config", "scheduler_config")},
        speculative_config=SimpleNamespace(num_speculative_tokens=2))
    return {"impl": f"{type(impl).__module__}.{type(impl).__name__}", "builder": type(builder).__name__,
            "stores_in_forward": backend.forward_includes_kv_cache_update, "prefill": prefill, "decode": step([1, 1], [block + 4, 6]),
            "warm_up": {**warm, "spec": warm["spec"].name, "dtype": str(warm["dtype"]),
                        "max_batch_with_2_speculative": warm_up_shape(spec, with_mtp)["max_batch"]},
            "layer": {"heads": heads, "kv_heads": hkv, "head": head, "block": block, "kv_cache_dtype": layer.kv_cache_dtype,
                      "max_model_len": cfg.model_config.max_model_len, "max_num_seqs": cfg.scheduler_config.max_num_seqs}}


def _layout_forward(cfg: Any, layers: Dict[str, Any]) -> Dict[str, Any]:
    """vLLM 0.29+: no per-backend cache shape; the backend declares a KVCacheLayout and each layer
    gets the logical (blocks, heads, block_size, slot) view of memory in the layout's order. The
    cache is made that way for the first TurboQuant layer, then one prefill and one decode step."""
    import torch

    name, layer = next((n, la) for n, la in layers.items() if la.attn_backend.get_name() == "TURBOQUANT")
    spec = layer.attn_backend.customize_spec(layer.get_kv_cache_spec(cfg))  # the backend packs its page
    layout = layer.attn_backend.supported_kv_cache_layouts()[0]
    # a hybrid model's attention page is padded to the DeltaNet state page: the slot's bytes are
    # the spec's content, the rest of each page is padding
    logical = (4, layer.num_kv_heads, spec.block_size, spec.state_content_bytes)
    order = layout.layer_view_order  # physical axis order of the logical 4-D view
    used = layer.num_kv_heads * spec.block_size * spec.state_content_bytes
    pages = torch.zeros(4, spec.page_size_bytes, dtype=torch.uint8)[:, :used]
    cache = pages.view(4, *[logical[i] for i in order[1:]]).permute(*[order.index(i) for i in range(4)])
    assert tuple(cache.shape) == logical
    return {"layer": name, "layout": layout.name, "page_size_bytes": spec.page_size_bytes, "content": used,
            "forward": _forward(cfg, layer, spec, cache), "subclass": _subclass(layer.attn_backend)}


def _subclass(backend: type) -> Dict[str, Any]:
    """A backend for another cache built on this one, as 0.33's ULTRAQUANT is (importing that needs
    a CUDA Triton): its impl and whether it stores in forward. The mod changes both for TURBOQUANT
    only; a subclass keeps upstream's impl, which needs vLLM's separate store call."""

    class Other(backend):  # type: ignore[misc, valid-type]
        @staticmethod
        def get_name() -> str:
            return "OTHERQUANT"

    impl = Other.get_impl_cls()
    return {"impl": f"{impl.__module__}.{impl.__name__}", "stores_in_forward": Other.forward_includes_kv_cache_update}


def main(argv: List[str]) -> int:
    (job,) = json.loads(Path(argv[0]).read_text(encoding="utf-8"))["cases"]
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()  # no CUDA here; the code probed is platform-neutral
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs

    report: Dict[str, Any] = {}
    for name, model in job["models"].items():
        for dtype in job["dtypes"]:
            cfg = EngineArgs(model=model["path"], kv_cache_dtype=dtype, skip_tokenizer_init=True, enforce_eager=True,
                             max_model_len=4096).create_engine_config()
            with set_current_vllm_config(cfg):
                layers = _attention_layers(cfg, model, job["cuda_priorities"], no_skip=bool(job.get("layout_forward")))
                if job.get("layout_forward"):
                    report[f"{name}/{dtype}"] = _layout_forward(cfg, layers)
                    continue
                got = _shape(cfg, layers, forward=name in job.get("forward", []))
            got["skip"] = list(cfg.cache_config.kv_cache_dtype_skip_layers)
            report[f"{name}/{dtype}"] = got
    emit(report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
