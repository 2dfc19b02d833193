#!/usr/bin/env python3
"""Write a tiny Qwen3.5-MoE checkpoint that vLLM and transformers load as the real architecture.

    python3 ci/gpu/tiny_qwen35.py --out DIR --variant bf16|hybrid|dequant [--mtp indexed|extra|none] [--peaked]

The model is `Qwen3_5MoeForConditionalGeneration` (model_type qwen3_5_moe) with the real
tensor names (tests/ckptfactory.py, checked against vLLM 0.21.0's loader by
tests/test_gpu_model_builder.py): 12 decoder layers, every fourth one full attention (layers 3,
7, 11; the other 9 Gated DeltaNet), so a TurboQuant cache has full-attention layers to compress
under either boundary rule (0.21's hybrid rule skips none; a first/last rule on 3 layers still
leaves one); 8 routed experts (2 per token) plus a shared expert with its gate; head_dim 256 and
2 KV heads as Qwen3.5 has; hidden 512 and all projection widths multiples of 128 so the INT4
(GPTQ-Marlin) and block-FP8 kernels take them; a one-layer MTP head. The vision config is a
small one-block tower; serve with `--language-model-only` (the mods do not touch vision, and the
checkpoint holds no vision weights).

Variants:
- bf16:    every weight bf16.
- hybrid:  what `sparkmods checkpoint build-hybrid` makes of Intel's AutoRound checkpoint:
           INT4 GPTQ-packed routed experts and attention/DeltaNet projections, block-FP8
           shared experts (weight + weight_scale_inv, 128x128), the rest bf16, and Intel's
           quantization_config (shared experts and in_proj_a/b listed as 16-bit).
- dequant: bf16, holding exactly the hybrid variant's dequantised weights: the reference
           whose greedy output the hybrid model must reproduce.
MTP head (`--mtp`): in the index (indexed), in model_extra_tensors.safetensors that the index
does not list (extra: what vLLM ignores unless the mtp-weights mod is applied), or none.
`--peaked` makes greedy decoding follow a known permutation (tiny_weights.py); the map and the
token ids the end-to-end test needs are written to tiny_qwen35.json beside the weights.
Same seed, same weights: bf16, hybrid and dequant builds of one seed share their float weights.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Mapping

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parents[1] / "tests"))  # tests/ckptfactory.py: names and writer

try:
    import torch

    from ckptfactory import Shape, Spec, autoround_config, main_specs, model_config, mtp_specs, write_checkpoint
    from tiny_quant import block_fp8, gptq_int4
    from tiny_tokenizer import EOS, PAD, SCRIPT, SPECIAL, build_tokenizer, write_tokenizer
    from tiny_weights import float_weights, permutation
except ImportError as exc:  # pragma: no cover - depends on the machine
    sys.exit(f"tiny_qwen35.py: cannot import {exc.name}: needs torch, numpy, safetensors and tokenizers "
             "(vLLM's own requirements; put vLLM's site-packages on PYTHONPATH)")

SHAPE = Shape(
    num_layers=12, hidden=512, num_experts=8, moe_intermediate=256, shared_intermediate=512,
    vocab=640, num_heads=4, num_kv_heads=2, head_dim=256, linear_key_heads=2,
    linear_value_heads=4, linear_head_dim=128, conv_kernel=4, full_attention_interval=4,
    mtp_layers=1, vision=False,
)
EXPERTS_PER_TOKEN = 2
MANIFEST = "tiny_qwen35.json"
MTP_FILE = "model_extra_tensors.safetensors"
VARIANTS = ("bf16", "hybrid", "dequant")
MTP_MODES = ("indexed", "extra", "none")
SHARD_BYTES = 64 << 20


def text_extras(ids: Mapping[str, int]) -> dict[str, object]:
    """Keys of Qwen3.5's text_config beyond the layout ckptfactory writes."""
    return {
        "num_experts_per_tok": EXPERTS_PER_TOKEN,
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "attn_output_gate": True,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "rope_parameters": {
            "rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10], "mrope_interleaved": True,
        },
        "torch_dtype": "bfloat16",
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[PAD],
    }


def model_json(variant: str, ids: Mapping[str, int]) -> dict[str, object]:
    """config.json: architecture, text/vision configs, token ids, quantization for hybrid."""
    cfg = model_config(SHAPE, autoround_config(SHAPE) if variant == "hybrid" else {})
    if variant != "hybrid":
        del cfg["quantization_config"]
    cfg["text_config"].update(text_extras(ids))
    cfg["vision_config"] = {
        "model_type": "qwen3_5_moe", "depth": 1, "hidden_size": 128, "intermediate_size": 256,
        "num_heads": 2, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
        "temporal_patch_size": 2, "out_hidden_size": SHAPE.hidden, "num_position_embeddings": 64,
        "hidden_act": "gelu_pytorch_tanh", "deepstack_visual_indexes": [],
    }
    cfg.update({
        "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    })
    return cfg


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _bf16(t: torch.Tensor) -> bytes:
    return _raw(t.to(torch.bfloat16))


def quantised_modules() -> dict[str, str]:
    """module name -> "int4" or "fp8": the hybrid variant's non-bf16 layers."""
    kinds = {}
    for spec in main_specs(SHAPE, attn="int4", experts="int4", shared="fp8"):
        if spec.name.endswith(".qweight"):
            kinds[spec.name[: -len(".qweight")]] = "int4"
        elif spec.dtype == "F8_E4M3":
            kinds[spec.name[: -len(".weight")]] = "fp8"
    return kinds


def tensor_data(variant: str, specs: list[Spec], floats: Mapping[str, torch.Tensor]) -> dict[str, bytes]:
    """Bytes of every spec: bf16 floats, or the hybrid's INT4/FP8 storage, or its dequantised twin."""
    data: dict[str, bytes] = {}
    for module, kind in ([] if variant == "bf16" else quantised_modules().items()):
        w = floats[module + ".weight"]
        if kind == "int4":
            q = gptq_int4(w)
            parts = {".qweight": _raw(q.qweight), ".qzeros": _raw(q.qzeros), ".scales": _raw(q.scales)}
        else:
            q = block_fp8(w)
            parts = {".weight": _raw(q.weight), ".weight_scale_inv": _raw(q.scale_inv)}
        if variant == "dequant":
            parts = {".weight": _bf16(q.dequant)}
        data.update({module + suffix: raw for suffix, raw in parts.items()})
    for spec in specs:
        if spec.name not in data:
            t = floats[spec.name]
            data[spec.name] = _raw(t.float()) if spec.dtype == "F32" else _bf16(t)
    return data


def design(tok) -> dict[str, object]:
    """Token roles for the peaked map: ordinary ids, the newline + script chain."""
    base = tok.get_vocab_size(with_added_tokens=False)
    newline = tok.token_to_id("\u010a")  # byte-level BPE's symbol for "\n"
    ordinary = [i for i in range(base) if i != newline]
    chain = [newline] + [tok.token_to_id(piece) for piece in SCRIPT]
    return {"ordinary": ordinary, "chain": chain, "newline_id": newline}


def build(out: Path, variant: str, mtp: str, peaked: bool, seed: int = 0) -> dict[str, object]:
    """Write the checkpoint into out (a new folder, renamed into place when complete)."""
    tok = build_tokenizer()
    roles = design(tok)
    f = permutation(SHAPE.vocab, roles["ordinary"], roles["chain"], seed) if peaked else None
    bf16_main = main_specs(SHAPE, attn="bf16", experts="bf16", shared="bf16")
    mtp_list = mtp_specs(SHAPE) if mtp != "none" else []
    floats = float_weights({s.name: s.shape for s in bf16_main + mtp_list}, f, seed)
    specs = main_specs(SHAPE, attn="int4", experts="int4", shared="fp8") if variant == "hybrid" else bf16_main
    data = tensor_data(variant, specs + mtp_list, floats)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    ids = {name: tok.token_to_id(name) for name in SPECIAL}
    write_checkpoint(
        tmp, specs, config=model_json(variant, ids), shard_bytes=SHARD_BYTES,
        extra_files={MTP_FILE: mtp_list} if mtp_list else None, index_extra=mtp == "indexed", data=data,
    )
    special_ids = write_tokenizer(tmp, tok)
    generation = {"bos_token_id": special_ids[PAD], "eos_token_id": [special_ids[EOS], special_ids[PAD]],
                  "pad_token_id": special_ids[PAD]}
    (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    manifest = {
        "variant": variant, "mtp": mtp, "peaked": peaked, "seed": seed, "shape": asdict(SHAPE),
        "experts_per_token": EXPERTS_PER_TOKEN, "tokenizer_size": tok.get_vocab_size(),
        "special_ids": special_ids, **roles, "f": f,
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write (must not exist unless --force)")
    parser.add_argument("--variant", choices=VARIANTS, default="bf16")
    parser.add_argument("--mtp", choices=MTP_MODES, default="indexed")
    parser.add_argument("--peaked", action="store_true", help="greedy decoding follows a known permutation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="replace an existing --out")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.force:
        print(f"tiny_qwen35.py: {args.out} exists; pass --force to replace it", file=sys.stderr)
        return 2
    if not args.out.parent.is_dir():
        print(f"tiny_qwen35.py: {args.out.parent} is not a folder; create it first", file=sys.stderr)
        return 2
    manifest = build(args.out, args.variant, args.mtp, args.peaked, args.seed)
    print(f"tiny_qwen35.py: wrote {args.variant} (mtp {args.mtp}, {'peaked' if args.peaked else 'random'}, "
          f"seed {args.seed}, vocab {SHAPE.vocab}, tokenizer {manifest['tokenizer_size']}) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
