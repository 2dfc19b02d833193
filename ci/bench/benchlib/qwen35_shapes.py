"""The two full-size Qwen3.5-MoE models the served benchmark and the Spark estimate are about.

Dimensions are those of the public Hugging Face configs (text_config of Qwen/Qwen3.5-35B-A3B and
Qwen/Qwen3.5-122B-A10B): every fourth layer full attention (head_dim 256, 2 KV heads, query plus
output gate), the rest Gated DeltaNet (16 key heads, 32 or 64 value heads of 128), 256 routed
experts of which 8 per token plus one shared expert, vocabulary 248320, one MTP layer, DeltaNet
state in float32. Tensor names and storage (Intel's AutoRound INT4: routed experts and attention
projections INT4, shared experts, router gates and in_proj_a/b 16 bit) come from
tests/ckptfactory.py, which the tiny GPU model and the checkpoint tests already use, so one list of
tensors feeds the served model's config, its safetensors headers and the byte model.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))  # ckptfactory: names, shapes, configs

from ckptfactory import Shape, autoround_config, model_config

FIRST_SPECIAL_ID = 248044  # Qwen's special tokens start here in the real vocabulary (248320 ids)


@dataclass(frozen=True)
class Model:
    """One public model: its shape, routing and the sizes its name states (billions)."""

    key: str
    repo: str
    shape: Shape
    experts_per_token: int
    total_b: float
    active_b: float


MODELS: dict[str, Model] = {
    "35b-a3b": Model(
        "35b-a3b", "Qwen/Qwen3.5-35B-A3B",
        Shape(num_layers=40, hidden=2048, num_experts=256, moe_intermediate=512, shared_intermediate=512,
              vocab=248320, num_heads=16, num_kv_heads=2, head_dim=256, linear_key_heads=16,
              linear_value_heads=32, linear_head_dim=128, conv_kernel=4, full_attention_interval=4,
              mtp_layers=1, vision=False),
        experts_per_token=8, total_b=35, active_b=3,
    ),
    "122b-a10b": Model(
        "122b-a10b", "Qwen/Qwen3.5-122B-A10B",
        Shape(num_layers=48, hidden=3072, num_experts=256, moe_intermediate=1024, shared_intermediate=1024,
              vocab=248320, num_heads=32, num_kv_heads=2, head_dim=256, linear_key_heads=16,
              linear_value_heads=64, linear_head_dim=128, conv_kernel=4, full_attention_interval=4,
              mtp_layers=1, vision=False),
        experts_per_token=8, total_b=122, active_b=10,
    ),
}

# The vision tower is never built (servers run with --language-model-only); the config still
# needs one for Qwen3_5MoeForConditionalGeneration to parse.
_VISION = {
    "model_type": "qwen3_5_moe", "depth": 1, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2,
    "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
    "num_position_embeddings": 64, "hidden_act": "gelu_pytorch_tanh", "deepstack_visual_indexes": [],
}


def config_json(model: Model, ids: Mapping[str, int]) -> dict[str, object]:
    """config.json of Intel's INT4 AutoRound checkpoint of `model`; ids: special token -> id."""
    s = model.shape
    cfg = model_config(s, autoround_config(s))
    cfg["text_config"].update({
        "num_experts_per_tok": model.experts_per_token, "norm_topk_prob": True, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "attn_output_gate": True,
        "attention_bias": False, "tie_word_embeddings": False, "mamba_ssm_dtype": "float32",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        "torch_dtype": "bfloat16", "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
    })
    cfg["vision_config"] = {**_VISION, "out_hidden_size": s.hidden}
    cfg.update({
        "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    })
    return cfg
