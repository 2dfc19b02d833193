"""int8-lm-head: the Triton kernels and the row-count dispatch, run under Triton's interpreter.

The kernels are the ones the patch installs, executed by TRITON_INTERPRET=1 on CPU tensors in
fp16 (Triton 3.6's interpreter computes bf16 dots wrongly; the GPU check covers bf16). Shapes
are small and chosen to hit every mask: rows not a multiple of BLOCK_M, vocabulary not a
multiple of BLOCK_N, hidden size not a multiple of BLOCK_K. The split and W8A8 paths' INT8 dots
are exact in the interpreter as on the GPU, so they are also checked with bf16 hidden states.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import ModuleType

import pytest

from extras import need

torch = need("torch")

from int8_lm_head_interp import interpreted_module  # noqa: E402


@pytest.fixture(scope="module")
def mod(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return interpreted_module(Path(tmp_path_factory.mktemp("int8interp")))


@pytest.fixture(autouse=True)
def interpret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _bound_check(mod: ModuleType, x: "torch.Tensor", q, out: "torch.Tensor", split: bool = False) -> None:
    """Within FP32 accumulation plus output rounding of the float64 dequantized product.

    The split path adds the split of x: at most xscale / (2 LO_STEPS) per entry, xscale = row
    absmax / 127, times sum_k |dequantized weight|.
    """
    k = x.shape[-1]
    wd = q.qweight.double() * q.scale.double()[:, None]
    ref = x.double() @ wd.t()
    acc = 2 * k * 2.0**-24 * (x.double().abs() @ wd.abs().t())
    if split:
        acc = acc + (x.double().abs().amax(dim=1, keepdim=True) / 127 / (2 * mod.LO_STEPS)) * wd.abs().sum(dim=1)
    # output rounding: half an fp16 step; one bf16 step, as Triton 3.6's interpreter truncates
    # fp32 -> bf16 where the GPU rounds
    unit = 2.0**-7 if x.dtype == torch.bfloat16 else 2.0**-10
    assert out.dtype == x.dtype and out.shape == ref.shape
    assert bool(torch.isfinite(out).all())
    assert bool(((out.double() - ref).abs() <= acc + unit * ref.abs() + 1e-7).all())


def _head(n: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05 * torch.exp(torch.randn(n, 1, generator=gen))
    w[n // 3] = 0.0  # a padding row
    return w, gen


@pytest.mark.parametrize("kernel,tile", [("gemv", (16, 32, 32)), ("gemv", (32, 64, 64)), ("mma", (16, 32, 32)),
                                         ("mma", (64, 64, 32)), ("mma", (32, 128, 64))])
@pytest.mark.parametrize("m", [1, 7, 40])
def test_each_kernel_matches_the_dequantized_product(mod: ModuleType, kernel: str, tile: tuple, m: int) -> None:
    w, gen = _head(203, 72, seed=m)  # 203 rows: a partial vocab tile; 72: a partial K tile for 32 and 64
    q = mod.quantize_rows(w)
    x = torch.randn(m, 72, generator=gen).to(torch.float16)
    cfg = mod.KernelConfig(kernel, *tile, num_warps=4, num_stages=2)
    out = mod.int8_matmul(x, q, cfg)
    _bound_check(mod, x, q, out)
    assert bool((out[:, 203 // 3] == 0).all())
    torch_path = mod._torch_matmul(x, q)  # same function, plain torch
    assert bool(((out.double() - torch_path.double()).abs() <= 2.0**-9 * torch_path.double().abs() + 1e-3).all())


@pytest.mark.parametrize("tile", [(16, 32, 32), (32, 64, 64), (64, 32, 32), (16, 128, 128)])
@pytest.mark.parametrize("m", [1, 7, pytest.param(40, marks=pytest.mark.slow)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_split_kernel_matches_the_dequantized_product(mod: ModuleType, tile: tuple, m: int, dtype: str) -> None:
    w, gen = _head(203, 72, seed=m)
    q = mod.quantize_rows(w)
    scales = torch.exp(2 * torch.randn(72, generator=gen))  # outlier channels: a wide spread per row
    x = (torch.randn(m, 72, generator=gen) * scales).to(getattr(torch, dtype))
    x[m // 2] = 0.0  # an all-zero row: scale 0, logits 0
    out = mod.int8_matmul(x, q, mod.KernelConfig(mod.SPLIT, *tile, num_warps=4, num_stages=2))
    _bound_check(mod, x, q, out, split=True)
    assert bool((out[:, 203 // 3] == 0).all()) and bool((out[m // 2] == 0).all())


@pytest.mark.parametrize("k", [1, 72, 1030])
def test_split_rows_codes_x_within_its_bound(mod: ModuleType, k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    x = (torch.randn(5, k, generator=gen) * torch.exp(3 * torch.randn(k, generator=gen))).to(torch.float16)
    x[1] = 0.0
    x[2, 0] = -x[2].abs().max() - 1  # the absmax negative: code -127
    hi, lo, xscale = mod.split_rows(x)
    assert hi.dtype == lo.dtype == torch.int8 and xscale.dtype == torch.float32
    assert int(hi.abs().max()) == 127 and int(lo.abs().max()) <= 127
    assert torch.equal(xscale, x.float().abs().amax(dim=1) / 127)
    assert int(hi[2, 0]) == -127 and not bool(hi[1].any()) and not bool(lo[1].any())
    back = xscale.double()[:, None] * (hi.double() + lo.double() / mod.LO_STEPS)
    err = (back - x.double()).abs()
    assert bool((err <= xscale.double()[:, None] / (2 * mod.LO_STEPS) * (1 + 1e-5)).all())
    assert k == 1 or bool(lo.any())  # one entry a row is its own absmax: nothing left for lo


def _w8a8_inputs(m: int, dtype: "torch.dtype"):
    """A head with a zero row, and m >= 2 hidden rows: row 0 all zero, row m-1 with one large outlier."""
    w, gen = _head(203, 72, seed=300 + m)
    x = torch.randn(m, 72, generator=gen) * torch.exp(torch.randn(72, generator=gen))
    x[0] = 0.0
    x[m - 1, 5] = 60 * x[m - 1].abs().max()
    return w, x.to(dtype)


def _assert_w8a8_bound(mod: ModuleType, x: "torch.Tensor", w: "torch.Tensor", q, out: "torch.Tensor") -> None:
    """|out - x . W| <= weight term + activation term + epilogue and output rounding, per logit.

    x . W - (xscale hi) . (scale q) = x . (W - scale q) + (x - xscale hi) . (scale q): the weight
    term is ||x_m||_1 scale[n] / 2 (= max_k |W[n,k]| ||x_m||_1 / 254), the activation term
    row absmax / 254 times sum_k |q[n,k]| scale[n]; 1e-5 covers the FP32 divisions of both scales.
    The INT32 sums are exact; converting them and applying two scales is 3 FP32 roundings.
    """
    xd = x.double()
    wq = q.qweight.double().abs() * q.scale.double()[:, None]
    ref = xd @ w.double().t()
    absmax = xd.abs().amax(dim=1, keepdim=True)
    weight_term = xd.abs().sum(dim=1, keepdim=True) * q.scale.double()[None, :] / 2
    activation_term = absmax / 254 * wq.sum(dim=1)[None, :]
    bound = (weight_term + activation_term) * (1 + 1e-5) + 4 * 2.0**-24 * ((xd.abs() + absmax / 254) @ wq.t())
    unit = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-23}[x.dtype]
    assert out.dtype == x.dtype and out.shape == ref.shape and bool(torch.isfinite(out).all())
    assert bool(((out.double() - ref).abs() <= bound + unit * (ref.abs() + bound) + 1e-7).all())


@pytest.mark.parametrize("tile", [(16, 32, 32), (32, 64, 64), (64, 32, 32), (16, 128, 128)])
@pytest.mark.parametrize("m", [2, 7, pytest.param(40, marks=pytest.mark.slow)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_w8a8_within_weight_plus_activation_bound(mod: ModuleType, tile: tuple, m: int, dtype: str) -> None:
    """The Triton kernel (fp16/bf16, interpreted) and the torch path (fp32 hidden states) alike."""
    w, x = _w8a8_inputs(m, getattr(torch, dtype))
    q = mod.quantize_rows(w)
    cfg = mod.KernelConfig(mod.W8A8, *tile, num_warps=4, num_stages=2)
    out = mod.int8_matmul(x, q, cfg)
    _assert_w8a8_bound(mod, x, w, q, out)
    assert bool((out[:, 203 // 3] == 0).all()) and bool((out[0] == 0).all())
    # x rounded to int8 is what makes the error: on the outlier row w8a8 leaves split's bound
    split = mod.int8_matmul(x, q, dataclasses.replace(cfg, kernel=mod.SPLIT)).double()
    split_bound = x.double()[m - 1].abs().max() / 127 / (2 * mod.LO_STEPS) * q.scale.double() * q.qweight.abs().sum(dim=1)
    assert float((out.double()[m - 1] - split[m - 1]).abs().max()) > 10 * float(split_bound.max())


def test_w8a8_codes_only_hi_and_takes_less_shared_memory(mod: ModuleType) -> None:
    gen = torch.Generator().manual_seed(8)
    x = (torch.randn(4, 1030, generator=gen) * 3).to(torch.float16)
    x[2] = 0.0
    hi, lo, xscale = mod.split_rows(x, 0)
    split_hi, _split_lo, split_xscale = mod.split_rows(x)
    assert lo is None and torch.equal(hi, split_hi) and torch.equal(xscale, split_xscale)
    err = (xscale.double()[:, None] * hi.double() - x.double()).abs()
    assert bool((err <= xscale.double()[:, None] / 2 * (1 + 1e-5)).all()) and not bool(hi[2].any())
    tile = (128, 256, 128, 8, 3)
    w8a8, split = mod.KernelConfig(mod.W8A8, *tile), mod.KernelConfig(mod.SPLIT, *tile)
    assert mod.shared_memory_estimate(w8a8) == 3 * (128 * 128 + 256 * 128) < mod.shared_memory_estimate(split)


def test_a_table_entry_for_w8a8_routes_both_paths(mod: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """A DISPATCH band set to W8A8 runs the W8A8 kernel, and the torch path rounds x the same way."""
    w8a8 = mod.KernelConfig(mod.W8A8, 32, 64, 32, num_warps=4, num_stages=2)
    monkeypatch.setattr(mod, "DISPATCH", ((16, mod.DISPATCH[0][1]), (None, w8a8)))
    w, x = _w8a8_inputs(20, torch.float16)
    q = mod.quantize_rows(w)
    assert torch.equal(mod.int8_matmul(x, q), mod.int8_matmul(x, q, w8a8))
    x32 = x.float()
    torch_out = mod.int8_matmul(x32, q)  # fp32 hidden states: the torch path
    assert torch.equal(torch_out, mod._torch_matmul(x32, q, int8_x=True))
    assert not torch.equal(torch_out, mod._torch_matmul(x32, q))
    assert torch.equal(mod.int8_matmul(x32[:16], q), mod._torch_matmul(x32[:16], q))  # the gemv band: x as is


@pytest.mark.parametrize("m", [1, 16, 17, *(pytest.param(m, marks=pytest.mark.slow) for m in (33, 65, 129, 300))])
def test_dispatch_runs_the_table_entry_for_every_band(mod: ModuleType, m: int) -> None:
    w, gen = _head(160, 64, seed=100 + m)
    q = mod.quantize_rows(w)
    x = torch.randn(m, 64, generator=gen).to(torch.float16)
    out = mod.int8_matmul(x, q)  # no config: DISPATCH decides
    if mod.table_config(m).kernel == mod.W8A8:
        _assert_w8a8_bound(mod, x, w, q, out)
    else:
        _bound_check(mod, x, q, out, split=mod.table_config(m).kernel == mod.SPLIT)
    assert torch.equal(out, mod.int8_matmul(x, q, mod.table_config(m)))


def test_dispatch_is_one_pure_table_of_row_counts(mod: ModuleType) -> None:
    limits = [limit for limit, _ in mod.DISPATCH]
    assert limits[-1] is None and limits[:-1] == sorted(limits[:-1]) and len(set(limits)) == len(limits)
    assert {cfg.kernel for _, cfg in mod.DISPATCH} <= set(mod._KERNEL_FNS)
    cpu = torch.device("cpu")
    for m in range(1, 1100):
        cfg = mod.pick_config(m, cpu)
        assert cfg == mod.table_config(m) == mod.pick_config(m, cpu)  # no budget on CPU, same answer twice
        assert cfg.block_m <= max(16, 2 * m) or m > 256  # a row block is never mostly idle


def test_mma_tiles_shrink_to_fit_gb10_shared_memory(mod: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    small_budget = 101376 - 8 * 1024  # 99 KiB per block on sm_12x (GB10)
    monkeypatch.setattr(mod, "_cuda_tuning", lambda _index: (mod.DISPATCH, 101376))
    for limit, cfg in mod.DISPATCH:
        got = mod.pick_config(limit or 4096, torch.device("cuda", 0))
        assert (got.kernel, got.block_m, got.block_n) == (cfg.kernel, cfg.block_m, cfg.block_n)
        assert mod.shared_memory_estimate(got) <= small_budget and got.num_stages >= 2


class UnquantizedEmbeddingMethod:
    pass


class ParallelLMHead(torch.nn.Module):
    """The names maybe_apply checks, with an fp16 weight (the interpreter's dots want fp16)."""

    def __init__(self, n: int, k: int) -> None:
        super().__init__()
        self.quant_method = UnquantizedEmbeddingMethod()
        self.weight = torch.nn.Parameter(torch.randn(n, k).to(torch.float16), requires_grad=False)


_Head = ParallelLMHead


def test_interpreted_head_logs_the_triton_path(mod: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mod.ENV_SWITCH, raising=False)
    records = []
    monkeypatch.setattr(mod.logger, "info", lambda msg, *args: records.append(msg % args))

    head = _Head(96, 32)
    out = mod.maybe_apply(head, torch.randn(3, 32).to(torch.float16), None)
    assert out.shape == (3, 96) and head.weight.numel() == 0
    assert records and "active (Triton kernel) on a 96x32 float16 head shard" in records[0]
    assert len(records) == 1  # no warm-up under the interpreter: it compiles nothing


def test_first_call_on_a_warmup_device_warms_up_once(mod: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mod.ENV_SWITCH, raising=False)
    monkeypatch.delenv(mod.ENV_WARMUP, raising=False)
    monkeypatch.setattr(mod, "WARMUP_DEVICE_TYPES", ("cpu",))
    # int8_matmul itself is tested above; interpreting it for every warm-up row count takes a minute
    monkeypatch.setattr(mod, "int8_matmul", lambda x, weight: torch.zeros(x.shape[0], weight.qweight.shape[0]))
    records = []
    monkeypatch.setattr(mod.logger, "info", lambda msg, *args: records.append(msg % args))
    head = _Head(96, 32)
    mod.maybe_apply(head, torch.randn(3, 32).to(torch.float16), None)
    rows = mod.warmup_rows(torch.device("cpu"))
    assert len(records) == 2 and records[1].startswith(
        f"sparkmods int8-lm-head: warm-up ran {len(rows)} kernel configs (row counts {','.join(map(str, rows))}) in ")
    mod.maybe_apply(head, torch.randn(2, 32).to(torch.float16), None)
    assert len(records) == 2  # later calls neither quantize nor warm up again


# ---- the start-up warm-up ----


def _every_key(mod: ModuleType, device: "torch.device") -> set:
    """What a row count can select, over every row count a server's logits can have (prompt
    logprobs reach max_num_batched_tokens; 70000 is past any default)."""
    return {mod.compile_key(m, device) for m in range(1, 70001)}


def test_warmup_runs_each_kernel_config_once_and_misses_none(mod: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """The row counts int8_matmul is called with (it launches pick_config's kernel for them: the
    dispatch tests above) select every key some row count can, each once."""
    calls = []
    monkeypatch.setattr(mod, "int8_matmul", lambda x, weight: calls.append((x.shape, x.dtype, x.device)))
    monkeypatch.setattr(mod, "WARMUP_DEVICE_TYPES", ("cpu",))
    monkeypatch.delenv(mod.ENV_WARMUP, raising=False)
    mod.warm_up(mod.quantize_head(torch.randn(96, 32)), torch.float16)
    cpu = torch.device("cpu")
    assert all(shape[1] == 32 and dtype == torch.float16 and device == cpu for shape, dtype, device in calls)
    keys = [mod.compile_key(shape[0], cpu) for shape, _, _ in calls]
    assert len(keys) == len(set(keys))  # once per config, not once per row count
    assert set(keys) == _every_key(mod, cpu)
    assert {(cfg, cls) for cfg, _, cls in keys} == {(mod.pick_config(m, cpu), mod.triton_int_class(m)) for m in range(1, 70001)}


def test_warmup_covers_a_tuned_table_fitted_to_gb10(mod: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the picker reads the tune table and lowers tiles to the shared memory: the warm-up follows it."""
    tuned = tuple((limit, dataclasses.replace(cfg, num_stages=4, block_k=256)) for limit, cfg in mod.DISPATCH[:-1])
    tuned += ((None, mod.KernelConfig(mod.SPLIT, 64, 128, 256, 4, 4)),)
    monkeypatch.setattr(mod, "_cuda_tuning", lambda _index: (tuned, 101376))
    gpu = torch.device("cuda", 0)
    assert {mod.compile_key(m, gpu) for m in mod.warmup_rows(gpu)} == _every_key(mod, gpu)
    assert len(mod.warmup_rows(gpu)) == len(_every_key(mod, gpu))


@pytest.mark.parametrize("value", ["0", "off"])
def test_warmup_switch_turns_it_off(mod: ModuleType, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    calls = []
    monkeypatch.setattr(mod, "int8_matmul", lambda *args: calls.append(args))
    monkeypatch.setattr(mod.logger, "info", lambda msg, *args: calls.append(msg))
    monkeypatch.setattr(mod, "WARMUP_DEVICE_TYPES", ("cpu",))
    monkeypatch.setenv(mod.ENV_WARMUP, value)
    mod.warm_up(mod.quantize_head(torch.randn(96, 32)), torch.float16)
    assert calls == []


def test_warmup_failure_is_logged_not_raised(mod: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    warnings = []

    def broken(*_args, **_kwargs):
        raise RuntimeError("out of resource: shared memory")

    monkeypatch.setattr(mod, "int8_matmul", broken)
    monkeypatch.setattr(mod, "WARMUP_DEVICE_TYPES", ("cpu",))
    monkeypatch.setattr(mod.logger, "warning", lambda msg, *args: warnings.append(msg % args))
    monkeypatch.delenv(mod.ENV_WARMUP, raising=False)
    mod.warm_up(mod.quantize_head(torch.randn(96, 32)), torch.float16)
    assert warnings == ["sparkmods int8-lm-head: warm-up failed (RuntimeError: out of resource: shared memory); "
                        "kernels compile on first use"]
