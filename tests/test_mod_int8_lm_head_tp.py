"""int8-lm-head under tensor parallelism 2: each rank quantizes and multiplies its own vocab shard.

The split is vLLM's for a ParallelLMHead: the vocabulary is padded up to a multiple of 64
(DEFAULT_VOCAB_PADDING_SIZE), the padded rows are zero (its weight loader fills them), and rank r
holds rows [r * P / tp, (r + 1) * P / tp) of the padded P. Each shard goes through the patched
code path, `maybe_apply` (quantize on first call, free the 16-bit shard, multiply); the
shards' logits are concatenated along the vocabulary (vLLM's gather) and trimmed to the
original vocabulary, then compared with the unsplit 16-bit head. Run twice: bf16 on the
torch path (what a CPU rank runs) and fp16 through the Triton kernels under the interpreter,
at a GEMV-sized and a SPLIT-sized row count (what DISPATCH routes 3 and 40 rows to).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import List

import pytest

from extras import need

torch = need("torch")

from int8_lm_head_bounds import logit_bound  # noqa: E402
from int8_lm_head_interp import interpreted_module  # noqa: E402

VOCAB, HIDDEN, TP, PADDING = 1000, 64, 2, 64


class UnquantizedEmbeddingMethod:
    """Named like vLLM's method: the only thing the mod reads from it."""


class ParallelLMHead(torch.nn.Module):
    """One rank's head: its shard of the padded weight, loaded by a loader bound to it."""

    def __init__(self, shard: "torch.Tensor") -> None:
        super().__init__()
        self.quant_method = UnquantizedEmbeddingMethod()
        self.weight = torch.nn.Parameter(shard.clone(), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param, loaded) -> None:  # pragma: no cover - bound, never called
        param.data.copy_(loaded)


def vocab_shards(weight: "torch.Tensor", tp: int) -> List["torch.Tensor"]:
    n, k = weight.shape
    padded = -(-n // PADDING) * PADDING
    assert padded % tp == 0
    full = torch.zeros(padded, k, dtype=weight.dtype)
    full[:n] = weight
    per = padded // tp
    return [full[r * per : (r + 1) * per] for r in range(tp)]


@pytest.fixture(scope="module")
def interp_mod(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return interpreted_module(Path(tmp_path_factory.mktemp("int8tp")))


@pytest.mark.parametrize("path", ["torch-bf16", "triton-fp16"])
@pytest.mark.parametrize("rows", [3, 40])
def test_vocab_parallel_shards_gather_to_the_unsplit_head(
    interp_mod: ModuleType, monkeypatch: pytest.MonkeyPatch, path: str, rows: int
) -> None:
    monkeypatch.delenv(interp_mod.ENV_SWITCH, raising=False)
    dtype = torch.bfloat16 if path == "torch-bf16" else torch.float16
    if path == "triton-fp16":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gen = torch.Generator().manual_seed(rows)
    weight = (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.05 * torch.exp(0.5 * torch.randn(VOCAB, 1, generator=gen))).to(dtype)
    x = torch.randn(rows, HIDDEN, generator=gen).to(dtype)
    heads = [ParallelLMHead(shard) for shard in vocab_shards(weight, TP)]
    assert [h.weight.shape[0] for h in heads] == [512, 512]  # 1000 pads to 1024: rank 1 holds 24 zero rows
    parts = [interp_mod.maybe_apply(head, x, None) for head in heads]
    assert all(p is not None and p.dtype == dtype and p.shape == (rows, 512) for p in parts)
    assert all(h.weight.numel() == 0 for h in heads)  # each rank freed its own 16-bit shard
    assert bool((parts[1][:, VOCAB - 512 :] == 0).all())  # the padding rows give exactly 0
    gathered = torch.cat(parts, dim=-1)[:, :VOCAB]

    # against the unsplit 16-bit head: the quantization bound, FP32 sums, output rounding
    exact = x.double() @ weight.double().t()
    step = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-10
    rotation = interp_mod.make_rotation(HIDDEN, dtype, x.device)
    assert bool(((gathered.double() - exact).abs() <= logit_bound(x, weight, rotation, step)).all())
    unsplit16 = torch.matmul(x.float(), weight.float().t())
    assert (gathered.float().argmax(dim=1) == unsplit16.argmax(dim=1)).float().mean() >= 0.9

    # and against the unsplit INT8 head: per-row quantization after the same rotation on every
    # rank makes the shards' codes the same
    whole = interp_mod.quantize_head(weight)
    codes = torch.cat([interp_mod.quantize_head(s).qweight for s in vocab_shards(weight, TP)])[:VOCAB]
    assert torch.equal(codes, whole.qweight)
    unsplit8 = interp_mod.int8_matmul(x, whole)
    assert bool(((gathered.double() - unsplit8.double()).abs() <= step * unsplit8.double().abs() + 1e-6).all())
