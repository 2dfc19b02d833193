"""Probe run by test_mod_turboquant_runtime.py under a real vLLM 0.18-0.19 with the mod applied.

Not a pytest module: `python mod_turboquant_probe.py JOB.json` in the vLLM venv, with the
overlay site first on PYTHONPATH, prints one PROBE-REPORT line. vLLM on this CPU-only machine
has no platform, so the probe installs vLLM's own CPU platform first (the engine config path,
the backend selector and the KV-cache spec code are platform-neutral).

Every step reports what vLLM itself returned; the test side decides. The forward step runs
the backend's impl through its metadata builder with TRITON_INTERPRET=1 (the Triton kernels on
CPU) and compares against the PyTorch reference of the packed format.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probekit import LogLines, emit, free_port

MOD_LOGGER = "vllm.v1.attention.backends.sparkmods_turboquant"


def _cpu_platform() -> None:
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()


def _engine(model: str, dtype: str) -> Dict[str, Any]:
    """create_engine_config as `vllm serve --kv-cache-dtype dtype` runs it (arg_utils hook)."""
    from vllm.engine.arg_utils import EngineArgs

    lines = LogLines()
    logging.getLogger(MOD_LOGGER).addHandler(lines)
    try:
        cfg = EngineArgs(model=model, kv_cache_dtype=dtype, skip_tokenizer_init=True, enforce_eager=True,
                         max_model_len=4096).create_engine_config()
    except Exception as exc:  # noqa: BLE001 - the test asserts on the message
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0], "log": lines.lines}
    finally:
        logging.getLogger(MOD_LOGGER).removeHandler(lines)
    cache = cfg.cache_config
    return {"log": lines.lines, "skip": list(cache.kv_cache_dtype_skip_layers), "block_size": cache.block_size,
            "mamba_page_size_padded": cache.mamba_page_size_padded, "config": cfg}


def _cache_dtypes(names: List[str]) -> Dict[str, str]:
    from vllm.config import CacheConfig

    out = {}
    for name in names:
        try:
            out[name] = CacheConfig(cache_dtype=name).cache_dtype
        except Exception as exc:  # noqa: BLE001 - the probe reports any error of vLLM's to the test
            out[name] = "error: " + f"{type(exc).__name__}".splitlines()[0]
    return out


def _layers(vllm_config: Any, head_size: int, prefixes: List[str]) -> Dict[str, Any]:
    """vLLM's Attention layer for each prefix: backend, spec type and page size at block 16."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention

    out: Dict[str, Any] = {}
    cache = vllm_config.cache_config
    lines = LogLines()  # what the mod's backend selection says, as a server log shows it
    logging.getLogger(MOD_LOGGER).addHandler(lines)
    try:
        with set_current_vllm_config(vllm_config):
            torch.set_default_dtype(torch.bfloat16)
            for prefix in prefixes:
                layer = Attention(num_heads=8, head_size=head_size, scale=head_size ** -0.5, num_kv_heads=2,
                                  cache_config=cache, prefix=prefix)
                cache.block_size = 16
                spec = layer.get_kv_cache_spec(vllm_config)
                out[prefix] = {"backend": layer.attn_backend.get_name(), "impl": type(layer.impl).__name__,
                               "kv_cache_dtype": layer.kv_cache_dtype, "spec": type(spec).__name__,
                               "page_size_bytes": spec.page_size_bytes, "dtype": str(spec.dtype)}
    finally:
        logging.getLogger(MOD_LOGGER).removeHandler(lines)
    out["selection_log"] = lines.lines
    return out


def _unify(engine: Dict[str, Any], attn: Dict[str, Any]) -> Dict[str, Any]:
    """The hybrid model's Mamba state pages and our attention pages through vLLM's grouping."""
    from vllm.model_executor.models.qwen3_5 import Qwen3_5MoeForConditionalGeneration as Model
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups
    from vllm.v1.core.single_type_kv_cache_manager import spec_manager_map
    from vllm.v1.kv_cache_interface import MambaSpec

    cfg = engine["config"]
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(cfg):
        mamba = MambaSpec(shapes=Model.get_mamba_state_shape_from_config(cfg),
                          dtypes=Model.get_mamba_state_dtype_from_config(cfg), block_size=cfg.cache_config.block_size,
                          page_size_padded=cfg.cache_config.mamba_page_size_padded)
        specs = {f"language_model.model.layers.{i}.linear_attn": mamba for i in (0, 1, 2)}
        specs.update(attn)
        groups = get_kv_cache_groups(cfg, specs)
    return {"groups": [{"spec": type(g.kv_cache_spec).__name__, "page": g.kv_cache_spec.page_size_bytes,
                        "block": g.kv_cache_spec.block_size, "layers": len(g.layer_names)} for g in groups],
            "manager": spec_manager_map[type(next(iter(attn.values())))].__name__,
            "mamba_raw": mamba.page_size_bytes}


def _attention_specs(engine: Dict[str, Any], head_size: int) -> Dict[str, Any]:
    from vllm.v1.attention.backends.sparkmods_turboquant import kv_cache_spec

    class Layer:  # what kv_cache_spec reads from vLLM's Attention layer
        sliding_window = None
        num_kv_heads = 2
        head_size_v = head_size
        kv_cache_dtype = engine["config"].cache_config.cache_dtype
        layer_name = "language_model.model.layers.3.self_attn.attn"

    Layer.head_size = head_size
    return {f"language_model.model.layers.{i}.self_attn.attn": kv_cache_spec(Layer, 16) for i in (3, 7)}


def _forward(case: Dict[str, Any]) -> Dict[str, Any]:
    """Prefill two requests, then one decode step with a speculative-decode request, through
    TurboQuantMetadataBuilder + TurboQuantImpl; compare with the packed format's reference."""
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends import sparkmods_turboquant as tq
    from vllm.v1.attention.ops import sparkmods_tq_format as fmt

    torch.manual_seed(0)
    dtype, head, hq, hkv, block = case["kv_cache_dtype"], case["head_size"], 4, 2, 16
    spec = fmt.tq_spec(dtype)
    cfg = _engine(case["dense_model"], dtype)["config"]
    kv_spec = tq.TurboQuantAttentionSpec(block_size=block, num_kv_heads=hkv, head_size=head, dtype=torch.uint8,
                                         slot_bytes=fmt.slot_bytes(spec, head))
    builder = tq.TurboQuantMetadataBuilder(kv_spec, ["l"], cfg, torch.device("cpu"))
    # what _init_reorder_batch_threshold sets with 3 speculative tokens: queries of up to 4 decode
    builder.reorder_batch_threshold = 4
    impl = tq.TurboQuantImpl(hq, head, head ** -0.5, hkv, kv_cache_dtype=dtype)
    cache = torch.zeros(tq.TurboQuantBackend.get_kv_cache_shape(8, block, hkv, head, dtype), dtype=torch.uint8)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)

    def step(query_lens: List[int], seq_lens: List[int]) -> Dict[str, Any]:
        qsl = torch.tensor([0] + list(torch.tensor(query_lens).cumsum(0)), dtype=torch.int32)
        n = int(qsl[-1])
        slots = torch.cat([table[r, (torch.arange(s - q, s) // block)].long() * block + torch.arange(s - q, s) % block
                           for r, (q, s) in enumerate(zip(query_lens, seq_lens))])
        common = CommonAttentionMetadata(
            query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            num_reqs=len(seq_lens), num_actual_tokens=n, max_query_len=max(query_lens), max_seq_len=max(seq_lens),
            block_table_tensor=table[:len(seq_lens)], slot_mapping=slots)
        meta = builder.build(0, common)
        q = torch.randn(n, hq, head).to(torch.bfloat16)
        k, v = torch.randn(n, hkv, head).to(torch.bfloat16), torch.randn(n, hkv, head).to(torch.bfloat16)
        out = torch.full((n, hq, head), float("nan"), dtype=torch.bfloat16)
        if not tq.TurboQuantBackend.forward_includes_kv_cache_update:  # as vLLM's attention layer decides
            impl.do_kv_cache_update(None, k, v, cache, slots)
        impl.forward(None, q, k, v, cache, meta, output=out)
        # reference: every query token attends causally to the dequantised cache of its request
        worst = 0.0
        for r, (ql, sl) in enumerate(zip(query_lens, seq_lens)):
            for i in range(ql):
                t, length = int(qsl[r]) + i, sl - ql + 1 + i
                ref = fmt.ref_decode(q[t:t + 1], cache, table[r:r + 1], [length], head ** -0.5, spec)
                worst = max(worst, float((out[t].float() - ref[0].float()).abs().max()))
        return {"num_decodes": meta.num_decodes, "num_decode_tokens": meta.num_decode_tokens,
                "prefill": meta.prefill_cu_seqlens_k is not None, "max_abs_err": worst,
                "finite": bool(torch.isfinite(out).all())}

    return {"prefill": step([20, 7], [20, 7]), "decode": step([1, 3], [21, 10]),
            "mixed": step([1, 6], [22, 16])}


def main(argv: List[str]) -> int:
    (job,) = json.loads(Path(argv[0]).read_text(encoding="utf-8"))["cases"]
    _cpu_platform()
    report: Dict[str, Any] = {"cache_dtypes": _cache_dtypes(job["cache_dtypes"]), "engine": {}, "layers": {}}
    for name, model in job["models"].items():
        for dtype in job["engine_dtypes"]:
            got = _engine(model, dtype)
            cfg = got.pop("config", None)
            report["engine"][f"{name}/{dtype}"] = got
            if cfg is not None and dtype == job["engine_dtypes"][0]:
                head = job["head_sizes"][name]
                report["layers"][name] = _layers(cfg, head, job["layer_prefixes"][name])
    hybrid = _engine(job["models"]["hybrid"], job["engine_dtypes"][0])
    report["unify"] = _unify(hybrid, _attention_specs(hybrid, job["head_sizes"]["hybrid"]))
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    report["enum"] = AttentionBackendEnum["TURBOQUANT"].get_class().__name__
    from vllm.distributed import init_distributed_environment

    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
    report["forward"] = {c["kv_cache_dtype"] + f"/{c['head_size']}": _forward({**c, **job})
                         for c in job["forward"]}
    emit(report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
