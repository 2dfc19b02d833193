"""TurboQuant KV-cache format for vLLM 0.18-0.19: specs, codebooks, rotation, byte layout and a
plain-PyTorch reference of store, dequantisation and decode attention.

The Triton kernels (tq_triton.py) must agree with the reference functions here; the tests and
ci/bench/bench_turboquant.py check that. Only torch, math, dataclasses and typing are imported so
the module works from the mod folder (tests) and installed inside vLLM
(vllm.v1.attention.ops.sparkmods_tq_format) alike.

What upstream vLLM 0.21.0 does (read in the PyPI wheel vllm-0.21.0-1-cp38-abi3-manylinux_2_24_x86_64,
facts only; paths below are inside that wheel)
---------------------------------------------------------------------------------------------
Names. ``--kv-cache-dtype`` accepts turboquant_k8v4, turboquant_4bit_nc, turboquant_k3v4_nc and
turboquant_3bit_nc (vllm/config/cache.py:27-30); each is stored in a uint8 tensor
(vllm/utils/torch_utils.py:46-49).

Bit budgets per preset (vllm/model_executor/layers/quantization/turboquant/config.py:20-41):

    name                 key                      value            norm correction
    turboquant_k8v4      FP8 e4m3, not rotated    4-bit uniform    no
    turboquant_4bit_nc   4-bit codebook, rotated  4-bit uniform    yes
    turboquant_k3v4_nc   3-bit codebook, rotated  4-bit uniform    yes
    turboquant_3bit_nc   3-bit codebook, rotated  3-bit uniform    yes

Keys (codebook presets). A key k is split into its length |k| and direction k/|k|; the direction
is rotated and every rotated coordinate is replaced by the nearest of 2^b scalar centroids
(store: ops/triton_turboquant_store.py:412-418 normalises and rotates with one matmul, then
:278-293 finds the bucket by binary search over the centroid midpoints). |k| is kept as one
float16 per key and head (store.py:317-325; config.py:121-136 counts 2 bytes). FP8 keys are the
raw key cast to e4m3 (float8e4nv on SM >= 8.9), one byte per element, nothing else
(store.py:188-194, config.py:132-133).

Rotation. A plain Sylvester Hadamard matrix divided by sqrt(D), the same for every layer, with no
random signs and no seed (v1/attention/backends/turboquant_attn.py:72-87 builds it, :336-350 says
signs were dropped because the codebook is symmetric; config.py:85 keeps a ``seed`` field that is
unused). The query is rotated once per decode step and scores are taken in the rotated space
(ops/triton_turboquant_decode.py:519-528).

Codebook. Lloyd-Max centroids for a Gaussian N(0, 1/D), the large-D limit of one coordinate of a
uniformly rotated unit vector, solved with trapezoid integrals at import time
(quantization/turboquant/centroids.py:31-79; get_centroids caches per (D, bits), :82-86).

``_nc`` (norm correction). At dequantisation the centroid vector c (one centroid per coordinate)
is divided by its own length before it is scaled by the stored |k|, so a reconstructed key has
exactly the original length (config.py:77-79; decode.py:199-206 and :396-400). The stored norm
stays |k|; the correction is recomputed on every read.

Values. Never rotated. Per key-value head and token: min and max over the D elements, scale =
(max - min) / (2^b - 1) (floored at 1e-8), code = floor((v - min) / scale + 0.5) clamped to
[0, 2^b - 1], then scale and min (the zero point) stored as two float16 (store.py:41-136;
config.py:144-150 counts ceil(D*b/8) + 4 bytes).

QJL. No 1-bit residual sketch: "QJL is intentionally omitted" (config.py:61-63).

Slot layout and size. Cache shape (num_blocks, block_size, num_kv_heads, slot) uint8 with no
leading K/V dimension (turboquant_attn.py:132-161); slot = [key bytes | value bytes] per token
and head, key bytes = D (FP8) or ceil(D*b/8) + 2, value bytes = ceil(D*b/8) + 4, rounded up to an
even count (config.py:121-168). The KV page of a layer is block_size * num_kv_heads * slot bytes
(v1/kv_cache_interface.py:297-311, TQFullAttentionSpec). Bytes per token per KV head:

    head size              128     256
    turboquant_k8v4        196     388
    turboquant_4bit_nc     134     262
    turboquant_k3v4_nc     118     230
    turboquant_3bit_nc     102     198
    (bf16: 512 and 1024)

Boundary layers (engine/arg_utils.py:1714-1723 adds them to kv_cache_dtype_skip_layers, which
makes those layers fall back to the model dtype, model_executor/layers/attention/attention.py:
246-263). Rule (config.py:170-206): for a hybrid model (attention + Mamba/linear attention) NO
layer is skipped, but the config must name its full-attention layers (``layer_types`` entries
"full_attention"/"attention", ``layers_block_type`` entries "attention"/"hybrid", or
``attn_type_list`` entries 1; config.py:229-254), else it refuses. For any other model the first
n and last n of num_hidden_layers are skipped, n = min(2, num_hidden_layers // 2).

Decode (decode.py:486-628): split-KV with a fixed number of splits
(tq_max_kv_splits_for_cuda_graph, default 32, vllm/config/attention.py:34) so CUDA graphs see a
constant grid; one program per (request, query head, split) and 4 tokens per step, then a
log-sum-exp merge of the splits. Prefill of a first chunk runs FlashAttention on the raw K/V;
0.21 forces FlashAttention 2 when a TurboQuant dtype is chosen (engine/arg_utils.py:2041-2051).

What this module does (same names, same meaning, same bit budgets; our own layout)
---------------------------------------------------------------------------------
* Same presets and bit widths, same per-vector float16 key norm and float16 value scale/zero,
  same value quantiser, same FP8 keys, no QJL, and ``_nc`` with the same meaning: the key is
  rebuilt with the original length. We fold the correction into the stored norm at store time
  (stored = |k| / |c|), so decode reads a key with one multiply instead of a second reduction;
  the reconstructed key is the same up to one float16 rounding.
* Rotation: a Hadamard matrix times a fixed pseudo-random +-1 diagonal (seeded, reproducible
  across machines and torch versions). On random vectors it behaves exactly as upstream's; on
  keys with structure (a key that is itself a Hadamard row, e.g. constant channels) it still
  spreads energy over every coordinate, which upstream's sign-free Hadamard does not.
* Codebook: Lloyd-Max for the exact marginal of one coordinate of a uniform unit vector in
  dimension D (density proportional to (1 - x^2)^((D-3)/2), TurboQuant paper, Lemma 1) rather
  than its Gaussian limit. At D = 256 the centroids differ from the Gaussian ones by under 1 %
  (the outermost 4-bit centroid, the largest gap, by 0.8 %; 1.6 % at D = 128), and the measured
  unit-vector MSE is the paper's (see PAPER_MSE and the tests).
* Byte layout: the same number of bytes per token and head as upstream (``slot_bytes``, never
  more), but within a KV page each KV head owns one contiguous region, and that region holds
  five sub-arrays, one entry per token: key codes | value codes | key norm | value scale |
  value zero. Every sub-array starts on a 16-byte boundary (block_size is a multiple of 16), so a
  decode program that handles one KV head for all its query heads reads a few long, aligned runs
  instead of one short strided record per token. 3-bit codes are stored as two bit planes (the
  low 2 bits four to a byte, the high bit eight to a byte) so unpacking is shifts of whole bytes.
  The tensor keeps upstream's shape (num_blocks, block_size, num_kv_heads, slot_bytes); only the
  bytes inside a page are ordered differently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch

DTYPES = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")

# TurboQuant paper (Zandieh et al., "TurboQuant: Online Vector Quantization with Near-optimal
# Distortion Rate", arXiv:2504.19874, Theorem 1): MSE of a unit vector quantised at b bits per
# coordinate with a random rotation and the Lloyd-Max codebook, b = 1..4, as the paper rounds them.
PAPER_MSE = {1: 0.36, 2: 0.117, 3: 0.03, 4: 0.009}

FP8_MAX = 448.0  # largest finite float8 e4m3fn; keys beyond it are clamped, never turned into NaN
_NORM_EPS = 1e-8  # keeps a zero key from dividing by zero; far below any real key length
_SCALE_FLOOR = 1e-8  # a constant value vector gets this scale and decodes to its zero point
ROTATION_SEED = 0x7A51  # any fixed number works; changing it changes every stored cache


@dataclass(frozen=True)
class TQSpec:
    """One TurboQuant preset: how many bits keys and values get and how keys are stored."""

    name: str
    key_bits: int  # 8 means FP8 keys (key_fp8); 3 or 4 means codebook indices
    value_bits: int  # uniform quantiser bits for values (3 or 4)
    key_fp8: bool
    norm_correction: bool


_SPECS = {
    "turboquant_k8v4": TQSpec("turboquant_k8v4", 8, 4, True, False),
    "turboquant_4bit_nc": TQSpec("turboquant_4bit_nc", 4, 4, False, True),
    "turboquant_k3v4_nc": TQSpec("turboquant_k3v4_nc", 3, 4, False, True),
    "turboquant_3bit_nc": TQSpec("turboquant_3bit_nc", 3, 3, False, True),
}


def tq_spec(kv_cache_dtype: str) -> TQSpec:
    """The preset named by a ``--kv-cache-dtype`` value; ValueError naming the valid ones."""
    spec = _SPECS.get(kv_cache_dtype)
    if spec is None:
        raise ValueError(f"unknown TurboQuant kv-cache dtype {kv_cache_dtype!r}; valid: {', '.join(DTYPES)}")
    return spec


def is_turboquant(kv_cache_dtype: str) -> bool:
    """True for the four TurboQuant dtype names (and nothing else, e.g. not 'fp8' or 'auto')."""
    return kv_cache_dtype in _SPECS


# ---------------------------------------------------------------------------------------------
# Byte layout
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotLayout:
    """Bytes per token of each sub-array in one KV head's region of a page.

    Inside a page, head h's region starts at h * block_size * slot_bytes; within it the
    sub-arrays follow in field order, each block_size entries long.
    """

    key_codes: int  # D (FP8) or D * key_bits / 8
    value_codes: int  # D * value_bits / 8
    key_norm: int  # 2 (float16) or 0 for FP8 keys
    value_scale: int = 2  # float16
    value_zero: int = 2  # float16

    @property
    def slot_bytes(self) -> int:
        return self.key_codes + self.value_codes + self.key_norm + self.value_scale + self.value_zero

    def offsets(self, block_size: int) -> Dict[str, int]:
        """Start of each sub-array relative to the head region, in bytes."""
        out: Dict[str, int] = {}
        pos = 0
        for name in ("key_codes", "value_codes", "key_norm", "value_scale", "value_zero"):
            out[name] = pos
            pos += block_size * getattr(self, name)
        return out


def check_head_size(head_size: int) -> None:
    """Kernels and the Hadamard rotation need a power of two in [16, 512]; say so plainly."""
    if head_size < 16 or head_size > 512 or head_size & (head_size - 1):
        raise ValueError(f"TurboQuant supports head sizes that are powers of two in [16, 512], not {head_size}")


def slot_layout(spec: TQSpec, head_size: int) -> SlotLayout:
    """The per-token sub-array sizes for a preset and head size."""
    check_head_size(head_size)
    key_codes = head_size if spec.key_fp8 else head_size * spec.key_bits // 8
    return SlotLayout(key_codes=key_codes, value_codes=head_size * spec.value_bits // 8, key_norm=0 if spec.key_fp8 else 2)


def slot_bytes(spec: TQSpec, head_size: int) -> int:
    """Bytes per token per KV head, K and V together; equal to upstream 0.21's slot_size_aligned."""
    return slot_layout(spec, head_size).slot_bytes


def cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int, spec: TQSpec) -> Tuple[int, int, int, int]:
    """Shape of the uint8 cache tensor of one layer (upstream's shape; our byte order in a page)."""
    if block_size % 16:
        raise ValueError(f"TurboQuant needs a block size that is a multiple of 16, not {block_size}")
    return (num_blocks, block_size, num_kv_heads, slot_bytes(spec, head_size))


def page_bytes(spec: TQSpec, block_size: int, num_kv_heads: int, head_size: int) -> int:
    """Bytes of one KV page of one layer (what the KV cache spec must report as page size)."""
    return block_size * num_kv_heads * slot_bytes(spec, head_size)


# ---------------------------------------------------------------------------------------------
# Boundary layers (upstream 0.21 rule)
# ---------------------------------------------------------------------------------------------


def _config_value(config: Any, name: str) -> Any:
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def full_attention_layer_ids(text_config: Any) -> Optional[List[int]]:
    """Indices of the full-attention layers a hybrid config names, or None if it names none.

    Reads the same three conventions as upstream 0.21: ``layer_types`` (Qwen3.5/Qwen3-Next),
    ``layers_block_type`` (Jamba, Zamba2), ``attn_type_list`` (MiniMax). ``text_config`` may be
    a dict (config.json) or a transformers config object.
    """
    layer_types = _config_value(text_config, "layer_types")
    if layer_types is not None:
        return [i for i, t in enumerate(layer_types) if t in ("full_attention", "attention")]
    block_types = _config_value(text_config, "layers_block_type")
    if block_types is not None:
        return [i for i, t in enumerate(block_types) if t in ("attention", "hybrid")]
    attn_types = _config_value(text_config, "attn_type_list")
    if attn_types is not None:
        return [i for i, t in enumerate(attn_types) if t == 1]
    return None


def boundary_layers(num_hidden_layers: int, attention_layer_ids: Optional[Sequence[int]] = None, n: int = 2) -> Set[int]:
    """Layer indices that keep an unquantised KV cache (upstream 0.21's boundary protection).

    ``attention_layer_ids`` is given for hybrid models (the full-attention layers): then no layer
    is skipped, as upstream 0.21 decided for hybrids (a hard 2 on each side would cover a large
    share of their few attention layers), but an empty list is refused as upstream refuses it.
    For other models the first n and last n layers are skipped, n capped at half the layers.
    """
    if attention_layer_ids is not None:
        if not list(attention_layer_ids):
            raise ValueError("TurboQuant needs the full-attention layers of a hybrid model, and its config names none")
        return set()
    if n <= 0 or num_hidden_layers <= 0:
        return set()
    n = min(n, num_hidden_layers // 2)
    return set(range(n)) | set(range(num_hidden_layers - n, num_hidden_layers))


# ---------------------------------------------------------------------------------------------
# Rotation
# ---------------------------------------------------------------------------------------------


def _splitmix64(state: int) -> Tuple[int, int]:
    """One step of SplitMix64: a tiny generator whose output no library version can change."""
    state = (state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return state, z ^ (z >> 31)


_ROTATIONS: Dict[Tuple[int, int], torch.Tensor] = {}


def rotation(head_size: int, device: Any = "cpu", seed: int = ROTATION_SEED) -> torch.Tensor:
    """The orthogonal D x D float32 matrix R; a key k is stored as codes of R @ (k / |k|).

    R = H diag(s) / sqrt(D) with H the Sylvester Hadamard matrix and s a +-1 vector from
    SplitMix64(seed). In row-vector form y = x @ R.T and x = y @ R.
    """
    check_head_size(head_size)
    key = (head_size, seed)
    cpu = _ROTATIONS.get(key)
    if cpu is None:
        h = torch.ones(1, 1, dtype=torch.float64)
        while h.shape[0] < head_size:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        state, signs = seed, []
        for _ in range(head_size):
            state, r = _splitmix64(state)
            signs.append(1.0 if r >> 63 else -1.0)
        cpu = (h * torch.tensor(signs, dtype=torch.float64)[None, :] / math.sqrt(head_size)).to(torch.float32)
        _ROTATIONS[key] = cpu
    return cpu.to(device)


# ---------------------------------------------------------------------------------------------
# Codebook: Lloyd-Max for one coordinate of a uniformly random unit vector
# ---------------------------------------------------------------------------------------------

_GRID_POINTS = 1 << 17


def _marginal_cdfs(head_size: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Grid x on [-1, 1] with cumulative integrals of f and x*f, f the coordinate density."""
    x = torch.linspace(-1.0, 1.0, _GRID_POINTS + 1, dtype=torch.float64)
    logf = 0.5 * (head_size - 3) * torch.log1p(-(x * x).clamp(max=1.0))
    f = torch.exp(logf - logf.max())
    dx = 2.0 / _GRID_POINTS

    def cumtrapz(y: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.zeros(1, dtype=y.dtype), torch.cumsum(0.5 * (y[1:] + y[:-1]) * dx, 0)])

    mass = cumtrapz(f)
    total = mass[-1]
    return x, mass / total, cumtrapz(x * f) / total


def _interp(t: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    i = torch.searchsorted(x, t).clamp(1, x.numel() - 1)
    w = (t - x[i - 1]) / (x[i] - x[i - 1])
    return y[i - 1] + w * (y[i] - y[i - 1])


_CODEBOOKS: Dict[Tuple[int, int], Tuple[torch.Tensor, float]] = {}


def _lloyd_max(head_size: int, bits: int) -> Tuple[torch.Tensor, float]:
    """Centroids (float64, ascending) and the MSE of a unit vector, D * E[(x - Q(x))^2]."""
    key = (head_size, bits)
    if key not in _CODEBOOKS:
        x, mass, first = _marginal_cdfs(head_size)
        levels = 1 << bits
        # start at the quantiles' midpoints of the distribution, then alternate the two conditions
        c = _interp((torch.arange(levels, dtype=torch.float64) + 0.5) / levels, mass, x)
        edges_mass = edges_first = None
        for _ in range(5000):
            edges = torch.cat([x[:1], 0.5 * (c[1:] + c[:-1]), x[-1:]])
            edges_mass = _interp(edges, x, mass)
            edges_first = _interp(edges, x, first)
            new = (edges_first[1:] - edges_first[:-1]) / (edges_mass[1:] - edges_mass[:-1])
            done = float((new - c).abs().max()) < 1e-15
            c = new
            if done:
                break
        assert edges_mass is not None and edges_first is not None
        # E[(x - c_i)^2] over cell i = E[x^2] - 2 c_i E[x] + c_i^2 P, with E[x^2] = 1/D overall
        p = edges_mass[1:] - edges_mass[:-1]
        ex = edges_first[1:] - edges_first[:-1]
        mse = head_size * (1.0 / head_size - float((2 * c * ex - c * c * p).sum()))
        _CODEBOOKS[key] = (c, mse)
    return _CODEBOOKS[key]


def codebook(head_size: int, bits: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(centroids [2^bits], midpoints [2^bits - 1]) as float32 on the CPU, ascending."""
    check_head_size(head_size)
    c = _lloyd_max(head_size, bits)[0]
    return c.to(torch.float32), (0.5 * (c[1:] + c[:-1])).to(torch.float32)


def codebook_mse(head_size: int, bits: int) -> float:
    """The codebook's MSE for a unit vector (no norm correction), from the integrals."""
    return _lloyd_max(head_size, bits)[1]


# ---------------------------------------------------------------------------------------------
# Quantisers and bit packing (reference; the Triton kernels produce the same bytes)
# ---------------------------------------------------------------------------------------------


def quantize_direction(y: torch.Tensor, bits: int, norm_correction: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """Codebook codes of rotated vectors y [..., D] (float32) and the length to store with them.

    The stored length is |y| (= |k|), or |y| / |c| with norm correction, where c is the vector
    of chosen centroids; decode rebuilds the rotated key as length * c.
    """
    centroids, midpoints = codebook(y.shape[-1], bits)
    norm = torch.sqrt((y * y).sum(-1))
    unit = y / (norm[..., None] + _NORM_EPS)
    codes = torch.bucketize(unit, midpoints.to(y.device))
    if norm_correction:
        c = centroids.to(y.device)[codes]
        norm = norm / torch.sqrt((c * c).sum(-1))
    return codes, norm


def quantize_uniform(v: torch.Tensor, bits: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-vector min/max quantiser: codes [..., D], float16 scale and zero point [...]."""
    top = (1 << bits) - 1
    lo = v.amin(-1)
    scale = torch.clamp((v.amax(-1) - lo) / top, min=_SCALE_FLOOR)
    zero16 = lo.to(torch.float16)
    codes = torch.floor((v - zero16.float()[..., None]) / scale[..., None] + 0.5).clamp(0, top).to(torch.int64)
    return codes, scale.to(torch.float16), zero16


def _planes(bits: int) -> List[Tuple[int, int]]:
    """(bit offset inside a code, bits per field) of each bit plane the codes are split into."""
    return {4: [(0, 4)], 3: [(0, 2), (2, 1)]}[bits]


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [..., D] (each < 2^bits) -> uint8 [..., D * bits / 8], little-end fields first.

    4 bits: byte j holds coordinate 2j in its low nibble and 2j+1 in its high nibble.
    3 bits: a plane of the low 2 bits (byte j holds coordinates 4j..4j+3, lowest bits first),
    then a plane of the high bit (byte j holds coordinates 8j..8j+7, bit 0 first).
    """
    out = []
    for shift, width in _planes(bits):
        per_byte = 8 // width
        field = ((codes >> shift) & ((1 << width) - 1)).reshape(*codes.shape[:-1], -1, per_byte)
        weights = torch.tensor([1 << (width * i) for i in range(per_byte)], device=codes.device)
        out.append((field * weights).sum(-1))
    return torch.cat(out, -1).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int, head_size: int) -> torch.Tensor:
    """Inverse of pack_codes: uint8 [..., D * bits / 8] -> int64 codes [..., D]."""
    codes = torch.zeros(*packed.shape[:-1], head_size, dtype=torch.int64, device=packed.device)
    start = 0
    for shift, width in _planes(bits):
        per_byte = 8 // width
        nbytes = head_size // per_byte
        plane = packed[..., start:start + nbytes].to(torch.int64)
        shifts = torch.arange(per_byte, device=packed.device) * width
        fields = (plane[..., None] >> shifts) & ((1 << width) - 1)
        codes |= fields.reshape(*packed.shape[:-1], head_size) << shift
        start += nbytes
    return codes


def fp8_bytes(x: torch.Tensor) -> torch.Tensor:
    """float -> float8 e4m3fn bytes (round to nearest even, clamped to +-448)."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


# ---------------------------------------------------------------------------------------------
# Reference store / dequant / decode
# ---------------------------------------------------------------------------------------------


def cache_geometry(kv_cache: torch.Tensor, spec: TQSpec, head_size: int) -> Tuple[int, int, SlotLayout]:
    """(block_size, num_kv_heads, layout) of a cache tensor, checked against the spec."""
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 4:
        raise ValueError(f"TurboQuant cache must be a 4-D uint8 tensor, got {kv_cache.dtype} {tuple(kv_cache.shape)}")
    layout = slot_layout(spec, head_size)
    _, block_size, num_kv_heads, slot = kv_cache.shape
    if slot != layout.slot_bytes:
        raise ValueError(f"cache slot of {slot} bytes does not match {spec.name} at head size {head_size} ({layout.slot_bytes} bytes)")
    return block_size, num_kv_heads, layout


def _region_index(kv_cache: torch.Tensor, layout: SlotLayout, block: torch.Tensor, pos: torch.Tensor, head: torch.Tensor, field: str) -> torch.Tensor:
    """Flat byte indices [..., width] of one sub-array entry for tokens at (block, pos, head)."""
    _, block_size, _, slot = kv_cache.shape
    width = getattr(layout, field)
    base = block * kv_cache.stride(0) + head * (block_size * slot) + layout.offsets(block_size)[field] + pos * width
    return base[..., None] + torch.arange(width, device=kv_cache.device)


def _flat(kv_cache: torch.Tensor) -> torch.Tensor:
    if kv_cache.stride(3) != 1 or kv_cache.stride(2) != kv_cache.shape[3] or kv_cache.stride(1) != kv_cache.shape[2] * kv_cache.shape[3]:
        raise ValueError("TurboQuant cache pages must be contiguous (block_size, heads, slot) runs")
    size = (kv_cache.shape[0] - 1) * kv_cache.stride(0) + kv_cache[0].numel() if kv_cache.shape[0] else 0
    return kv_cache.as_strided((size,), (1,))


def encode(key: torch.Tensor, value: torch.Tensor, spec: TQSpec) -> Dict[str, torch.Tensor]:
    """Quantise key/value [T, H, D] into the byte content of each sub-array, [T, H, width]."""
    head_size = key.shape[-1]
    if spec.key_fp8:
        fields = {"key_codes": fp8_bytes(key)}
    else:
        y = key.float() @ rotation(head_size, key.device).T
        codes, norm = quantize_direction(y, spec.key_bits, spec.norm_correction)
        fields = {"key_codes": pack_codes(codes, spec.key_bits), "key_norm": norm.to(torch.float16)[..., None].view(torch.uint8)}
    vcodes, scale, zero = quantize_uniform(value.float(), spec.value_bits)
    fields["value_codes"] = pack_codes(vcodes, spec.value_bits)
    fields["value_scale"] = scale[..., None].view(torch.uint8)
    fields["value_zero"] = zero[..., None].view(torch.uint8)
    return fields


def ref_store(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor, spec: TQSpec) -> None:
    """Quantise key/value [T, Hkv, D] into the cache at slot_mapping [T] (-1 = skip the token)."""
    head_size = key.shape[-1]
    block_size, num_kv_heads, layout = cache_geometry(kv_cache, spec, head_size)
    n = slot_mapping.shape[0]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    fields = encode(key[:n][keep], value[:n][keep], spec)
    flat = _flat(kv_cache)
    heads = torch.arange(num_kv_heads, device=kv_cache.device)[None, :]
    block, pos = (slots // block_size)[:, None], (slots % block_size)[:, None]
    for field, data in fields.items():
        flat[_region_index(kv_cache, layout, block, pos, heads, field)] = data


def _gather_fields(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: Sequence[int], spec: TQSpec, head_size: int) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
    """Raw sub-array bytes [B, L, H, width] of every cached token, and the validity mask [B, L]."""
    block_size, num_kv_heads, layout = cache_geometry(kv_cache, spec, head_size)
    lens = torch.as_tensor(seq_lens, device=kv_cache.device).long()
    max_len = max(int(lens.max()), 1) if lens.numel() else 1
    pos = torch.arange(max_len, device=kv_cache.device)
    valid = pos[None, :] < lens[:, None]
    pages = block_table.long()[:, torch.clamp(pos // block_size, max=block_table.shape[1] - 1)]
    block = torch.where(valid, pages, 0)[..., None]
    offs = (pos % block_size)[None, :, None]
    heads = torch.arange(num_kv_heads, device=kv_cache.device)[None, None, :]
    flat = _flat(kv_cache)
    fields = {name: flat[_region_index(kv_cache, layout, block, offs, heads, name)]
              for name in ("key_codes", "key_norm", "value_codes", "value_scale", "value_zero") if getattr(layout, name)}
    return fields, valid


def _half(raw: torch.Tensor) -> torch.Tensor:
    return raw.contiguous().view(torch.float16)[..., 0].float()


def decode_fields(fields: Dict[str, torch.Tensor], spec: TQSpec, head_size: int, rotated: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """float32 keys and values from sub-array bytes; keys in the rotated basis when ``rotated``."""
    if spec.key_fp8:
        k = fields["key_codes"].contiguous().view(torch.float8_e4m3fn).float()
    else:
        centroids = codebook(head_size, spec.key_bits)[0].to(fields["key_codes"].device)
        k = centroids[unpack_codes(fields["key_codes"], spec.key_bits, head_size)] * _half(fields["key_norm"])[..., None]
        if not rotated:
            k = k @ rotation(head_size, k.device)
    codes = unpack_codes(fields["value_codes"], spec.value_bits, head_size).float()
    v = codes * _half(fields["value_scale"])[..., None] + _half(fields["value_zero"])[..., None]
    return k, v


def ref_dequant(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: Sequence[int], spec: TQSpec, head_size: int, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of every request, padded with zeros: [B, max(seq_lens), Hkv, D] in dtype."""
    fields, valid = _gather_fields(kv_cache, block_table, seq_lens, spec, head_size)
    k, v = decode_fields(fields, spec, head_size, rotated=False)
    mask = valid[..., None, None]
    return torch.where(mask, k, 0.0).to(dtype), torch.where(mask, v, 0.0).to(dtype)


def ref_decode(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: Sequence[int], scale: float, spec: TQSpec) -> torch.Tensor:
    """Decode attention straight from the codes: scores in the rotated basis, float32 softmax.

    query [B, Hq, D] -> [B, Hq, D] in query's dtype; query head i reads KV head i // (Hq / Hkv).
    A request with no cached token gets zeros.
    """
    batch, num_q_heads, head_size = query.shape
    fields, valid = _gather_fields(kv_cache, block_table, seq_lens, spec, head_size)
    k, v = decode_fields(fields, spec, head_size, rotated=True)  # [B, L, Hkv, D]
    q = query.float()
    if not spec.key_fp8:
        q = q @ rotation(head_size, q.device).T
    q = q.reshape(batch, k.shape[2], num_q_heads // k.shape[2], head_size)  # [B, Hkv, G, D]
    scores = torch.einsum("bhgd,blhd->bhgl", q, k) * scale
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    return torch.einsum("bhgl,blhd->bhgd", probs, v).reshape(batch, num_q_heads, head_size).to(query.dtype)


def unit_vector_mse(head_size: int, bits: int, count: int, norm_correction: bool = False, seed: int = 0) -> float:
    """Measured MSE of ``count`` random unit vectors through rotate + codebook + rotate back."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(count, head_size, generator=gen, dtype=torch.float64)
    x = (x / x.norm(dim=-1, keepdim=True)).float()
    rot = rotation(head_size)
    codes, norm = quantize_direction(x @ rot.T, bits, norm_correction)
    recon = (codebook(head_size, bits)[0][codes] * norm[:, None]) @ rot
    return float(((recon.double() - x.double()) ** 2).sum(-1).mean())


def kv_bytes_per_token(kind: str, head_size: int, num_kv_heads: int) -> int:
    """KV-cache bytes per token per layer for 'bf16', 'fp8' or a TurboQuant dtype name."""
    if kind in ("bf16", "fp16", "auto"):
        return 2 * 2 * head_size * num_kv_heads
    if kind.startswith("fp8"):
        return 2 * head_size * num_kv_heads
    return slot_bytes(tq_spec(kind), head_size) * num_kv_heads

