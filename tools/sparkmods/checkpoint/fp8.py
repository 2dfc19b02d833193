"""Block-FP8 layers in a checkpoint: which weights are FP8 and what block size they use.

A block-FP8 layer stores `<module>.weight` as float8_e4m3fn and `<module>.weight_scale_inv`
as one scale per (rows x cols) block. The block size is not stored: it follows from the
shapes, with ceiling division because the last block of a dimension may be partial
(shape 192 with block 128 has 2 scale rows). One shape pair allows a range of block
sizes, so the checkpoint's block size is the one every layer agrees on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

from sparkmods.checkpoint.header import TensorInfo

FP8_DTYPES = frozenset({"F8_E4M3", "F8_E5M2"})
SCALE_DTYPES = frozenset({"F32", "BF16", "F16"})
WEIGHT_SUFFIX = ".weight"
SCALE_SUFFIX = ".weight_scale_inv"

Block = tuple[int, int]
UNBOUNDED = 1 << 62


@dataclass(frozen=True)
class Fp8Layer:
    """An FP8 weight and its scale (None when the checkpoint lacks it)."""

    module: str
    weight: TensorInfo
    scale: TensorInfo | None


def fp8_layers(tensors: Mapping[str, TensorInfo]) -> list[Fp8Layer]:
    """Every `<module>.weight` stored as FP8, paired with its `weight_scale_inv` sibling."""
    layers = []
    for name, info in tensors.items():
        if info.dtype in FP8_DTYPES and name.endswith(WEIGHT_SUFFIX):
            module = name[: -len(WEIGHT_SUFFIX)]
            layers.append(Fp8Layer(module, info, tensors.get(module + SCALE_SUFFIX)))
    return layers


def block_interval(size: int, blocks: int) -> tuple[int, int] | None:
    """Block sizes b with ceil(size / b) == blocks, as an inclusive range, or None."""
    if size <= 0 or blocks <= 0:
        return None
    if blocks == 1:
        return (size, UNBOUNDED)  # any block at least `size` wide holds it all
    low = -(-size // blocks)
    high = (size - 1) // (blocks - 1)
    return (low, high) if low <= high else None


def scale_problem(layer: Fp8Layer) -> str | None:
    """Why this layer's scale cannot be a block scale of its weight, or None."""
    if layer.scale is None:
        return "no weight_scale_inv"
    if layer.scale.dtype not in SCALE_DTYPES:
        return f"weight_scale_inv is {layer.scale.dtype}, expected one of {sorted(SCALE_DTYPES)}"
    if len(layer.weight.shape) != 2 or len(layer.scale.shape) != 2:
        return f"weight {list(layer.weight.shape)} / scale {list(layer.scale.shape)} are not both 2-D"
    if any(block_interval(n, s) is None for n, s in zip(layer.weight.shape, layer.scale.shape)):
        return f"scale {list(layer.scale.shape)} fits no block size for weight {list(layer.weight.shape)}"
    return None


def fits(layer: Fp8Layer, block: Block) -> bool:
    """True when ceil(weight / block) equals the scale shape in both dimensions."""
    assert layer.scale is not None
    return all(-(-n // b) == s for n, b, s in zip(layer.weight.shape, block, layer.scale.shape))


@dataclass(frozen=True)
class BlockVerdict:
    """The block size the layers agree on (None if they agree on none) and the outliers."""

    block: Block | None
    outliers: list[str]


def common_block(layers: Sequence[Fp8Layer], declared: Block | None = None) -> BlockVerdict:
    """Find one block size for all layers with a usable scale.

    With a `declared` size (the config's `weight_block_size`) every layer must fit it.
    Without one, each layer proposes the smallest power of two its shapes allow (else the
    smallest size) and the most common proposal wins; layers it does not fit are outliers.
    """
    usable = [layer for layer in layers if scale_problem(layer) is None]
    if not usable:
        return BlockVerdict(declared, [])
    block = declared or Counter(_proposal(layer) for layer in usable).most_common(1)[0][0]
    return BlockVerdict(block, [layer.module for layer in usable if not fits(layer, block)])


def _proposal(layer: Fp8Layer) -> Block:
    assert layer.scale is not None
    dims = []
    for n, s in zip(layer.weight.shape, layer.scale.shape):
        low, high = block_interval(n, s)  # type: ignore[misc]  # only for layers whose scale fits (scale_problem None): every dimension has an interval
        power = 1 << max(0, (low - 1).bit_length())
        dims.append(power if power <= high else low)
    return (dims[0], dims[1])


def declared_block(quant_config: Mapping[str, object] | None) -> Block | None:
    """`weight_block_size` of an FP8 quantization_config, when it is a pair of ints."""
    value = (quant_config or {}).get("weight_block_size")
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value):
        return (value[0], value[1])
    return None
