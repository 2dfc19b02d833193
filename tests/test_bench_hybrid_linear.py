"""ci/bench/bench_hybrid_linear.py's CPU-runnable parts: shapes, arguments, dequantisation, report."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

from scriptload import load_script

REPO = Path(__file__).resolve().parents[1]


HL = load_script(REPO / "ci" / "bench" / "bench_hybrid_linear.py")


def test_shapes_are_the_shared_experts_of_the_public_configs() -> None:
    assert HL.layer_shapes("35b-a3b") == {"gate_up": (1024, 2048), "down": (2048, 512)}
    assert HL.layer_shapes("122b-a10b") == {"gate_up": (2048, 3072), "down": (3072, 1024)}


def test_defaults() -> None:
    args = HL.parse_args(["--out", "x"])
    assert (args.models, args.rows, args.kernels, args.warm) == (
        ["35b-a3b", "122b-a10b"], [1, 8, 32], ["bf16", "cutlass", "triton", "marlin"], False)


@pytest.mark.parametrize("argv,message", [
    (["--out", "x", "--models", "70b"], "--models 70b: not one of 35b-a3b, 122b-a10b"),
    (["--out", "x", "--kernels", "bf16,deepgemm"], "--kernels deepgemm: not one of bf16, cutlass, triton, marlin"),
    (["--out", "x", "--kernels", "cutlass"], "--kernels must include bf16"),
    (["--out", "x", "--rows", "0"], "positive integers"),
    (["--rows", "8"], "--out"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv: List[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert HL.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_dequantised_scales_each_block_including_the_partial_last_ones() -> None:
    gen = torch.Generator().manual_seed(1)
    weight = (torch.randn(130, 200, generator=gen) * 0.1).to(torch.float8_e4m3fn)
    scale = torch.tensor([[1.0, 2.0], [4.0, 8.0]])
    out = HL.dequantised(weight, scale)
    assert out.dtype == torch.bfloat16 and out.shape == (130, 200)
    w = weight.to(torch.float32)
    for (r0, r1), (c0, c1), s in (((0, 128), (0, 128), 1.0), ((0, 128), (128, 200), 2.0),
                                  ((128, 130), (0, 128), 4.0), ((128, 130), (128, 200), 8.0)):
        assert torch.equal(out[r0:r1, c0:c1], (w[r0:r1, c0:c1] * s).to(torch.bfloat16))


def test_fp8_layer_holds_its_own_copies_of_the_weight_and_scales() -> None:
    """Each kernel processes its own layer (repacking, transposing); the next starts from the checkpoint's."""
    weight = torch.zeros(256, 128, dtype=torch.float8_e4m3fn)
    scale = torch.ones(2, 1)
    layer = HL.fp8_layer(weight, scale)
    assert (layer.weight.shape, layer.weight_scale_inv.shape) == ((256, 128), (2, 1))
    assert layer.weight_scale_inv.data_ptr() != scale.data_ptr()
    assert (layer.output_size_per_partition, layer.input_size_per_partition, layer.logical_widths) == (256, 128, [256])
    assert not layer.weight.requires_grad and layer.weight.data_ptr() != weight.data_ptr()


def _rows() -> List[Dict[str, Any]]:
    rows = []
    for layer, times in (("gate_up", {"bf16": 5.0, "cutlass": 12.0, "marlin": None}), ("down", {"bf16": 3.0, "cutlass": 8.0, "marlin": None})):
        for kernel, us in times.items():
            row: Dict[str, Any] = {"model": "35b-a3b", "layer": layer, "rows": 8, "kernel": kernel}
            row.update({"us": us} if us is not None else {"class": "CutlassFp8BlockScaledMMKernel"})
            rows.append(row)
    return rows


def test_step_extra_is_both_projections_times_the_layers_and_none_without_a_timing() -> None:
    rows = _rows()
    assert HL.step_extra_ms(rows, "35b-a3b", "cutlass", 8) == pytest.approx((12 + 8 - 5 - 3) * 40 / 1000)
    assert HL.step_extra_ms(rows, "35b-a3b", "marlin", 8) is None  # vLLM fell back: no timing
    assert HL.step_extra_ms(rows[:3], "35b-a3b", "cutlass", 8) is None  # one projection missing
    assert HL.step_extra_ms(rows, "35b-a3b", "cutlass", 1) is None


def test_report_names_a_fallback_instead_of_timing_it() -> None:
    text = HL.render({"gpu": "GPU", "vllm": "0.26.0", "torch": "2.11", "l2": "warm", "rows": _rows()})
    assert "| 35b-a3b | gate_up | 8 | 5.00 | 12.00 | - (vLLM chose CutlassFp8BlockScaledMMKernel) |" in text
    assert "| 35b-a3b | 8 | +0.480 | - |" in text
    assert "triton" not in text  # a kernel not asked for has no column


def test_main_exits_1_when_a_kernel_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _rows() + [{"model": "35b-a3b", "layer": "down", "rows": 8, "kernel": "triton", "error": "RuntimeError: no"}]
    monkeypatch.setattr(HL, "run", lambda args: {"gpu": "GPU", "vllm": "0.26.0", "torch": "2.11", "l2": "warm", "rows": rows})
    assert HL.main(["--out", str(tmp_path)]) == 1
    assert "- (RuntimeError: no)" in (tmp_path / "hybrid_linear.md").read_text()
    assert (tmp_path / "hybrid_linear.json").is_file()
    monkeypatch.setattr(HL, "run", lambda args: {"gpu": "GPU", "vllm": "0.26.0", "torch": "2.11", "l2": "warm", "rows": _rows()})
    assert HL.main(["--out", str(tmp_path)]) == 0
