"""Hidden states shaped like a real final-norm output, and the logit agreement they give.

Random Gaussian hidden states are not what an LM head sees. The head reads the output of the
model's last RMSNorm, and that vector has a scale and a few large channels:

- The model imitated is Qwen3.5 (35B-A3B and 122B-A10B: hidden 2048 / 3072, vocabulary
  248320, untied head). Its final norm is an RMSNorm with a zero-centred gain,
  `y = x / rms(x) * (1 + w)` (THUDM/slime scripts/models/qwen3.5-35B-A3B.sh:
  `--normalization RMSNorm --apply-layernorm-1p`, `--hidden-size 2048 --vocab-size 248320`).
- The residual stream x entering it is heavy-tailed per channel (Student-t, 5 degrees of
  freedom, per-channel scale log-normal with sigma 0.5) and carries a handful of outlier
  channels with a fixed sign per channel, 20 to 60 times the median channel scale: the
  "outlier features" of Dettmers et al., LLM.int8() (arXiv 2208.07339: about 6 such
  dimensions, magnitudes up to 20 and beyond, in models of 6.7B parameters and more) and the
  "massive activations" of Sun et al. (arXiv 2402.17762: a few channels 100s of times the
  median in the residual stream). OUTLIER_CHANNELS = 8, 0.26 % of 3072.
- The gain w is N(0, 0.15) per channel, so (1 + w) sits around 1 with a spread.
- Half the states lean towards one vocabulary row t: beta * ||x|| * W[t] / ||W[t]|| is added
  to x before the norm, beta uniform in [0, LEAN_MAX]. A real next-token distribution has a
  clear favourite more often than Gaussian noise does; beta = 0 keeps the hard case (the
  top-1 decided by the gaps between Gaussian extremes) in the mix.

What is reported: top-1 agreement of INT8 with BF16 (the logits a user would sample from
otherwise), max and mean |INT8 - BF16|, both against an FP32 reference, the logit scale and
the median gap between the top two BF16 logits (how close the calls are).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import torch

OUTLIER_CHANNELS = 8
OUTLIER_RANGE = (20.0, 60.0)
CHANNEL_SCALE_SIGMA = 0.5
STUDENT_DF = 5.0
GAIN_SIGMA = 0.15
LEAN_MAX = 0.1
RMS_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class NormModel:
    """Per-channel constants of one imitated model: scales, outlier channels and the norm gain."""

    channel_scale: torch.Tensor  # [K] float32
    outlier_value: torch.Tensor  # [K] float32, 0 off the outlier channels
    gain: torch.Tensor  # [K] float32, the (1 + w) of the norm


def norm_model(k: int, gen: torch.Generator) -> NormModel:
    """Draw the per-channel constants for hidden size k (fixed for all states of a run)."""
    device = gen.device
    scale = torch.exp(CHANNEL_SCALE_SIGMA * torch.randn(k, generator=gen, device=device))
    count = min(OUTLIER_CHANNELS, k)
    channels = torch.randperm(k, generator=gen, device=device)[:count]
    low, high = OUTLIER_RANGE
    magnitude = low + (high - low) * torch.rand(count, generator=gen, device=device)
    sign = torch.where(torch.rand(count, generator=gen, device=device) < 0.5, -1.0, 1.0)
    outlier = torch.zeros(k, device=device)
    outlier[channels] = sign * magnitude * scale.median()
    gain = 1.0 + GAIN_SIGMA * torch.randn(k, generator=gen, device=device)
    return NormModel(scale, outlier, gain)


def _student_t(shape: tuple, gen: torch.Generator) -> torch.Tensor:
    """Student-t samples: a normal over the root of a chi-square / df (torch has no seeded t)."""
    normal = torch.randn(shape, generator=gen, device=gen.device)
    chi2 = torch.randn((*shape, int(STUDENT_DF)), generator=gen, device=gen.device).pow(2).sum(-1)
    return normal / torch.sqrt(chi2 / STUDENT_DF)


def hidden_states(
    model: NormModel, weight: torch.Tensor, rows: int, gen: torch.Generator, dtype: torch.dtype
) -> torch.Tensor:
    """rows final-norm outputs for the head `weight` [N, K], in dtype (see the module doc)."""
    k = model.channel_scale.numel()
    x = _student_t((rows, k), gen) * model.channel_scale + model.outlier_value
    lean = torch.rand(rows, generator=gen, device=gen.device) < 0.5
    beta = LEAN_MAX * torch.rand(rows, generator=gen, device=gen.device) * lean
    target = torch.randint(0, weight.shape[0], (rows,), generator=gen, device=gen.device)
    direction = weight[target].float()
    direction = direction / direction.norm(dim=1, keepdim=True).clamp_min(1e-12)
    x = x + (beta * x.norm(dim=1))[:, None] * direction
    rms = torch.sqrt(x.pow(2).mean(dim=1, keepdim=True) + RMS_EPS)
    return (x / rms * model.gain).to(dtype)


class Agreement:
    """Running comparison of INT8 and BF16 logits (and both against an FP32 reference)."""

    def __init__(self) -> None:
        self.rows = 0
        self.sums: Dict[str, float] = {}
        self.maxes: Dict[str, float] = {}
        self.gaps: list = []
        self.scale_sq = 0.0
        self.count = 0

    def add(self, int8: torch.Tensor, bf16: torch.Tensor, ref: torch.Tensor) -> None:
        """One chunk of [rows, vocab] logits from the three computations."""
        i8, b16, r32 = int8.float(), bf16.float(), ref.float()
        self.rows += i8.shape[0]
        top_b = b16.argmax(dim=1)
        top_r = r32.argmax(dim=1)
        self._sum("top1_int8_vs_bf16", float((i8.argmax(dim=1) == top_b).sum()))
        self._sum("top1_int8_vs_ref", float((i8.argmax(dim=1) == top_r).sum()))
        self._sum("top1_bf16_vs_ref", float((top_b == top_r).sum()))
        for name, a, b in (("int8_vs_bf16", i8, b16), ("int8_vs_ref", i8, r32), ("bf16_vs_ref", b16, r32)):
            diff = (a - b).abs()
            self._sum(f"mean_abs_{name}", float(diff.sum()))
            self.maxes[f"max_abs_{name}"] = max(self.maxes.get(f"max_abs_{name}", 0.0), float(diff.max()))
        top2 = b16.topk(2, dim=1).values
        self.gaps.append((top2[:, 0] - top2[:, 1]).cpu())
        self.scale_sq += float(r32.pow(2).sum())
        self.count += r32.numel()

    def _sum(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value

    def result(self) -> Dict[str, Optional[float]]:
        """Fractions for the top-1 rates, logit units for the errors, over all rows added."""
        if self.rows == 0:
            raise ValueError("int8_lm_head_hidden: no logits were added")
        elements = self.count
        out: Dict[str, Optional[float]] = {"states": self.rows}
        for key, value in self.sums.items():
            out[key] = value / (self.rows if key.startswith("top1") else elements)
        out.update(self.maxes)
        out["logit_rms"] = (self.scale_sq / elements) ** 0.5
        out["median_top2_gap_bf16"] = float(torch.cat(self.gaps).median())
        return out
