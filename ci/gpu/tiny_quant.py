"""Real quantisation of the tiny model's weights, in the two storage formats of a hybrid checkpoint.

- AutoRound INT4, GPTQ packing (what Intel's Qwen3.5 AutoRound checkpoints hold and vLLM's INC
  config reads): symmetric 4-bit with one fp16 scale per group of 128 input features and output
  column; the integer q in [0, 15] stands for (q - 8) * scale. `qweight` [in/8, out] int32 holds
  eight consecutive input rows per word, row 8i+j in bits 4j..4j+3; `qzeros` [in/128, out/8]
  holds the zero point 8 stored as 7 in every nibble (the GPTQ convention tests/ckptfactory.py
  documents); `scales` [in/128, out] fp16.
- Block FP8 (Qwen's FP8 checkpoints): float8_e4m3fn weight and one float32 `weight_scale_inv`
  per 128x128 block (value = fp8 * scale_inv), the block's absmax mapped to 448.

Each function also returns the dequantised float32 weight, so the reference bf16 model can hold
exactly what the quantised kernels compute with.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

GROUP = 128
BLOCK = 128
FP8_MAX = 448.0
_INT4_MAX = 7


class Gptq(NamedTuple):
    qweight: torch.Tensor  # int32 [in/8, out]
    qzeros: torch.Tensor  # int32 [in/GROUP, out/8]
    scales: torch.Tensor  # float16 [in/GROUP, out]
    dequant: torch.Tensor  # float32 [out, in]


class BlockFp8(NamedTuple):
    weight: torch.Tensor  # float8_e4m3fn [out, in]
    scale_inv: torch.Tensor  # float32 [ceil(out/BLOCK), ceil(in/BLOCK)]
    dequant: torch.Tensor  # float32 [out, in]


def gptq_int4(w: torch.Tensor) -> Gptq:
    """Quantise a float [out, in] weight to symmetric INT4 with GPTQ packing."""
    out_f, in_f = w.shape
    if in_f % GROUP or out_f % 8:
        raise ValueError(f"INT4 needs in % {GROUP} == 0 and out % 8 == 0, got {tuple(w.shape)}")
    groups = w.float().reshape(out_f, in_f // GROUP, GROUP)
    scale = (groups.abs().amax(dim=2) / _INT4_MAX).clamp_min(1e-8).to(torch.float16)  # [out, G]
    scale32 = scale.float().unsqueeze(2)
    q = torch.clamp(torch.round(groups / scale32), -_INT4_MAX - 1, _INT4_MAX)
    dequant = (q * scale32).reshape(out_f, in_f)
    nibbles = (q + 8).to(torch.int64).reshape(out_f, in_f).t().reshape(in_f // 8, 8, out_f)
    shifts = (4 * torch.arange(8, dtype=torch.int64)).view(1, 8, 1)
    words = (nibbles << shifts).sum(dim=1)
    qweight = _to_int32(words)
    zero_word = sum(7 << (4 * j) for j in range(8))
    qzeros = torch.full((in_f // GROUP, out_f // 8), zero_word, dtype=torch.int64)
    return Gptq(qweight, _to_int32(qzeros), scale.t().contiguous(), dequant)


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """Reinterpret non-negative int64 values < 2**32 as int32 bit patterns."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def gptq_unpack(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float [out, in] weight a GPTQ symmetric INT4 layer stands for (qzeros = 8 - 1)."""
    words = qweight.to(torch.int64) & 0xFFFFFFFF
    in8, out_f = words.shape
    shifts = (4 * torch.arange(8, dtype=torch.int64)).view(1, 8, 1)
    q = ((words.unsqueeze(1) >> shifts) & 0xF).reshape(in8 * 8, out_f) - 8
    scale = scales.float().repeat_interleave(GROUP, dim=0)
    return (q.float() * scale).t().contiguous()


def block_fp8(w: torch.Tensor) -> BlockFp8:
    """Quantise a float [out, in] weight to float8_e4m3fn with 128x128 block scales."""
    out_f, in_f = w.shape
    rows, cols = -(-out_f // BLOCK), -(-in_f // BLOCK)
    padded = torch.zeros(rows * BLOCK, cols * BLOCK)
    padded[:out_f, :in_f] = w.float()
    blocks = padded.reshape(rows, BLOCK, cols, BLOCK)
    scale_inv = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_min(1e-12)
    expand = scale_inv.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:out_f, :in_f]
    fp8 = (w.float() / expand).to(torch.float8_e4m3fn)
    return BlockFp8(fp8, scale_inv, fp8.float() * expand)
