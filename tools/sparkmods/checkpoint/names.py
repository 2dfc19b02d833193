"""Qwen3.5-MoE checkpoint tensor names (as vLLM's qwen3_5*.py / qwen3_next.py load them).

Exact patterns, never substrings: `mlp.shared_expert_gate` must not pass for
`mlp.shared_expert`, and the MTP head's own shared expert is not a decoder layer's.
"""

from __future__ import annotations

import re

# Intel's AutoRound Qwen3.5 checkpoints ship the MTP head in this extra file.
MTP_FILE = "model_extra_tensors.safetensors"
MTP_PREFIX = "mtp."
# Decoder-layer shared-expert projections (multimodal `model.language_model.` layout or
# the text-only `model.` one).
SHARED_EXPERT_WEIGHT = re.compile(
    r"^model\.(?:language_model\.)?layers\.\d+\.mlp\.shared_expert\.(?:gate|up|down)_proj\.weight$"
)

_GROUPS: list[tuple[str, re.Pattern[str]]] = [
    ("MTP head", re.compile(r"^mtp\.")),
    ("vision tower", re.compile(r"^model\.visual\.")),
    ("routed experts", re.compile(r"\.mlp\.experts\.")),
    ("shared-expert projections", re.compile(r"\.mlp\.shared_expert\.(?:gate|up|down)_proj\.")),
    ("shared-expert gates", re.compile(r"\.mlp\.shared_expert_gate\.")),
    ("router gates", re.compile(r"\.mlp\.gate\.")),
    ("Gated DeltaNet in_proj_a/b", re.compile(r"\.linear_attn\.in_proj_[ab]\.")),
    ("Gated DeltaNet conv/decay", re.compile(r"\.linear_attn\.(?:conv1d\.|dt_bias$|A_log$)")),
    ("norms", re.compile(r"norm\.weight$")),
    ("Gated DeltaNet projections", re.compile(r"\.linear_attn\.")),
    ("full-attention projections", re.compile(r"\.self_attn\.")),
    ("embeddings and LM head", re.compile(r"(?:embed_tokens|^lm_head)\.")),
]


def group(name: str) -> str:
    """A short label for the part of the model a tensor belongs to (for plan reports)."""
    for label, pattern in _GROUPS:
        if pattern.search(name):
            return label
    return "other"
