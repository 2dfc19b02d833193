"""int8-lm-head: the kernel module's quantization, torch path and head decisions on CPU torch.

The module is taken from the mod's own new-file hunk (ci/bench/benchlib/int8_lm_head_kernel.py), so
these tests see the text run.sh installs. vLLM is not needed: stand-in classes carry the
names the module checks (ParallelLMHead, UnquantizedEmbeddingMethod); the real classes are
exercised by test_mod_int8_lm_head_vllm.py. The Triton kernel is checked on a GPU by
ci/bench/gpu_check_int8_lm_head.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType
from typing import List

import pytest

from extras import need
from scriptload import load_script

torch = need("torch")

from int8_lm_head_bounds import logit_bound  # noqa: E402
from sparkmods.runtime.manifest import load_manifest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MOD_DIR = REPO / "mods" / "int8-lm-head"


@pytest.fixture(scope="module")
def mod(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return load_script(REPO / "ci" / "bench" / "benchlib" / "int8_lm_head_kernel.py").load_kernel_module(tmp_path_factory.mktemp("int8"))


# ---- quantization ----


def test_quantization_of_a_hand_checked_matrix(mod: ModuleType) -> None:
    w = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [127.0, 63.5, -127.0]])
    q = mod.quantize_rows(w)
    # row 0: scale 2/127; 1/(2/127) = 63.5 rounds to even 64, 0.5 -> 31.75 -> 32
    assert q.qweight.tolist() == [[64, -127, 32], [0, 0, 0], [127, 64, -127]]
    assert q.qweight.dtype == torch.int8 and q.scale.dtype == torch.float32
    assert torch.equal(q.scale, torch.tensor([2.0, 0.0, 127.0]) / 127)


def test_quantization_bounds_on_random_rows(mod: ModuleType) -> None:
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(300, 96, generator=gen) * torch.exp(torch.randn(300, 1, generator=gen))).to(torch.bfloat16)
    q = mod.quantize_rows(w, chunk_rows=64)  # several chunks, the last one partial
    amax = w.float().abs().amax(dim=1)
    assert torch.equal(q.scale, amax / 127)
    assert int(q.qweight.abs().max()) == 127
    assert bool((q.qweight.abs().amax(dim=1) == 127).all())  # every row uses its full range
    err = (w.double() - q.qweight.double() * q.scale.double()[:, None]).abs()
    assert bool((err <= q.scale.double()[:, None] * (0.5 + 1e-5)).all())
    whole = mod.quantize_rows(w, chunk_rows=10_000)
    assert torch.equal(whole.qweight, q.qweight) and torch.equal(whole.scale, q.scale)


def test_quantization_rejects_a_non_matrix(mod: ModuleType) -> None:
    with pytest.raises(ValueError, match="2-D weight"):
        mod.quantize_rows(torch.ones(4))
    with pytest.raises(ValueError, match="2-D weight"):
        mod.quantize_head(torch.ones(4))


# ---- the rotation of the hidden dimension ----


@pytest.mark.parametrize("k,block", [(3072, 1024), (4096, 1024), (2048, 1024), (192, 64), (48, 16), (40, 0), (7, 0)])
def test_rotation_block_is_the_largest_power_of_two_factor_within_bounds(mod: ModuleType, k: int, block: int) -> None:
    assert mod.rotation_block(k) == block
    rotation = mod.make_rotation(k, torch.bfloat16, torch.device("cpu"))
    assert (rotation is None) == (block == 0)
    if rotation is not None:
        assert rotation.block == block and rotation.matrix.shape == (k // block, block, block)


def _dense(rotation) -> "torch.Tensor":
    return torch.block_diag(*[m.double() for m in rotation.matrix])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rotation_is_orthogonal_and_its_fast_transform_is_its_matrix(mod: ModuleType, dtype: "torch.dtype") -> None:
    rotation = mod.make_rotation(192, dtype, torch.device("cpu"))
    r = _dense(rotation)  # the matrices are exact in 16 bits: entries +-1/8 at block 64
    assert rotation.matrix.dtype == dtype
    assert torch.allclose(r @ r.t(), torch.eye(192, dtype=torch.float64), atol=1e-12)
    assert set(rotation.signs.tolist()) == {-1.0, 1.0}
    x = torch.randn(37, 192, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(rotation.apply_fp32(x).double(), x.double() @ r, atol=1e-5)


def test_rotation_is_the_same_on_every_call(mod: ModuleType) -> None:
    """Tensor-parallel ranks build it separately: it must not depend on the global RNG."""
    first = mod.make_rotation(3072, torch.bfloat16, torch.device("cpu"))
    torch.manual_seed(12345)
    second = mod.make_rotation(3072, torch.bfloat16, torch.device("cpu"))
    assert torch.equal(first.signs, second.signs) and torch.equal(first.matrix, second.matrix)


def test_head_codes_are_the_rows_of_the_rotated_weight(mod: ModuleType) -> None:
    gen = torch.Generator().manual_seed(4)
    w = (torch.randn(300, 192, generator=gen) * 0.05).to(torch.bfloat16)
    head = mod.quantize_head(w)
    assert head.rotation is not None
    direct = mod.quantize_rows(head.rotation.apply_fp32(w).to(torch.float32))
    assert torch.equal(head.qweight, direct.qweight) and torch.equal(head.scale, direct.scale)
    assert head.nbytes == 300 * 192 + 300 * 4 + 192 * 4 + 3 * 64 * 64 * 2
    assert mod.quantize_head(torch.randn(5, 40)).rotation is None  # no block: plain rows


@pytest.mark.parametrize("dtype,step", [(torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-10)])
def test_rotated_head_stays_within_the_bound_of_the_exact_head(mod: ModuleType, dtype: "torch.dtype", step: float) -> None:
    gen = torch.Generator().manual_seed(5)
    w = (torch.randn(mod.CHUNK_ROWS + 33, 192, generator=gen) * 0.02).to(dtype)
    x = (torch.randn(6, 192, generator=gen) * 3).to(dtype)
    head = mod.quantize_head(w)
    out = mod.int8_matmul(x, head)
    assert out.dtype == dtype and out.shape == (6, w.shape[0])
    exact = x.double() @ w.double().t()
    bound = logit_bound(x, w, head.rotation, step)
    assert bool(((out.double() - exact).abs() <= bound).all())
    # and the bound is tight enough to catch a head that forgot to rotate x
    unrotated = x.double() @ (head.qweight.double() * head.scale.double()[:, None]).t()
    assert not bool(((unrotated - exact).abs() <= bound).all())


def test_rotation_rescues_int8_hidden_states_with_outlier_channels(mod: ModuleType) -> None:
    """Why the head is rotated: W8A8 on final-norm-like states is far more accurate after it."""
    from int8_lm_head_interp import bench_module

    hidden = bench_module("benchlib.int8_lm_head_hidden")
    gen = torch.Generator().manual_seed(6)
    w = torch.randn(2000, 1024, generator=gen) * 0.02  # one rotation block, as the real heads have
    x = hidden.hidden_states(hidden.norm_model(1024, gen), w, 64, gen, torch.float32)
    exact = x.double() @ w.double().t()
    w8a8 = mod.KernelConfig(mod.W8A8, 16, 32, 64, 4, 2)  # the torch path: x rounded to INT8 per row
    plain = (mod.int8_matmul(x, mod.quantize_rows(w), w8a8).double() - exact).abs().mean()
    rotated = (mod.int8_matmul(x, mod.quantize_head(w), w8a8).double() - exact).abs().mean()
    assert float(rotated) < 0.5 * float(plain)


# ---- torch path numerics ----


def _dequant_reference(x: "torch.Tensor", q) -> "torch.Tensor":
    return x.double() @ (q.qweight.double() * q.scale.double()[:, None]).t()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_torch_path_matches_float_reference(mod: ModuleType, dtype: "torch.dtype") -> None:
    gen = torch.Generator().manual_seed(1)
    n, k = mod.CHUNK_ROWS + 77, 48  # crosses a chunk boundary of the torch path
    w = torch.randn(n, k, generator=gen) * 0.02
    q = mod.quantize_rows(w)
    x = torch.randn(5, k, generator=gen).to(dtype)
    out = mod.int8_matmul(x, q)
    assert out.dtype == dtype and out.shape == (5, n)
    ref = _dequant_reference(x, q)
    rounding = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-10, torch.float32: 2.0**-20}[dtype]
    assert bool(((out.double() - ref).abs() <= rounding * ref.abs() + 1e-6).all())
    exact = x.double() @ w.double().t()
    quant = x.double().abs().sum(dim=1, keepdim=True) * w.double().abs().amax(dim=1)[None, :] / 254
    assert bool(((out.double() - exact).abs() <= quant + rounding * exact.abs() + 1e-6).all())


def test_torch_path_keeps_leading_dims_and_reads_strided_input(mod: ModuleType) -> None:
    gen = torch.Generator().manual_seed(2)
    q = mod.quantize_rows(torch.randn(40, 16, generator=gen))
    x = torch.randn(16, 2, 3, generator=gen).to(torch.bfloat16).permute(1, 2, 0)  # [2, 3, 16], not contiguous
    out = mod.int8_matmul(x, q)
    assert out.shape == (2, 3, 40)
    assert torch.equal(out, mod.int8_matmul(x.contiguous(), q))


def test_hidden_size_mismatch_is_one_clear_error(mod: ModuleType) -> None:
    q = mod.quantize_rows(torch.randn(8, 16))
    with pytest.raises(ValueError, match="hidden size 12 does not match the head's 16"):
        mod.int8_matmul(torch.randn(2, 12), q)


# ---- tile choice ----


def test_tiles_shrink_to_fit_a_small_shared_memory(mod: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    device = torch.device("cuda", 0)  # never touched: the budget lookup is replaced
    monkeypatch.setattr(mod, "_cuda_tuning", lambda _index: (mod.DISPATCH, 227 * 1024))
    big = {m: mod.pick_config(m, device) for m in (1, 16, 17, 32, 33, 128, 129, 4096)}
    assert big[1] == big[16] and big[1].block_m == 16
    assert [big[m] for m in (17, 33, 129)] == [mod.table_config(m) for m in (17, 33, 129)]  # the table as shipped
    small_budget = 101376 - 8 * 1024  # 99 KiB per block, as on sm_12x parts such as GB10
    monkeypatch.setattr(mod, "_cuda_tuning", lambda _index: (mod.DISPATCH, 101376))
    for m, cfg in big.items():
        small = mod.pick_config(m, device)
        assert small.block_m == cfg.block_m and small.block_n == cfg.block_n
        assert mod.shared_memory_estimate(small) <= small_budget
        assert small.num_stages >= 2


# ---- vLLM-side decisions, with stand-ins named like vLLM's classes ----


class UnquantizedEmbeddingMethod:
    def apply(self, layer, x, bias=None):
        return torch.nn.functional.linear(x, layer.weight, bias)


class GPTQMarlinLinearMethod(UnquantizedEmbeddingMethod):
    """A quantized head's method: only the name matters to the mod."""


class VocabParallelEmbedding(torch.nn.Module):
    def __init__(self, n: int, k: int, method=None) -> None:
        super().__init__()
        self.quant_method = method or UnquantizedEmbeddingMethod()
        self.weight = torch.nn.Parameter((torch.randn(n, k) * 0.02).to(torch.bfloat16), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param, loaded) -> None:
        param.data.copy_(loaded)


class ParallelLMHead(VocabParallelEmbedding):
    pass


@pytest.fixture()
def logs(mod: ModuleType) -> List[str]:
    lines: List[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    mod.logger.addHandler(handler)
    mod.logger.setLevel(logging.INFO)
    yield lines
    mod.logger.removeHandler(handler)


def test_active_head_is_quantized_once_and_freed(mod: ModuleType, logs: List[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mod.ENV_SWITCH, raising=False)
    head = ParallelLMHead(16384, 64)
    expected_q = mod.quantize_head(head.weight.data)
    x = torch.randn(3, 64).to(torch.bfloat16)
    bias = torch.randn(16384).to(torch.bfloat16)
    out = mod.maybe_apply(head, x, bias)
    assert head.weight.numel() == 0 and head.weight.dtype == torch.bfloat16
    assert torch.equal(out, mod.int8_matmul(x, expected_q) + bias)
    assert torch.equal(mod.maybe_apply(head, x, None), mod.int8_matmul(x, expected_q))
    (line,) = logs  # one line, on the first call only
    assert "active (torch path) on a 16384x64 bfloat16 head shard" in line
    assert line.endswith("2.0 MiB -> 1.1 MiB, 0.9 MiB saved")  # 2 bytes a weight -> 1, plus 4 a row


@pytest.mark.parametrize("value", ["0", "false", "OFF", " no "])
def test_switch_turns_it_off(mod: ModuleType, logs: List[str], monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(mod.ENV_SWITCH, value)
    head = ParallelLMHead(64, 16)
    assert mod.maybe_apply(head, torch.randn(2, 16).to(torch.bfloat16), None) is None
    assert head.weight.numel() == 64 * 16
    assert logs == ["sparkmods int8-lm-head: not used: switched off by SPARKMODS_INT8_LM_HEAD"]


def test_tied_and_quantized_heads_are_left_alone(mod: ModuleType, logs: List[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mod.ENV_SWITCH, raising=False)
    x = torch.randn(2, 16).to(torch.bfloat16)
    embed = VocabParallelEmbedding(64, 16)
    tied = ParallelLMHead(64, 16)
    tied.weight = embed.weight  # what vLLM's tie_weights does
    quantized = ParallelLMHead(64, 16, GPTQMarlinLinearMethod())
    for head in (embed, tied, quantized):
        assert mod.maybe_apply(head, x, None) is None
        assert mod.maybe_apply(head, x, None) is None  # decided once, not re-logged
        assert head.weight.numel() == 64 * 16
    assert logs == [
        "sparkmods int8-lm-head: not used: the head is a VocabParallelEmbedding (tied to the input embeddings)",
        "sparkmods int8-lm-head: not used: the head weight belongs to VocabParallelEmbedding (tied embeddings)",
        "sparkmods int8-lm-head: not used: the head is already quantized (GPTQMarlinLinearMethod)",
    ]


def test_batch_invariant_mode_keeps_vllm_kernels(mod: ModuleType, logs: List[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mod.ENV_SWITCH, raising=False)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    assert mod.maybe_apply(ParallelLMHead(64, 16), torch.randn(1, 16).to(torch.bfloat16), None) is None
    assert "VLLM_BATCH_INVARIANT" in logs[0]


def test_heads_sharing_one_weight_share_one_int8_copy(mod: ModuleType, logs: List[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A drafter head holding the target head's weight must not fall back to the freed bf16."""
    monkeypatch.delenv(mod.ENV_SWITCH, raising=False)
    target = ParallelLMHead(128, 16)
    drafter = ParallelLMHead(128, 16)
    drafter.weight = target.weight
    x = torch.randn(2, 16).to(torch.bfloat16)
    first = mod.maybe_apply(drafter, x, None)  # the drafter runs first: the target's copy is made
    assert first is not None and target.weight.numel() == 0
    assert torch.equal(mod.maybe_apply(target, x, None), first)
    assert len(logs) == 1


# ---- the manifest ----


def test_manifest_covers_every_release_from_0_18_with_the_shared_module() -> None:
    manifest = load_manifest(MOD_DIR)
    for version in ("0.18.0", "0.25.1", "0.26.0", "0.33.0", "0.40.0"):
        variant = manifest.select(version)
        assert variant is not None, version
        assert variant.patches[0] == "patches/common/int8_lm_head.patch"
        assert (MOD_DIR / variant.patches[1]).is_file()
    assert manifest.select("0.25.1").label == "get-logits"
    assert manifest.select("0.26.0").label == "apply-head"
