"""Config-only model folders the turboquant runtime tests hand to vLLM: a hybrid Qwen3.5-MoE (DeltaNet
and every 4th layer full attention, head 256, 2 KV heads) and a dense Qwen3 (head 128), and the
KV-cache dtypes the mod adds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

DTYPES = ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"]
HYBRID_LAYERS = 8  # full attention at 3 and 7


def hybrid_config() -> Dict[str, Any]:
    """Qwen3.5-122B-A10B's attention and DeltaNet dimensions on 8 layers (config.json only)."""
    text = {
        "model_type": "qwen3_5_moe_text", "num_hidden_layers": HYBRID_LAYERS, "hidden_size": 512,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128, "vocab_size": 1024, "num_attention_heads": 8,
        "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 64,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4, "mtp_num_hidden_layers": 1, "max_position_embeddings": 4096,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(HYBRID_LAYERS)],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10]},
    }
    return {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe", "text_config": text}


def dense_config() -> Dict[str, Any]:
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 8,
            "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 128, "vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def model_dir(root: Path, config: Dict[str, Any]) -> str:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(root)


def assert_forward_matches_reference(forward: Dict[str, Any]) -> None:
    """A probe's prefill and decode step through our impl and builder (mod_turboquant_shape_probe's
    _forward): the classes upstream's backend names, and every output row within bf16 rounding of
    the packed format's reference (outputs up to ~4)."""
    assert forward["impl"] == "vllm.v1.attention.backends.sparkmods_turboquant.TurboQuantImpl"
    assert forward["builder"] == "TurboQuantMetadataBuilder"
    # the impl stores in forward (no do_kv_cache_update), so vLLM must not call a separate store
    assert forward["stores_in_forward"] is True
    assert forward["prefill"]["num_decode_tokens"] == 0 and forward["decode"]["num_decode_tokens"] == 2
    for name in ("prefill", "decode"):
        assert forward[name]["finite"], name
        assert forward[name]["max_abs_err"] <= 0.04, (name, forward[name])
    # the builder's start-up warm-up reads this release's config: the layer the impl serves, the
    # server's limits (probes run max_model_len 4096), the model's dtype
    warm, layer = forward["warm_up"], forward["layer"]
    assert (warm["num_q_heads"], warm["num_kv_heads"], warm["head_size"]) == (layer["heads"], layer["kv_heads"], layer["head"])
    assert (warm["spec"], warm["block_size"]) == (layer["kv_cache_dtype"], layer["block"])
    # every capacity a table row may have: 4096 in the layer's pages (and in 128-token steps), more
    # where vLLM allocates larger blocks for a hybrid model
    assert layer["max_model_len"] == 4096 == min(warm["table_tokens"]) and warm["max_batch"] == layer["max_num_seqs"] > 1
    assert all(t % layer["block"] == 0 and t < 2 * 4096 for t in warm["table_tokens"]), warm["table_tokens"]
    assert warm["max_batch_with_2_speculative"] == 3 * layer["max_num_seqs"]  # a decode row per query token
    assert warm["dtype"] == "torch.bfloat16"

