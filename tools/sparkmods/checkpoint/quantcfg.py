"""What a checkpoint's `quantization_config` says, in the terms vLLM reads it.

vLLM maps `quant_method: auto-round` to its INC config; a layer's bit width comes from
`extra_config` (exact module name first, then keys containing regex characters, searched),
else from `block_name_to_quantize` (outside those blocks: 16 bit), else `bits`.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from sparkmods.checkpoint.fp8 import declared_block

AUTOROUND_METHODS = frozenset({"auto-round", "auto_round", "intel/auto-round"})
_REGEX_CHARS = set(r"*+?^$()[]{}|\\")


def method(qc: Mapping[str, Any] | None) -> str | None:
    value = (qc or {}).get("quant_method")
    return value.lower() if isinstance(value, str) else None


def is_autoround(qc: Mapping[str, Any] | None) -> bool:
    return method(qc) in AUTOROUND_METHODS


def autoround_bits(qc: Mapping[str, Any], module: str) -> int:
    """Bit width vLLM's INC config gives `module` (a checkpoint module name)."""
    default = qc.get("bits", 4)
    extra = qc.get("extra_config") or {}
    if module in extra:
        return int(extra[module].get("bits", default))
    for pattern, cfg in extra.items():
        if not any(c in _REGEX_CHARS for c in pattern):
            continue
        try:
            if re.search(pattern, module):
                return int(cfg.get("bits", default))
        except re.error:
            continue
    blocks = qc.get("block_name_to_quantize") or qc.get("to_quant_block_names")
    if isinstance(blocks, str):
        blocks = blocks.split(",")
    if blocks and not any(module.startswith(b) for b in blocks):
        return 16
    return int(default)


def describe(qc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The settings that matter for the mods, as a small JSON-able dict."""
    if not qc:
        return None
    out: dict[str, Any] = {"quant_method": method(qc)}
    if is_autoround(qc):
        extra = qc.get("extra_config") or {}
        out.update(
            bits=qc.get("bits"),
            group_size=qc.get("group_size"),
            sym=qc.get("sym"),
            packing_format=qc.get("packing_format", "auto_round:auto_gptq"),
            extra_config_16bit=sum(1 for cfg in extra.values() if cfg.get("bits") == 16),
        )
    elif method(qc) == "fp8":
        block = declared_block(qc)
        out.update(
            fmt=qc.get("fmt"),
            activation_scheme=qc.get("activation_scheme"),
            weight_block_size=list(block) if block else None,
        )
    return out
