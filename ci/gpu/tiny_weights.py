"""Float weights of the tiny Qwen3.5-MoE, random or *peaked*.

Random weights give nearly flat logits, so any numerical change flips greedy tokens and equal
outputs prove nothing (../shared/docs/gpu.md). The peaked model makes greedy decoding a known
function of the current token, with a large logit margin, while every layer still runs:

- The residual stream is dominated by the token embedding: every embedding row is a Gaussian
  vector with RMS 1, and every sub-layer's output projection (`o_proj`, `out_proj`, experts'
  and shared expert's `down_proj`) is scaled so that its output RMS is about `LAYER_GAIN`
  (0.05), so 2 x 12 sub-layers add a small, context-dependent perturbation.
- The final norm turns the hidden state into (almost) sqrt(H) * e_t, e_t the unit vector of the
  current token's embedding. The LM head row of token f(t) is `TOP_LOGIT / sqrt(H) * e_t`, so
  token f(t) scores about TOP_LOGIT (16) while every other row scores e_s . e_t * TOP_LOGIT,
  a Gaussian with standard deviation TOP_LOGIT / sqrt(H) (0.7 at H = 512): a margin above 10
  that INT4 experts, block-FP8 shared experts, an INT8 head or a quantised KV cache cannot close.
- f is one permutation of all token ids (every LM head row has exactly one pre-image). Its
  cycles: all ordinary tokens in one random cycle, and a second cycle that starts at the
  newline token and walks the scripted reply of tiny_tokenizer.SCRIPT (reasoning, `</think>`,
  a tool call, `<|im_end|>`), then the special and unused ids, back to newline. Chat prompts
  end with a newline, so the model answers with the script; completion prompts made of
  ordinary tokens stay in the ordinary cycle and never reach an end-of-sequence token.
- The MTP head predicts f(f(t)) at the position of token t: it receives the embedding of the
  next token t' = f(t) and the target's hidden state; `mtp.fc` is [I | 0], so its output is the
  normalised embedding of t', and its own decoder layer adds only a small perturbation, so the
  shared LM head answers f(t'). Loaded, every draft is accepted; left uninitialised (stock vLLM
  ignoring an un-indexed MTP file), essentially none is.

Names and shapes come from tests/ckptfactory.py (checked against vLLM's Qwen3.5 loader).
"""

from __future__ import annotations

import math
import random
import zlib
from typing import Mapping, Sequence

import torch

LAYER_GAIN = 0.05
TOP_LOGIT = 16.0
# Output projections of a sub-layer: scaled to LAYER_GAIN (see the module docstring).
_OUTPUT_PROJ = (".o_proj.weight", ".out_proj.weight", ".down_proj.weight")
# Qwen3.5's RMSNorms scale by (1 + weight): zero is the identity. The gated norm inside
# DeltaNet (`linear_attn.norm`) scales by weight itself.
_GATED_NORM = ".linear_attn.norm.weight"


def permutation(vocab: int, ordinary: Sequence[int], chain: Sequence[int], seed: int) -> list[int]:
    """f as a list: one random cycle over `ordinary`, one cycle `chain` + every other id.

    `chain` starts at the newline token and lists the scripted reply; the ids that are in
    neither (special tokens, ids the tokenizer does not use) follow it, then back to its start.
    """
    taken = set(ordinary) | set(chain)
    if len(taken) != len(ordinary) + len(chain):
        raise ValueError("ordinary tokens and the script chain overlap")
    rng = random.Random(seed)
    cycle = list(ordinary)
    rng.shuffle(cycle)
    rest = list(chain) + [i for i in range(vocab) if i not in taken]
    f = list(range(vocab))
    for ring in (cycle, rest):
        for a, b in zip(ring, ring[1:] + ring[:1]):
            f[a] = b
    return f


def _gen(name: str, seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))


def _normal(shape: Sequence[int], std: float, name: str, seed: int) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=_gen(name, seed)) * std


def _init(name: str, shape: Sequence[int], seed: int) -> torch.Tensor:
    """Random weights every variant shares, scaled as the module docstring says."""
    if name.endswith(_GATED_NORM):
        return torch.ones(tuple(shape))
    if "norm" in name.rsplit(".", 2)[-2]:
        return torch.zeros(tuple(shape))
    if name.endswith(".A_log"):
        return torch.log(torch.rand(tuple(shape), generator=_gen(name, seed)) * 15 + 1)
    if name.endswith(".dt_bias"):
        return torch.ones(tuple(shape))
    if name.endswith(".conv1d.weight"):
        return _normal(shape, 1 / math.sqrt(shape[-1]), name, seed)
    if name.endswith("embed_tokens.weight"):
        return _normal(shape, 1.0, name, seed)
    fan_in = shape[-1]
    gain = LAYER_GAIN if name.endswith(_OUTPUT_PROJ) else 1.0
    return _normal(shape, gain / math.sqrt(fan_in), name, seed)


def lm_head(embed: torch.Tensor, f: Sequence[int]) -> torch.Tensor:
    """Row f(t) = TOP_LOGIT / sqrt(H) * embed[t] / |embed[t]|, so logits peak at f(t)."""
    unit = embed / embed.norm(dim=1, keepdim=True)
    head = torch.empty_like(embed)
    head[torch.tensor(list(f))] = unit * (TOP_LOGIT / math.sqrt(embed.shape[1]))
    return head


def mtp_fc(hidden: int) -> torch.Tensor:
    """[I | 0]: pass the (normalised) next-token embedding through, ignore the hidden state."""
    return torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)


def float_weights(
    shapes: Mapping[str, Sequence[int]], f: Sequence[int] | None, seed: int
) -> dict[str, torch.Tensor]:
    """float32 weights for every name in shapes; peaked when f is given, random otherwise."""
    weights = {name: _init(name, shape, seed) for name, shape in shapes.items()}
    if f is not None:
        embed = weights["model.language_model.embed_tokens.weight"]
        weights["lm_head.weight"] = lm_head(embed, f)
        if "mtp.fc.weight" in weights:
            weights["mtp.fc.weight"] = mtp_fc(embed.shape[1])
    return weights
