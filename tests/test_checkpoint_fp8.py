"""Block-FP8 block size inference: ceiling division, partial blocks, outliers."""

from __future__ import annotations

import pytest

from sparkmods.checkpoint.fp8 import (
    Fp8Layer,
    block_interval,
    common_block,
    declared_block,
    fits,
    fp8_layers,
    scale_problem,
)
from sparkmods.checkpoint.header import TensorInfo


def layer(name: str, weight: tuple[int, int], scale: tuple[int, ...] | None, scale_dtype: str = "F32") -> Fp8Layer:
    w = TensorInfo(f"{name}.weight", "F8_E4M3", weight, 0, weight[0] * weight[1])
    s = TensorInfo(f"{name}.weight_scale_inv", scale_dtype, scale, 0, 4) if scale is not None else None
    return Fp8Layer(name, w, s)


@pytest.mark.parametrize(
    "size, blocks, expected",
    [
        (256, 2, (128, 255)),
        (192, 2, (96, 191)),   # 192 = one full block of 128 + a partial one
        (3072, 24, (128, 133)),
        (100, 1, (100, 1 << 62)),
        (100, 101, None),      # more blocks than elements
        (10, 3, (4, 4)),
    ],
)
def test_block_interval(size: int, blocks: int, expected: tuple[int, int] | None) -> None:
    assert block_interval(size, blocks) == expected
    if expected:
        low, high = expected
        assert -(-size // low) == blocks and -(-size // min(high, 1 << 20)) == blocks


def test_partial_last_block_needs_ceiling_division() -> None:
    shared = layer("se.gate_proj", (192, 256), (2, 2))
    assert scale_problem(shared) is None
    assert fits(shared, (128, 128))
    # Floor division would have asked for a 1x2 scale and a block of 192 rows.
    assert not fits(layer("x", (192, 256), (1, 2)), (128, 128))


def test_common_block_finds_128_and_names_outliers() -> None:
    layers = [
        layer("a", (192, 256), (2, 2)),
        layer("b", (256, 192), (2, 2)),
        layer("c", (3072, 1024), (24, 8)),
        layer("odd", (256, 256), (4, 4)),  # 64x64 blocks
    ]
    verdict = common_block(layers)
    assert verdict.block == (128, 128)
    assert verdict.outliers == ["odd"]
    assert common_block(layers[:3], declared=(64, 64)).outliers == ["a", "b", "c"]


def test_scale_problems() -> None:
    assert scale_problem(layer("m", (4, 4), None)) == "no weight_scale_inv"
    assert "I32" in scale_problem(layer("m", (4, 4), (1, 1), "I32"))
    assert "2-D" in scale_problem(layer("m", (4, 4), (1,)))
    assert "fits no block" in scale_problem(layer("m", (4, 4), (5, 1)))


def test_fp8_layers_pairs_each_weight_with_its_own_scale() -> None:
    tensors = {
        "x.weight": TensorInfo("x.weight", "F8_E4M3", (4, 4), 0, 16),
        "x.weight_scale_inv": TensorInfo("x.weight_scale_inv", "F32", (1, 1), 16, 20),
        "xy.weight": TensorInfo("xy.weight", "F8_E4M3", (4, 4), 20, 36),
        "n.weight": TensorInfo("n.weight", "BF16", (4,), 36, 44),
    }
    found = {layer.module: layer.scale.name if layer.scale else None for layer in fp8_layers(tensors)}
    assert found == {"x": "x.weight_scale_inv", "xy": None}


def test_declared_block() -> None:
    assert declared_block({"weight_block_size": [128, 128]}) == (128, 128)
    assert declared_block({"weight_block_size": None}) is None
    assert declared_block(None) is None
