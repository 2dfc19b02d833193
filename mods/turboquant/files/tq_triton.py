"""Triton kernels for the TurboQuant KV cache: store (quantise), split-KV decode attention and
dequantisation for prefill. The byte layout, codebooks and rotation are tq_format's; the
functions here give the same results as tq_format's reference functions within float rounding.

Why the decode kernel is shaped as it is: decode attention is a stream over the cache, and a
packed cache is 3-5x smaller than bf16, so the cost is the work per element that turns codes into
numbers the matrix unit reads (the committed H100 runs show the 3- and 4-bit caches read at a fraction of the
device copy rate where bf16 reaches it: ci/bench/results/turboquant-head*-any-h100/). So:
- One program serves one (request, KV head, split) and all the query heads of that KV head
  (GQA), so each element is decoded once for the group, which rides along as the rows of tl.dot.
- Nothing is reordered: element d is field d % F of word d // F, and field f of every word is one
  matrix product against query elements (keys) or into output columns (values) F w + f. The
  query is loaded field by field once per program; the output is written in place at the end.
- Values are affine (code * scale + zero): a field's code bits are masked in place and read as a
  float16 subnormal, code * 2^(shift - 24) exactly, so a value costs one AND (on a GPU, an AND of
  a 32-bit register decodes a field of two words at once: VALUE4_ASM); the probabilities
  are multiplied by the scale, the weight 2^(24 - shift) is applied to each field's sum once,
  and the zero points add as one weighted sum per row. The masks run on the words after they
  reach tl.dot's operand layout (Triton moves that conversion above elementwise work), so
  shared memory carries the 2-4 bit codes, not 16-bit values. 3-bit codes, stored as a plane of
  low bits and one of high bits, are merged into whole codes a word at a time first
  (_nibble_codes), so a field is one product, not two.
- Keys are never rotated back: the query is rotated once (q @ R.T) and scores are taken against
  the centroids, the per-token length applied to the score. A 4-bit centroid is gathered from a
  float16 table of one L1 sector; 3-bit centroids are looked up in registers on a GPU, 4 per
  byte permutation, two words at a time so that each result register already holds the pair
  of float16s tl.dot's operand wants (KEY3_PAIR_ASM, plain PTX); FP8 keys are converted by the
  float8 unpack.
Only portable Triton and PTX that every NVIDIA GPU has are used (tl.dot, plain loads, PRMT; no
TMA or warp-specialised instructions): the same source runs on SM90 and SM121.

CUDA graphs: tq_decode reads sequence lengths only on the device; its grid and buffers depend on
the batch size, the head counts and the block table's width (shapes), never on the values.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch
import triton
import triton.language as tl

try:  # installed inside vLLM next to its sibling modules
    from . import sparkmods_kerneltune as kt
    from . import sparkmods_tq_format as fmt
except ImportError:  # loaded from the mod folder (tests, benchmark), files/ on sys.path
    import sparkmods_kerneltune as kt  # type: ignore[no-redef]
    import tq_format as fmt  # type: ignore[no-redef]

logger = logging.getLogger(__name__)
TUNE_SECTION = "turboquant"
ENV_WARMUP = "SPARKMODS_TURBOQUANT_WARMUP"  # 0 (false, off, no): no start-up warm-up

@dataclass(frozen=True)
class DecodeConfig:
    """Tile and launch choices of the decode (the benchmark sweeps them).

    programs_per_sm sets the split count (more programs hide more memory latency); value_fields
    (3-bit values only) is 4 (the 2-bit fields of a byte, D/4 columns per product, the high-bit
    plane spread to that shape) or 8 (int16 words of 2-bit fields, D/8 columns, no spreading).
    """

    block_n: int  # tokens per tile
    num_warps: int
    num_stages: int
    min_chunk: int  # fewest tokens a split is given before another split is opened
    programs_per_sm: int = 2
    max_regs: int = 0  # register cap per thread (Triton's maxnreg); 0 = the compiler's choice
    value_fields: int = 4

    def __post_init__(self) -> None:
        if self.value_fields not in (4, 8):
            raise ValueError(f"value_fields must be 4 or 8, not {self.value_fields!r}")
        if self.block_n < 32 or self.block_n % 16:
            # 16-token tiles gave wrong 3-bit values (4 fields) at head 256 on the H100 with
            # Triton 3.6, though right under the interpreter: not offered
            raise ValueError(f"block_n must be a multiple of 16 and at least 32, not {self.block_n!r}")

    def label(self) -> str:
        """Short name for tables: nBLOCK_N/wWARPS/sSTAGES/cMIN_CHUNK/pPROGRAMS/rMAX_REGS/fVALUE_FIELDS."""
        return (f"n{self.block_n}/w{self.num_warps}/s{self.num_stages}/c{self.min_chunk}/p{self.programs_per_sm}"
                f"/r{self.max_regs}/f{self.value_fields}")


# Default decode config per (head size, batch band, context band, dtype), set from the
# benchmark's --sweep output (it prints these lines). Bands: batch "1" (one request) or "many";
# context "short" (a block table of < 16k tokens, i.e. --max-model-len) or "long". Dtype "*"
# serves every TurboQuant dtype; a dtype gets its own entry where its own best config in a band
# is clearly faster than the shared one, or where the shared one spills registers for it
# (ci/gb10_readiness.py). A shape with no entry uses the head size's "*" entry.
DEFAULT_DECODE: Dict[Tuple[int, str, str, str], DecodeConfig] = {
    (256, "1", "long", "*"): DecodeConfig(128, 4, 2, 128, 2, 0, 8),
    (256, "1", "short", "*"): DecodeConfig(128, 4, 2, 128, 2, 0, 8),
    (256, "1", "long", "turboquant_3bit_nc"): DecodeConfig(64, 4, 2, 128, 2, 0, 8),  # the shared one spills for it
    (256, "1", "short", "turboquant_3bit_nc"): DecodeConfig(64, 4, 2, 128, 2, 0, 8),  # the shared one spills for it
    (256, "many", "long", "*"): DecodeConfig(64, 2, 3, 128, 4, 0, 8),
    (256, "many", "long", "turboquant_3bit_nc"): DecodeConfig(64, 4, 2, 128, 4, 0, 8),  # the shared one spills for it
    (256, "many", "short", "*"): DecodeConfig(64, 8, 2, 256, 4, 0, 4),
    (256, "*", "*", "*"): DecodeConfig(64, 4, 2, 128, 4, 0, 8),
    (128, "1", "long", "*"): DecodeConfig(128, 4, 2, 128, 2, 0, 4),
    (128, "1", "short", "*"): DecodeConfig(128, 4, 2, 128, 2, 0, 4),
    (128, "many", "long", "*"): DecodeConfig(128, 4, 2, 256, 4, 0, 4),
    (128, "many", "long", "turboquant_3bit_nc"): DecodeConfig(64, 2, 2, 128, 4, 0, 8),
    (128, "many", "short", "*"): DecodeConfig(128, 4, 2, 256, 4, 0, 4),
    (128, "*", "*", "*"): DecodeConfig(128, 4, 2, 256, 4, 0, 4),
}


def shape_band(batch: int, max_context: int) -> Tuple[str, str]:
    """The (batch band, context band) of a decode call, the keys of DEFAULT_DECODE. max_context is
    what the block table can hold (under vLLM: --max-model-len), not the requests' context: a
    captured CUDA graph serves every context with one config."""
    return ("1" if batch <= 1 else "many", "short" if max_context < 16384 else "long")


def default_decode_config(head_size: int, batch: int = 1, max_context: int = 0, dtype: str = "*",
                          table: Optional[Dict[Tuple[int, str, str, str], DecodeConfig]] = None) -> DecodeConfig:
    """The table's choice (DEFAULT_DECODE unless given) for this shape and TurboQuant dtype: the
    dtype's own entry for the band, else the shared one, else the batch or context band's, else
    the head size's "*"; head sizes without an entry use the 256 or 128 one."""
    table = DEFAULT_DECODE if table is None else table
    table_head = head_size if any(k[0] == head_size for k in table) else (256 if head_size >= 256 else 128)
    batch_band, context_band = shape_band(batch, max_context)
    for key in ((table_head, batch_band, context_band, dtype), (table_head, batch_band, context_band, "*"),
                (table_head, batch_band, "*", "*"), (table_head, "*", context_band, "*"), (table_head, "*", "*", "*")):
        if key in table:
            return table[key]
    raise KeyError(f"DEFAULT_DECODE has no entry for head size {table_head}")


def decode_shared_bytes(cfg: DecodeConfig, spec: fmt.TQSpec, head_size: int, group: int) -> int:
    """Byte model of the decode kernel's shared memory (an upper bound; the GB10 readiness check
    compares it with what Triton allocates for every config the mod can pick).

    What goes through shared memory is tl.dot's operands on their way to the matrix layout: the
    query fields once (GP x D in fp16), then per token of a tile the key operand and the words it
    is decoded from (fp16 keys from the 3-bit lookup and their code words, 4-byte words of 4-bit
    codes, or FP8 bytes) and the value operand (the probabilities in fp16 and the value code
    words), counted as if all were alive at once. The pipeline depth adds nothing: the cache is
    read by gathered pointers, not async copies.
    """
    gp = max(16, triton.next_power_of_2(group))
    kw = max(head_size // 8, 16)
    vw = max(head_size // (cfg.value_fields if spec.value_bits == 3 else 4), 16)
    if spec.key_fp8:
        query, key = 2 * gp * head_size, head_size
    else:
        query, key = 2 * gp * 8 * kw, (19 * kw if spec.key_bits == 3 else 4 * kw)
    value = 2 * gp + (4 * vw if spec.value_bits == 3 else 2 * vw)
    return query + cfg.block_n * (key + value)


DECODE_FIT_STEPS = (("block_n", 32),)  # fewer tokens per tile: the per-token operands shrink


def fitted_decode_config(cfg: DecodeConfig, spec: fmt.TQSpec, head_size: int, group: int,
                         shared_memory_per_block: int) -> Optional[DecodeConfig]:
    """cfg lowered by the shared fitting rule (kt.fit) to a device's shared memory, or None."""
    return kt.fit(cfg, lambda c: decode_shared_bytes(c, spec, head_size, group), kt.budget(shared_memory_per_block),
                  DECODE_FIT_STEPS)


def tuned_decode_table(gpu: Dict[str, Any], path: Optional[Any] = None) -> Dict[Tuple[int, str, str, str], DecodeConfig]:
    """DEFAULT_DECODE with the tune table's entries for this GPU on top; DEFAULT_DECODE alone
    (and one log line saying why) when the table must not be used."""
    where = path or kt.table_path()
    try:
        entries = kt.read_section(TUNE_SECTION, kt.source_digest(__file__), gpu, path)
        if entries is None:
            return DEFAULT_DECODE
        tuned = decode_entries(entries)
    except kt.TableRefused as exc:
        logger.warning("sparkmods turboquant: tune table not used: %s", exc)
        return DEFAULT_DECODE
    except (TypeError, ValueError) as exc:
        logger.warning("sparkmods turboquant: tune table not used: %s: bad entry (%s); run `sparkmods tune` again", where, exc)
        return DEFAULT_DECODE
    logger.info("sparkmods turboquant: decode configs from the tune table %s (%d entries)", where, len(tuned))
    return {**DEFAULT_DECODE, **tuned}


_BANDS = ("1", "many", "*")
_CONTEXTS = ("short", "long", "*")


def decode_entries(entries: Any) -> Dict[Tuple[int, str, str, str], DecodeConfig]:
    """A tune table's turboquant entries ([head, batch band, context band, dtype, *DecodeConfig fields])
    as DEFAULT_DECODE keys and configs; ValueError naming the first bad one."""
    out: Dict[Tuple[int, str, str, str], DecodeConfig] = {}
    for entry in entries:
        if not isinstance(entry, list) or len(entry) != 11 or not all(isinstance(v, int) for v in entry[:1] + entry[4:]):
            raise ValueError(f"{entry!r} is not [head, batch band, context band, dtype, 7 integers]")
        head, batch_band, context_band, dtype = entry[:4]
        if batch_band not in _BANDS or context_band not in _CONTEXTS or not (dtype == "*" or fmt.is_turboquant(dtype)):
            raise ValueError(f"{entry!r} names no band or dtype")
        fmt.check_head_size(head)
        cfg = DecodeConfig(*entry[4:])
        if (cfg.block_n > 512 or cfg.num_warps not in (1, 2, 4, 8, 16) or not 1 <= cfg.num_stages <= 8
                or not 16 <= cfg.min_chunk <= 1 << 20 or not 1 <= cfg.programs_per_sm <= 64 or not 0 <= cfg.max_regs <= 255):
            raise ValueError(f"{entry!r} has a value out of range")
        out[(head, batch_band, context_band, dtype)] = cfg
    return out


@functools.lru_cache(maxsize=None)
def _device_tuning(index: int) -> Tuple[int, Dict[Tuple[int, str, str, str], DecodeConfig]]:
    """A CUDA device's opt-in shared memory per block and its decode table (read once per process)."""
    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", kt.SM12X_SHARED_MEMORY)
    return smem, tuned_decode_table(kt.gpu_identity(props.name, (props.major, props.minor)))


def decode_config(spec: fmt.TQSpec, head_size: int, group: int, batch: int, max_context: int, device: torch.device) -> DecodeConfig:
    """The decode config tq_decode uses: the table's (the tune table's on top of DEFAULT_DECODE on
    a GPU), fitted to the device's shared memory; the interpreter on CPU takes the table as is."""
    if device.type != "cuda":
        return default_decode_config(head_size, batch, max_context, spec.name)
    smem, table = _device_tuning(device.index if device.index is not None else torch.cuda.current_device())
    cfg = None
    for source in (table, DEFAULT_DECODE):  # a tuned entry that cannot fit yields to the shipped one
        cfg = cfg or fitted_decode_config(default_decode_config(head_size, batch, max_context, spec.name, source),
                                          spec, head_size, group, smem)
    if cfg is None:
        raise RuntimeError(f"sparkmods turboquant: no decode tile fits {smem} bytes of shared memory at head size "
                           f"{head_size} and {group} query heads per KV head")
    return cfg


@dataclass(frozen=True)
class _Tables:
    rotation_t: torch.Tensor  # [D, D] float32, R.T (keys and queries are multiplied by it)
    rotation: torch.Tensor  # [D, D] float32, R (rotates dequantised keys back)
    centroids: torch.Tensor  # [2^bits] float32
    centroids_half: torch.Tensor  # [2^bits] float16 (decode feeds the matrix unit in fp16)
    midpoints: torch.Tensor  # [2^bits - 1] float32
    byte_tables: Tuple[int, int, int, int]  # the 3-bit codebook in fp16 as PRMT byte tables (lut_words)


_TABLES: Dict[Tuple[str, int, str], _Tables] = {}


def tables(spec: fmt.TQSpec, head_size: int, device: Any) -> _Tables:
    """Device copies of the rotation and codebook, built once per (preset, head size, device).

    Call it once before CUDA-graph capture (vLLM's warm-up run does): the first call copies to
    the device, which a capture would not allow.
    """
    key = (spec.name, head_size, str(torch.device(device)))
    found = _TABLES.get(key)
    if found is None:
        rot = fmt.rotation(head_size, device)
        bits = spec.value_bits if spec.key_fp8 else spec.key_bits  # FP8 keys use no codebook
        centroids, midpoints = fmt.codebook(head_size, bits)
        half = centroids.to(torch.float16)
        found = _Tables(rot.T.contiguous(), rot.contiguous(), centroids.to(device), half.to(device), midpoints.to(device),
                        lut_words(half) if half.numel() == 8 else (0, 0, 0, 0))
        _TABLES[key] = found
    return found


def _layout_constants(spec: fmt.TQSpec, layout: fmt.SlotLayout, block_size: int) -> Dict[str, int]:
    offsets = layout.offsets(block_size)
    return {
        "SLOT": layout.slot_bytes,
        "KEY_FP8": int(spec.key_fp8),
        "KEY_BITS": spec.key_bits,
        "VALUE_BITS": spec.value_bits,
        "KEY_CODE_BYTES": layout.key_codes,
        "VALUE_CODE_BYTES": layout.value_codes,
        "OFF_VC": offsets["value_codes"],
        "OFF_KN": offsets["key_norm"],
        "OFF_VS": offsets["value_scale"],
        "OFF_VZ": offsets["value_zero"],
    }


# ---------------------------------------------------------------------------------------------
# Bit packing helpers (device side)
# ---------------------------------------------------------------------------------------------


@triton.jit
def _pack_plane(rows, valid, codes, SHIFT: tl.constexpr, WIDTH: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr):
    """Store one bit plane of codes [BLOCK_T, D] at byte pointers rows [BLOCK_T]: 8 / WIDTH fields
    per byte, the lowest field first."""
    PER: tl.constexpr = 8 // WIDTH
    fields = tl.reshape((codes >> SHIFT) & ((1 << WIDTH) - 1), [BLOCK_T, D // PER, PER])
    packed = tl.sum(fields << (tl.arange(0, PER) * WIDTH)[None, None, :], axis=2)
    tl.store(rows[:, None] + tl.arange(0, D // PER)[None, :], packed.to(tl.uint8), mask=valid[:, None])


@triton.jit
def _pack_codes(rows, valid, codes, BITS: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr):
    """Store codes [BLOCK_T, D] as tq_format.pack_codes lays them out (4 bits: nibbles; 3 bits:
    a plane of the low 2 bits, then one of the high bit)."""
    if BITS == 4:
        _pack_plane(rows, valid, codes, 0, 4, D, BLOCK_T)
    else:
        _pack_plane(rows, valid, codes, 0, 2, D, BLOCK_T)
        _pack_plane(rows + D // 4, valid, codes, 2, 1, D, BLOCK_T)


@triton.jit
def _load_plane(rows, valid, WIDTH: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Fields [BLOCK_N, D] of one bit plane; rows [BLOCK_N] are byte pointers to each token's plane."""
    PER: tl.constexpr = 8 // WIDTH
    raw = tl.load(rows[:, None] + tl.arange(0, D // PER)[None, :], mask=valid[:, None], other=0).to(tl.int32)
    fields = (raw[:, :, None] >> (tl.arange(0, PER) * WIDTH)[None, None, :]) & ((1 << WIDTH) - 1)
    return tl.reshape(fields, [BLOCK_N, D])


@triton.jit
def _load_codes(rows, valid, BITS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Codes [BLOCK_N, D] (int32) of BLOCK_N tokens whose code bytes start at rows."""
    if BITS == 4:
        codes = _load_plane(rows, valid, 4, D, BLOCK_N)
    else:
        codes = _load_plane(rows, valid, 2, D, BLOCK_N) | (_load_plane(rows + D // 4, valid, 1, D, BLOCK_N) << 2)
    return codes


@triton.jit
def _load_half(ptr, pos, valid):
    """float32 of the float16 entries pos [N] of a sub-array that starts at byte pointer ptr."""
    return tl.load(ptr.to(tl.pointer_type(tl.float16)) + pos, mask=valid, other=0.0).to(tl.float32)


@triton.jit
def _token_bases(cache_ptr, bt_row_ptr, offs, valid, page_stride, head_base, BLOCK_SIZE: tl.constexpr):
    """Byte pointer to each token's head region and its position inside the page."""
    page = tl.load(bt_row_ptr + offs // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    return cache_ptr + page * page_stride + head_base, offs % BLOCK_SIZE


@triton.jit
def _round_to_e4m3(x):
    """x clamped to +-448 and rounded to the nearest float8 e4m3 value (ties to even), in float32.

    The cast to float8 that follows is then exact everywhere; Triton's CPU interpreter rounds
    ties away and can drop a carry into the exponent, hardware rounds to even.
    """
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    exponent = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    step = ((tl.maximum(exponent, -6) - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 3 mantissa bits
    magic = 12582912.0  # 1.5 * 2^23: adding and removing it rounds to an integer, ties to even
    rounded = ((x / step + magic) - magic) * step
    return tl.where(rounded == 0.0, x * 0.0, rounded)  # keep the sign of a value that rounds to zero


# ---------------------------------------------------------------------------------------------
# Store
# ---------------------------------------------------------------------------------------------


@triton.jit
def _store_keys(key_ptr, region, row, head, pos, valid, d, centroid_ptr, midpoint_ptr, stride_kt, stride_kh,
                D: tl.constexpr, KEY_FP8: tl.constexpr, KEY_BITS: tl.constexpr, KEY_CODE_BYTES: tl.constexpr,
                OFF_KN: tl.constexpr, NORM_CORRECTION: tl.constexpr, N_MID: tl.constexpr, N_MID_P: tl.constexpr,
                BLOCK_T: tl.constexpr):
    """Keys: FP8 as they are, or codebook codes of the unit vector and its norm."""
    x = tl.load(key_ptr + row * stride_kt + head * stride_kh + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
    key_rows = region + pos * KEY_CODE_BYTES
    if KEY_FP8:
        k8 = _round_to_e4m3(x).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        tl.store(key_rows[:, None] + d[None, :], k8, mask=valid[:, None])
    else:
        norm = tl.sqrt_rn(tl.sum(x * x, axis=1))
        unit = tl.div_rn(x, norm[:, None] + 1e-8)
        j = tl.arange(0, N_MID_P)
        mids = tl.load(midpoint_ptr + j, mask=j < N_MID, other=float("inf"))
        codes = tl.sum((unit[:, :, None] > mids[None, None, :]).to(tl.int32), axis=2)
        if NORM_CORRECTION:
            c = tl.load(centroid_ptr + codes)
            norm = tl.div_rn(norm, tl.sqrt_rn(tl.sum(c * c, axis=1)))
        _pack_codes(key_rows, valid, codes, KEY_BITS, D, BLOCK_T)
        tl.store((region + OFF_KN).to(tl.pointer_type(tl.float16)) + pos, norm.to(tl.float16), mask=valid)


@triton.jit
def _store_values(value_ptr, region, row, head, pos, valid, d, stride_vt, stride_vh, D: tl.constexpr,
                  VALUE_BITS: tl.constexpr, VALUE_CODE_BYTES: tl.constexpr, OFF_VC: tl.constexpr, OFF_VS: tl.constexpr,
                  OFF_VZ: tl.constexpr, BLOCK_T: tl.constexpr):
    """Values: uniform codes between each token's minimum and maximum, with its scale and zero."""
    v = tl.load(value_ptr + row * stride_vt + head * stride_vh + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
    top = (1 << VALUE_BITS) - 1
    lo = tl.min(v, axis=1)
    scale = tl.maximum(tl.div_rn(tl.max(v, axis=1) - lo, top * 1.0), 1e-8)
    zero = lo.to(tl.float16)
    q = tl.floor(tl.div_rn(v - zero.to(tl.float32)[:, None], scale[:, None]) + 0.5)
    vcodes = tl.minimum(tl.maximum(q, 0.0), top * 1.0).to(tl.int32)
    _pack_codes(region + OFF_VC + pos * VALUE_CODE_BYTES, valid, vcodes, VALUE_BITS, D, BLOCK_T)
    tl.store((region + OFF_VS).to(tl.pointer_type(tl.float16)) + pos, scale.to(tl.float16), mask=valid)
    tl.store((region + OFF_VZ).to(tl.pointer_type(tl.float16)) + pos, zero, mask=valid)


@triton.jit(do_not_specialize=["num_tokens"])
def _store_kernel(key_ptr, value_ptr, cache_ptr, slot_ptr, centroid_ptr, midpoint_ptr, num_tokens,
                  stride_kt, stride_kh, stride_vt, stride_vh, page_stride,
                  D: tl.constexpr, BLOCK_SIZE: tl.constexpr, SLOT: tl.constexpr,
                  KEY_FP8: tl.constexpr, KEY_BITS: tl.constexpr, VALUE_BITS: tl.constexpr,
                  KEY_CODE_BYTES: tl.constexpr, VALUE_CODE_BYTES: tl.constexpr,
                  OFF_VC: tl.constexpr, OFF_KN: tl.constexpr, OFF_VS: tl.constexpr, OFF_VZ: tl.constexpr,
                  NORM_CORRECTION: tl.constexpr, N_MID: tl.constexpr, N_MID_P: tl.constexpr, BLOCK_T: tl.constexpr):
    """One program per (BLOCK_T tokens, KV head, part): part 0 quantises the keys, part 1 the values,
    so a decode step's few tokens spread over twice the programs and neither waits for the other."""
    head = tl.program_id(1)
    token = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    slot = tl.load(slot_ptr + token, mask=token < num_tokens, other=-1).to(tl.int64)
    valid = slot >= 0
    page = tl.where(valid, slot // BLOCK_SIZE, 0)
    pos = tl.where(valid, slot % BLOCK_SIZE, 0)
    region = cache_ptr + page * page_stride + head * (BLOCK_SIZE * SLOT)
    d = tl.arange(0, D)
    row = token.to(tl.int64)[:, None]
    if tl.program_id(2) == 0:
        _store_keys(key_ptr, region, row, head, pos, valid, d, centroid_ptr, midpoint_ptr, stride_kt, stride_kh,
                    D, KEY_FP8, KEY_BITS, KEY_CODE_BYTES, OFF_KN, NORM_CORRECTION, N_MID, N_MID_P, BLOCK_T)
    else:
        _store_values(value_ptr, region, row, head, pos, valid, d, stride_vt, stride_vh,
                      D, VALUE_BITS, VALUE_CODE_BYTES, OFF_VC, OFF_VS, OFF_VZ, BLOCK_T)


@triton.jit(do_not_specialize=["rows"])
def _rotate_kernel(x_ptr, r_ptr, out_ptr, rows, stride_x, D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """out[rows, D] = x[rows, D] @ R (float32, IEEE products: the scores and codes depend on it)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = r < rows
    acc = tl.zeros((BLOCK_R, BLOCK_C), tl.float32)
    for k0 in range(0, D, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        xs = tl.load(x_ptr + r[:, None].to(tl.int64) * stride_x + k[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        acc = tl.dot(xs, tl.load(r_ptr + k[:, None] * D + c[None, :]), acc, input_precision="ieee")
    tl.store(out_ptr + r[:, None].to(tl.int64) * D + c[None, :], acc, mask=ok[:, None])


@triton.jit(do_not_specialize=["rows_x", "rows"])
def _rotate_few_kernel(x_ptr, y_ptr, r_ptr, out_ptr, rows_x, rows, stride_x, stride_y, D: tl.constexpr,
                       BLOCK_C: tl.constexpr, ROWS_PER: tl.constexpr):
    """out = [x; y] @ R for a few rows (a decode step's query heads and its tokens' keys: one launch
    for both): a program holds a [D, BLOCK_C] block of R and takes ROWS_PER rows one after another,
    each a float32 product and one sum over D. _rotate_kernel's tiles of 16 rows and its chain of
    matrix steps over D cost more than the arithmetic at this size."""
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    k = tl.arange(0, D)
    rot = tl.load(r_ptr + k[:, None] * D + c[None, :])
    for j in tl.static_range(ROWS_PER):
        row = (tl.program_id(0) * ROWS_PER + j).to(tl.int64)
        in_x = row < rows_x
        x = tl.load(x_ptr + row * stride_x + k, mask=(k < D) & in_x, other=0.0).to(tl.float32)
        x += tl.load(y_ptr + (row - rows_x) * stride_y + k, mask=(k < D) & ~in_x & (row < rows), other=0.0).to(tl.float32)
        tl.store(out_ptr + row * D + c, tl.sum(x[:, None] * rot, axis=0), mask=(c < D) & (row < rows))


ROTATE_FEW_ROWS = 256  # rotate() takes _rotate_few_kernel up to this many rows, _rotate_kernel above
ROTATE_ROWS_PER = 4


def rotate_tiling(rows: int) -> bool:
    """Which kernel rotate() launches for this many rows (True: the tiled one): a compile variant."""
    return rows > ROTATE_FEW_ROWS


def rotate_few_columns(head_size: int) -> int:
    """Columns of R a _rotate_few_kernel program holds: a [D, BLOCK_C] block, 64 values a thread."""
    return min(head_size, max(16, 8192 // head_size))


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] as rows [N, D] with a contiguous last dimension (a view where strides allow)."""
    flat = x.reshape(-1, x.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def _rotate_few(x: torch.Tensor, y: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """[x; y] @ rotation in float32, rows [N, D] each, by one _rotate_few_kernel launch."""
    head_size = x.shape[-1]
    rows = x.shape[0] + y.shape[0]
    out = torch.empty(rows, head_size, dtype=torch.float32, device=x.device)
    if rows:
        block_c = rotate_few_columns(head_size)
        _rotate_few_kernel[(triton.cdiv(rows, ROTATE_ROWS_PER), head_size // block_c)](
            x, y, rotation, out, x.shape[0], rows, x.stride(0), y.stride(0), D=head_size, BLOCK_C=block_c,
            ROWS_PER=ROTATE_ROWS_PER, num_warps=4)
    return out


def rotate(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """x [..., D] @ rotation [D, D] in float32, shaped like x.

    Not torch.matmul: a decode step rotates a handful of rows (a query's heads, one token's keys),
    where cuBLAS's float32 GEMM costs more than the decode attention itself
    (ci/bench/results/turboquant-rotate-any-h100.md).
    """
    head_size = x.shape[-1]
    flat = _rows(x)
    rows = flat.shape[0]
    if not rotate_tiling(rows):
        return _rotate_few(flat, flat[:0], rotation).view(*x.shape[:-1], head_size)
    out = torch.empty(rows, head_size, dtype=torch.float32, device=x.device)
    block_c = min(64, head_size)
    _rotate_kernel[(triton.cdiv(rows, 64), head_size // block_c)](
        flat, rotation, out, rows, flat.stride(0), D=head_size, BLOCK_R=64, BLOCK_C=block_c,
        BLOCK_K=min(32, head_size), num_warps=4)
    return out.view(*x.shape[:-1], head_size)


def rotate_pair(x: torch.Tensor, y: torch.Tensor, rotation: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(x @ rotation, y @ rotation) as rotate() gives them, in one launch when their rows together
    are few (a decode step's queries and keys: each launch costs about as much as its arithmetic)."""
    fx, fy = _rows(x), _rows(y)
    if rotate_tiling(fx.shape[0] + fy.shape[0]):
        return rotate(x, rotation), rotate(y, rotation)
    out = _rotate_few(fx, fy, rotation)
    head_size = x.shape[-1]
    return out[:fx.shape[0]].view(*x.shape[:-1], head_size), out[fx.shape[0]:].view(*y.shape[:-1], head_size)


def tq_store(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor, spec: fmt.TQSpec,
             *, rotated: bool = False) -> None:
    """Quantise key/value [T, Hkv, D] into the cache at slot_mapping (-1 = skip the token).

    Only the first len(slot_mapping) tokens are read (vLLM pads key/value past them). rotated:
    the keys are rotate()'s float32 output already (tq_store_decode rotates them with the queries).
    """
    n = slot_mapping.shape[0]
    head_size = key.shape[-1]
    block_size, num_kv_heads, layout = fmt.cache_geometry(kv_cache, spec, head_size)
    if n == 0:
        return
    tab = tables(spec, head_size, key.device)
    keys = key[:n] if spec.key_fp8 or rotated else rotate(key[:n], tab.rotation_t)
    values = value[:n]
    if keys.stride(-1) != 1 or values.stride(-1) != 1:
        raise ValueError("tq_store needs key and value with a contiguous last dimension")
    n_mid = tab.midpoints.numel()
    block_t = store_tokens(n * num_kv_heads)
    _store_kernel[(triton.cdiv(n, block_t), num_kv_heads, 2)](
        keys, values, kv_cache, slot_mapping, tab.centroids, tab.midpoints, n,
        keys.stride(0), keys.stride(1), values.stride(0), values.stride(1), kv_cache.stride(0),
        D=head_size, BLOCK_SIZE=block_size, NORM_CORRECTION=int(spec.norm_correction),
        N_MID=n_mid, N_MID_P=triton.next_power_of_2(n_mid), BLOCK_T=block_t,
        **_layout_constants(spec, layout, block_size), num_warps=store_warps(head_size, block_t))


def store_tokens(rows: int) -> int:
    """Tokens a store program quantises: one for a decode step's few (rows = tokens x KV heads, the
    rotate kernel's rule), so they spread over many programs; four for a prefill's."""
    return 4 if rotate_tiling(rows) else 1


def store_warps(head_size: int, tokens: int) -> int:
    """Warps of the store kernel: a program's code search ([tokens, D, codebook midpoints]) over 8
    above 512 elements (a prefill's four tokens at head 256 or 512), since with 4 the 4-bit store
    spills registers there (ci/bench/results/gb10-readiness-any-cpu/)."""
    return 4 if head_size * tokens <= 512 else 8


# ---------------------------------------------------------------------------------------------
# Decode
# ---------------------------------------------------------------------------------------------


@triton.jit
def _split_range(seq_len, split, num_splits, BLOCK_N: tl.constexpr, MIN_CHUNK: tl.constexpr):
    """Splits in use for this length and the [start, end) this split covers (device-side only)."""
    used = tl.minimum(num_splits, tl.cdiv(seq_len, MIN_CHUNK))
    chunk = tl.cdiv(tl.cdiv(seq_len, tl.maximum(used, 1)), BLOCK_N) * BLOCK_N
    start = split * chunk
    return used, start, tl.minimum(start + chunk, seq_len)


@triton.jit
def _group_rows(kv_head, G: tl.constexpr, GP: tl.constexpr):
    """Row indices [GP] of the query heads that share kv_head, which of them exist, and their heads."""
    rows = tl.arange(0, GP)
    return rows < G, kv_head * G + rows


@triton.jit
def _tile(cache_ptr, bt_ptr, req, stride_bt, kv_head, n0, end, page_stride,
          BLOCK_SIZE: tl.constexpr, SLOT: tl.constexpr, KEY_CODE_BYTES: tl.constexpr, BLOCK_N: tl.constexpr):
    """Tokens n0 .. n0+BLOCK_N-1 of a split ending at end: which exist, the byte pointer to each
    one's KV-head region, its position in the page and the start of its key codes."""
    offs = n0 + tl.arange(0, BLOCK_N)
    valid = offs < end
    region, pos = _token_bases(cache_ptr, bt_ptr + req.to(tl.int64) * stride_bt, offs, valid, page_stride,
                               kv_head * (BLOCK_SIZE * SLOT), BLOCK_SIZE)
    return valid, region, pos, region + pos * KEY_CODE_BYTES


@triton.jit
def _fp8_scores(q, key_rows, valid, qk_scale, D: tl.constexpr):
    """Scores (log2 units) of q [GP, D] against FP8 keys stored as D bytes per token."""
    raw = tl.load(key_rows[:, None] + tl.arange(0, D)[None, :], mask=valid[:, None], other=0)
    return tl.dot(q, tl.trans(raw.to(tl.float8e4nv, bitcast=True).to(tl.float16))) * qk_scale


@triton.jit
def _online_softmax(qk, valid, m_i):
    """One tile's step of the running softmax: new row maxima, the rescale of what came before and
    the tile's unnormalised probabilities (tokens past the split's end get none)."""
    qk = tl.where(valid[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    return m_new, tl.exp2(m_i - m_new), tl.exp2(qk - m_new[:, None])


@triton.jit
def _zero_and_mass(acc_zero, l_i, alpha, p, vzero_ptr, pos, valid):
    """Running sums of probability x value zero point (added to every output element) and of
    probability (the softmax denominator)."""
    acc_zero = acc_zero * alpha + tl.sum(p * _load_half(vzero_ptr, pos, valid)[None, :], axis=1)
    return acc_zero, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _part_index(req, kv_head, split, num_splits, q_heads, G: tl.constexpr):
    """Row of each query head's partial result of this split in part_o / part_lse."""
    return (req * tl.num_programs(1) * G + q_heads) * num_splits + split


@triton.jit
def _store_lse(part_lse_ptr, part, row_ok, m_i, l_i):
    """Log2-sum-exp of each row's scores (-inf for a split that saw no token: the merge skips it)."""
    filled = l_i > 0.0
    tl.store(part_lse_ptr + part, tl.where(filled, m_i + tl.log2(tl.where(filled, l_i, 1.0)), float("-inf")), mask=row_ok)


@triton.jit
def _row_words(rows, valid, OFFSET: tl.constexpr, REAL: tl.constexpr, COUNT: tl.constexpr, DTYPE: tl.constexpr):
    """[N, COUNT] words of DTYPE from byte OFFSET of each token's row; words past the REAL ones
    (padding up to tl.dot's 16-wide minimum on small heads) and tokens not valid read as 0."""
    w = tl.arange(0, COUNT)
    ptrs = (rows + OFFSET)[:, None].to(tl.pointer_type(DTYPE)) + w[None, :]
    return tl.load(ptrs, mask=valid[:, None] & (w < REAL)[None, :], other=0)


@triton.jit
def _col_words(rows, valid, OFFSET: tl.constexpr, REAL: tl.constexpr, COUNT: tl.constexpr, DTYPE: tl.constexpr):
    """[COUNT, N] words as _row_words, tokens last: the orientation of tl.dot's key operand, so
    nothing is transposed through shared memory."""
    w = tl.arange(0, COUNT)
    ptrs = (rows + OFFSET)[None, :].to(tl.pointer_type(DTYPE)) + w[:, None]
    return tl.load(ptrs, mask=valid[None, :] & (w < REAL)[:, None], other=0)


# ---------------------------------------------------------------------------------------------
# 3-bit codebook lookup by byte permutation (GPU only)
# ---------------------------------------------------------------------------------------------

# Two key words of 8 three-bit codes each in, their 8 fields' codebook entries (fp16 bits) out,
# each output register a pair: field f of the first word in its low half, of the second in its
# high half, as tl.dot's operand holds two neighbouring elements in one register (Triton hands an
# inline-asm call of pack=2 two neighbours: $8 = the two words' low planes, 16 bits each, 8
# two-bit fields, field f at bit 2f; $9 = their high-bit bytes in bits 0-15, field f's at bit f;
# bits 16-31 of $9 are not read). The high bytes are cut into nibbles (one per byte: word 0's
# fields 0-3, word 1's 0-3, word 0's 4-7, word 1's 4-7) and spread to every other bit; the low
# planes' bytes are put in the same order (PRMT 0x3120). Then every nibble of two selectors is a
# whole code: e holds the even fields (0, 2 of both words; 4, 6 in its upper half), o the odd
# ones. PRMT picks 4 bytes of an 8-byte table by such a selector, so two PRMTs (the entries' low
# and high bytes) look up 4 codes and two more pair the bytes into the output registers. About
# 17 instructions a word, where a gather costs a shift, a mask, an address and a load per code.
# $10/$12 and $14/$16: the low and high bytes of entries 0-3 / 4-7 (lut_words; pack=2 passes
# each twice, $11, $13, $15, $17 are the copies). Plain PTX that every NVIDIA GPU since sm_20 has.
KEY3_PAIR_ASM = """{
.reg .b32 y, z, m, t, lp, e, o, s, l, h;
shr.u32 y, $9, 4;
prmt.b32 z, $9, y, 0x5410;
and.b32 z, z, 0x0F0F0F0F;
shl.b32 t, z, 2; or.b32 m, z, t; and.b32 m, m, 0x33333333;
shl.b32 t, m, 1; or.b32 m, m, t; and.b32 m, m, 0x55555555;
prmt.b32 lp, $8, 0, 0x3120;
and.b32 e, lp, 0x33333333; shl.b32 t, m, 2; and.b32 t, t, 0x44444444; or.b32 e, e, t;
shr.u32 o, lp, 2; and.b32 o, o, 0x33333333; and.b32 t, m, 0x44444444; or.b32 o, o, t;
prmt.b32 l, $10, $12, e; prmt.b32 h, $14, $16, e;
prmt.b32 $0, l, h, 0x6240; prmt.b32 $2, l, h, 0x7351;
shr.u32 s, e, 16;
prmt.b32 l, $10, $12, s; prmt.b32 h, $14, $16, s;
prmt.b32 $4, l, h, 0x6240; prmt.b32 $6, l, h, 0x7351;
prmt.b32 l, $10, $12, o; prmt.b32 h, $14, $16, o;
prmt.b32 $1, l, h, 0x6240; prmt.b32 $3, l, h, 0x7351;
shr.u32 s, o, 16;
prmt.b32 l, $10, $12, s; prmt.b32 h, $14, $16, s;
prmt.b32 $5, l, h, 0x6240; prmt.b32 $7, l, h, 0x7351;
}"""
_KEY3_PAIR_ASM = tl.constexpr(KEY3_PAIR_ASM)  # what a @triton.jit function may read

# Field f (0-3) of two 4-bit value words (uint16, 4 nibbles; pack=2 puts the two in one register,
# $1) masked in place for both at once: the float16 subnormals _value_field makes, as a pair.
VALUE4_ASM = tuple(f"{{.reg .b32 t; shr.u32 t, $1, {8 * (f // 2)}; and.b32 $0, t, {0x000F000F << (4 * (f % 2)):#010x};}}"
                   for f in range(4))
_VALUE4_ASM = tl.constexpr(VALUE4_ASM)


def lut_words(entries: torch.Tensor) -> Tuple[int, int, int, int]:
    """The 8 float16 entries as KEY3_PAIR_ASM's tables: (low bytes of 0-3, of 4-7, high bytes of
    0-3, of 4-7), byte k of a word = entry k (mod 4), each word as a signed 32-bit integer."""
    if entries.dtype != torch.float16 or entries.numel() != 8:
        raise ValueError(f"lut_words needs 8 float16 entries, not {entries.numel()} {entries.dtype}")
    bits = [int(b) & 0xFFFF for b in entries.cpu().view(torch.int16).tolist()]

    def word(values: Any) -> int:
        packed = sum(v << (8 * k) for k, v in enumerate(values))
        return packed - (1 << 32) if packed >= 1 << 31 else packed

    return (word(b & 0xFF for b in bits[:4]), word(b & 0xFF for b in bits[4:]),
            word(b >> 8 for b in bits[:4]), word(b >> 8 for b in bits[4:]))


@triton.jit
def _code3_entries(low, high, t0, t1, t2, t3):
    """The 8 table entries (float16) of each key word of 8 three-bit codes: its low plane (uint16)
    and high bits (uint8), looked up by KEY3_PAIR_ASM two words at a time."""
    out = tl.inline_asm_elementwise(_KEY3_PAIR_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r",
                                    [low, high, t0, t1, t2, t3], dtype=(tl.int16,) * 8, is_pure=True, pack=2)
    return (out[0].to(tl.float16, bitcast=True), out[1].to(tl.float16, bitcast=True),
            out[2].to(tl.float16, bitcast=True), out[3].to(tl.float16, bitcast=True),
            out[4].to(tl.float16, bitcast=True), out[5].to(tl.float16, bitcast=True),
            out[6].to(tl.float16, bitcast=True), out[7].to(tl.float16, bitcast=True))


@triton.jit
def _codebook_scores(qs, key_rows, valid, centroid_ptr, luts, BITS: tl.constexpr, D: tl.constexpr, GP: tl.constexpr,
                     BLOCK_N: tl.constexpr, KW: tl.constexpr, PTX: tl.constexpr):
    """Scores of the query fields qs (qs[f] = query elements 8w + f, [GP, KW]) against codebook
    keys: field f of every key word meets qs[f], so the codes are never reordered. 4 bits: int32
    words of 8 nibbles; 3 bits: int16 words of 8 two-bit fields and a byte of their high bits.
    The centroid of each code is gathered from the float16 table (an 8/16-entry table sits in
    one L1 sector, so a warp's gather is one wavefront), or, for 3 bits with PTX, looked up
    in registers by _code3_entries (luts: its four table words)."""
    W: tl.constexpr = D // 8
    qk = tl.zeros([GP, BLOCK_N], tl.float32)
    if BITS == 4:
        words = _col_words(key_rows, valid, 0, W, KW, tl.int32)
        for f in tl.static_range(8):
            qk = tl.dot(qs[f], tl.load(centroid_ptr + ((words >> (4 * f)) & 15)), qk)
    elif PTX:
        low = _col_words(key_rows, valid, 0, W, KW, tl.uint16)
        high = _col_words(key_rows, valid, 2 * W, W, KW, tl.uint8)
        keys = _code3_entries(low, high, luts[0], luts[1], luts[2], luts[3])
        for f in tl.static_range(8):
            qk = tl.dot(qs[f], keys[f], qk)
    else:
        low = _col_words(key_rows, valid, 0, W, KW, tl.int16)
        high = _col_words(key_rows, valid, 2 * W, W, KW, tl.uint8).to(tl.int16) << 2  # bit f -> bit f + 2
        for f in tl.static_range(8):
            qk = tl.dot(qs[f], tl.load(centroid_ptr + (((low >> (2 * f)) & 3) | ((high >> f) & 4))), qk)
    return qk


@triton.jit
def _value_planes(value_rows, valid, D: tl.constexpr, BITS: tl.constexpr, FIELDS: tl.constexpr, VW: tl.constexpr):
    """The value words a tile's fields are masked from, each [N, VW] (D / FIELDS real columns).
    4 bits: (uint16 words of 4 nibbles, unused). 3 bits: _nibble_codes' (even, odd) words, from
    bytes of 4 two-bit fields and the high-bit plane spread to the same shape (FIELDS=4: byte w of
    the plane holds elements 8w..8w+7; its two nibbles belong to low bytes 2w and 2w+1), or from
    int16 words of 8 two-bit fields and the high-bit bytes as they are stored (FIELDS=8)."""
    if BITS == 4:
        low = _row_words(value_rows, valid, 0, D // 4, VW, tl.uint16)
        return low, low
    elif FIELDS == 4:
        low = _row_words(value_rows, valid, 0, D // 4, VW, tl.uint8).to(tl.uint16)
        h = _row_words(value_rows, valid, D // 4, D // 8, VW // 2, tl.uint8).to(tl.uint16)
        return _nibble_codes(low, tl.reshape(tl.join(h & 0xF, h >> 4), [h.shape[0], VW]))
    else:
        low = _row_words(value_rows, valid, 0, D // 8, VW, tl.uint16)
        return _nibble_codes(low, _row_words(value_rows, valid, D // 4, D // 8, VW, tl.uint8).to(tl.uint16))


@triton.jit
def _nibble_codes(low, high):
    """Words of two-bit fields (field f at bit 2f) and their high bits (field f's at bit f) as
    two words of whole 3-bit codes in nibbles: (even fields, odd fields), field 2k + j in nibble
    k of word j. The high bits are spread to every other bit (bit f to 2f) and merged under
    masks, a dozen operations per word; then every code is one AND away from a subnormal, and a
    field needs one product instead of two (low bits and high bit apart)."""
    m = (high | (high << 4)) & 0x0F0F
    m = (m | (m << 2)) & 0x3333
    m = (m | (m << 1)) & 0x5555
    return (low & 0x3333) | ((m << 2) & 0x4444), ((low >> 2) & 0x3333) | (m & 0x4444)


@triton.jit
def _value_field(low, high, F: tl.constexpr, BITS: tl.constexpr, PTX: tl.constexpr):
    """float16 of field F's code bits masked in place: a subnormal, code * 2^(shift - 24) exactly,
    so decoding a value costs one AND (the weight is applied to the accumulated sum, once).
    Fields in a word's upper byte are shifted down by 8 first (bits 10 and up are exponent bits).
    3 bits: field F is nibble F // 2 of _nibble_codes' word F % 2. 4 bits with PTX: VALUE4_ASM
    masks two words' field in one 32-bit register (Triton's masks work in 16-bit lanes)."""
    if BITS == 4 and PTX:
        return tl.inline_asm_elementwise(_VALUE4_ASM[F], "=r,r", [low], dtype=tl.int16, is_pure=True,
                                         pack=2).to(tl.float16, bitcast=True)
    if BITS == 4:
        bits = (low if F < 2 else low >> 8) & (0xF << (4 * (F % 2)))
    else:
        word = low if F % 2 == 0 else high
        bits = (word if F < 4 else word >> 8) & (7 << (4 * ((F // 2) % 2)))
    return bits.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _value_weight(F: tl.constexpr, BITS: tl.constexpr):
    """2^(24 - shift): turns a sum of _value_field subnormals back into code units."""
    if BITS == 4:
        E: tl.constexpr = 24 - 4 * (F % 2)
    else:
        E: tl.constexpr = 24 - 4 * ((F // 2) % 2)
    return tl.full([], 2.0 ** E, tl.float32)


@triton.jit
def _query_fields(q_rows, row_ok, D: tl.constexpr, GP: tl.constexpr, KW: tl.constexpr):
    """The 8 query fields _codebook_scores meets the key words with (field f: elements 8w + f,
    [GP, KW] fp16; columns past D, padding up to tl.dot's 16-wide minimum, are 0): the rows are
    read whole and cut apart in registers, a coalesced read where a field at a time would be
    strided by 8 elements."""
    cols = tl.arange(0, KW * 8)
    q = tl.load(q_rows + cols[None, :], mask=row_ok[:, None] & (cols < D)[None, :], other=0.0).to(tl.float16)
    even, odd = tl.split(tl.reshape(q, [GP, KW, 4, 2]))  # elements 8w + 2i and 8w + 2i + 1
    e0, e2 = tl.split(tl.reshape(even, [GP, KW, 2, 2]))  # 8w + {0, 4}, 8w + {2, 6}
    o1, o3 = tl.split(tl.reshape(odd, [GP, KW, 2, 2]))  # 8w + {1, 5}, 8w + {3, 7}
    f0, f4 = tl.split(e0)
    f2, f6 = tl.split(e2)
    f1, f5 = tl.split(o1)
    f3, f7 = tl.split(o3)
    return f0, f1, f2, f3, f4, f5, f6, f7


@triton.jit(do_not_specialize=["num_splits", "stride_bt"])
def _decode_split_kernel(q_ptr, cache_ptr, bt_ptr, lens_ptr, centroid_ptr, part_o_ptr, part_lse_ptr,
                         stride_qb, stride_qh, stride_bt, page_stride, num_splits, sm_scale, lut0, lut1, lut2, lut3,
                         G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                         BLOCK_SIZE: tl.constexpr, SLOT: tl.constexpr,
                         KEY_FP8: tl.constexpr, KEY_BITS: tl.constexpr, VALUE_BITS: tl.constexpr,
                         KEY_CODE_BYTES: tl.constexpr, VALUE_CODE_BYTES: tl.constexpr,
                         OFF_VC: tl.constexpr, OFF_KN: tl.constexpr, OFF_VS: tl.constexpr, OFF_VZ: tl.constexpr,
                         BLOCK_N: tl.constexpr, MIN_CHUNK: tl.constexpr, VALUE_FIELDS: tl.constexpr, PTX: tl.constexpr):
    """Partial attention of the G query heads of one KV head over one split of one request.

    Values: element d is field f = d % F of word d // F (F = VALUE_FIELDS: 4, or 8 for 3-bit
    values in D/8-wide words). Every field is decoded by one mask in the layout tl.dot reads it
    in (the words reach that layout through shared memory, 2-4 bits per element instead of 16;
    3-bit codes are first made whole by _nibble_codes) and accumulates into its own [GP, D / F]
    sum, written at the end as it is, field by field: partial-output column f * D / F + w holds
    element F w + f (field-major, so each row's store is contiguous; the merge puts the elements
    back in order).
    The value sums are a small difference of two large ones (probability x scale x code, and
    probability x zero point), so their rounding matters: a long split's output is further from
    the reference than a short one's (ci/bench/README.md). The tile's product is written as added
    outside tl.dot, but Triton folds that add back: the compiled dot accumulates the running sum.
    Codebook keys: see _codebook_scores. PTX: inline assembly (3-bit keys by KEY3_PAIR_ASM, 4-bit
    values by VALUE4_ASM), on a GPU only. num_splits is not specialised (it changes with the batch size; one compiled
    kernel serves every batch)."""
    split = tl.program_id(0)
    kv_head = tl.program_id(1)
    req = tl.program_id(2)
    seq_len = tl.load(lens_ptr + req)
    used, start, end = _split_range(seq_len, split, num_splits, BLOCK_N, MIN_CHUNK)
    if split < used:
        VF: tl.constexpr = VALUE_FIELDS
        VW: tl.constexpr = max(D // VF, 16)  # tl.dot needs 16 columns; small heads pad (masked)
        KW: tl.constexpr = max(D // 8, 16)
        row_ok, q_heads = _group_rows(kv_head, G, GP)
        q_rows = q_ptr + req * stride_qb + q_heads[:, None] * stride_qh
        m_i = tl.full([GP], float("-inf"), tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc_zero = tl.zeros([GP], tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        part = _part_index(req, kv_head, split, num_splits, q_heads, G)
        if KEY_FP8:
            q = tl.load(q_rows + tl.arange(0, D)[None, :], mask=row_ok[:, None], other=0.0).to(tl.float16)
        else:
            qs = _query_fields(q_rows, row_ok, D, GP, KW)
        accs = ()
        for f in tl.static_range(VF):
            accs = accs + (tl.zeros([GP, VW], tl.float32),)
        for n0 in range(start, end, BLOCK_N):
            valid, region, pos, key_rows = _tile(cache_ptr, bt_ptr, req, stride_bt, kv_head, n0, end, page_stride,
                                                 BLOCK_SIZE, SLOT, KEY_CODE_BYTES, BLOCK_N)
            if KEY_FP8:
                qk = _fp8_scores(q, key_rows, valid, qk_scale, D)
            else:
                qk = _codebook_scores(qs, key_rows, valid, centroid_ptr, (lut0, lut1, lut2, lut3), KEY_BITS, D, GP, BLOCK_N, KW, PTX)
                qk = qk * (_load_half(region + OFF_KN, pos, valid) * qk_scale)[None, :]
            m_i, alpha, p = _online_softmax(qk, valid, m_i)
            pv = (p * _load_half(region + OFF_VS, pos, valid)[None, :]).to(tl.float16)
            low, high = _value_planes(region + OFF_VC + pos * VALUE_CODE_BYTES, valid, D, VALUE_BITS, VF, VW)
            new = ()
            for f in tl.static_range(VF):
                new = new + (accs[f] * alpha[:, None] + tl.dot(pv, _value_field(low, high, f, VALUE_BITS, PTX)),)
            accs = new
            acc_zero, l_i = _zero_and_mass(acc_zero, l_i, alpha, p, region + OFF_VZ, pos, valid)
        inv_l = 1.0 / tl.where(l_i > 0.0, l_i, 1.0)
        part_rows = part_o_ptr + part[:, None].to(tl.int64) * D
        w = tl.arange(0, VW)
        for f in tl.static_range(VF):
            o = accs[f] * _value_weight(f, VALUE_BITS)
            tl.store(part_rows + (f * (D // VF) + w)[None, :], (o + acc_zero[:, None]) * inv_l[:, None],
                     mask=row_ok[:, None] & (w < D // VF)[None, :])
        _store_lse(part_lse_ptr, part, row_ok, m_i, l_i)


MERGE_COLS = 64  # output columns per merge program


@triton.jit(do_not_specialize=["num_splits"])
def _decode_merge_kernel(part_o_ptr, part_lse_ptr, lens_ptr, out_ptr, stride_ob, stride_oh, num_splits,
                         HQ: tl.constexpr, D: tl.constexpr, MERGE_ROWS: tl.constexpr, MERGE_COLS: tl.constexpr,
                         BLOCK_N: tl.constexpr, MIN_CHUNK: tl.constexpr, FIELDS: tl.constexpr):
    """Merge the splits of one (request, query head) by their log-sum-exp weights, MERGE_COLS
    partial-output columns a program, MERGE_ROWS splits per step with a running maximum. FIELDS:
    the columns are field-major as the split kernel writes them (column f * D / FIELDS + w is
    element FIELDS w + f); 1: in order. A single request at a long
    context has over a hundred splits: the columns spread its merge over several programs, and
    each step's partial outputs are loaded without waiting for its weights (every split below the
    used count wrote finite values; one that saw no token has weight 0). The split count itself is
    not compiled in, only its merge_rows: the table's width, hence the count, may differ from the
    warm-up's."""
    req = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(lens_ptr + req)
    used, _, _ = _split_range(seq_len, 0, num_splits, BLOCK_N, MIN_CHUNK)
    first = (req * HQ + head) * num_splits
    d = tl.program_id(2) * MERGE_COLS + tl.arange(0, MERGE_COLS)
    element = (d % (D // FIELDS)) * FIELDS + d // (D // FIELDS)
    r = tl.arange(0, MERGE_ROWS)
    acc = tl.zeros([MERGE_COLS], tl.float32)
    total = tl.sum(tl.zeros([MERGE_ROWS], tl.float32), axis=0)
    top = total - 1e30
    for i in range(0, used, MERGE_ROWS):
        rows = i + r
        inside = rows < used
        lse_r = tl.load(part_lse_ptr + first + rows, mask=inside, other=float("-inf"))
        part = tl.load(part_o_ptr + (first + rows).to(tl.int64)[:, None] * D + d[None, :], mask=inside[:, None], other=0.0)
        live = lse_r > float("-inf")
        new_top = tl.maximum(top, tl.max(tl.where(live, lse_r, -1e30), axis=0))
        scale = tl.exp2(top - new_top)
        weight = tl.where(live, tl.exp2(lse_r - new_top), 0.0)
        acc = acc * scale + tl.sum(weight[:, None] * part, axis=0)
        total = total * scale + tl.sum(weight, axis=0)
        top = new_top
    out = acc / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + req * stride_ob + head * stride_oh + element, out.to(out_ptr.dtype.element_ty))


def merge_rows(splits: int) -> int:
    """Splits the merge reads per step: all of them in one step up to 64 (a single request at a long
    context has over a hundred), at least 16; a compile variant."""
    return min(64, max(16, triton.next_power_of_2(splits)))


def merge_splits(part_o: torch.Tensor, part_lse: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor, splits: int,
                 config: DecodeConfig, fields: int = 1) -> None:
    """out [B, Hq, D] from the splits' partial outputs [B * Hq * splits, D] and log2-sum-exps, the
    splits cut by config's rule (block_n, min_chunk) as the split kernel cut them; fields: the
    partial outputs' columns are field-major in that many fields (the split kernel's), 1 = in order."""
    batch, num_q_heads, head_size = out.shape
    cols = min(MERGE_COLS, head_size)
    _decode_merge_kernel[(batch, num_q_heads, head_size // cols)](
        part_o, part_lse, seq_lens, out, out.stride(0), out.stride(1), splits, HQ=num_q_heads, D=head_size,
        MERGE_ROWS=merge_rows(splits), MERGE_COLS=cols, BLOCK_N=config.block_n, MIN_CHUNK=config.min_chunk, FIELDS=fields,
        num_warps=4)


def inline_ptx(device: torch.device) -> bool:
    """Whether the decode runs its inline assembly (KEY3_PAIR_ASM, VALUE4_ASM): on a GPU. Triton's
    CPU interpreter runs no PTX; there the plain Triton paths give the same numbers."""
    return device.type == "cuda"


_SM_COUNT: Dict[str, int] = {}


def _sm_count(device: torch.device) -> int:
    key = str(device)
    if key not in _SM_COUNT:
        _SM_COUNT[key] = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return _SM_COUNT[key]


MAX_SPLITS = 256  # splits of one (request, KV head) at most


def num_splits_for(batch: int, num_kv_heads: int, max_context: int, device: torch.device, config: DecodeConfig) -> int:
    """Split count from shapes only: config.programs_per_sm programs per SM at the longest context
    the block table can hold; fewer are used on the device when a request is short (min_chunk)."""
    wanted = triton.cdiv(config.programs_per_sm * _sm_count(device), max(batch * num_kv_heads, 1))
    return max(1, min(wanted, triton.cdiv(max_context, config.min_chunk), MAX_SPLITS))


def tq_decode(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float,
              spec: fmt.TQSpec, out: Optional[torch.Tensor] = None, *, num_splits: Optional[int] = None,
              config: Optional[DecodeConfig] = None, rotated: bool = False) -> torch.Tensor:
    """Decode attention of query [B, Hq, D] over the packed cache; returns [B, Hq, D] (query dtype,
    or written into ``out``). seq_lens [B] int32 and block_table [B, max_blocks] int32 on the device.
    rotated: the query is rotate()'s float32 output already (then pass ``out``).
    """
    batch, num_q_heads, head_size = query.shape
    block_size, num_kv_heads, layout = fmt.cache_geometry(kv_cache, spec, head_size)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    group = num_q_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(query)
    if batch == 0:
        return out
    cfg = config or decode_config(spec, head_size, group, batch, block_table.shape[1] * block_size, query.device)
    tab = tables(spec, head_size, query.device)
    q = query if spec.key_fp8 or rotated else rotate(query, tab.rotation_t)
    if q.stride(-1) != 1:
        q = q.contiguous()
    splits = num_splits or num_splits_for(batch, num_kv_heads, block_table.shape[1] * block_size, query.device, cfg)
    part_o = torch.empty(batch * num_q_heads * splits, head_size, dtype=torch.float32, device=query.device)
    part_lse = torch.empty(batch * num_q_heads * splits, dtype=torch.float32, device=query.device)
    fields = cfg.value_fields if spec.value_bits == 3 else 4  # one compiled kernel for 4-bit values
    _decode_split_kernel[(splits, num_kv_heads, batch)](
        q, kv_cache, block_table, seq_lens, tab.centroids_half, part_o, part_lse,
        q.stride(0), q.stride(1), block_table.stride(0), kv_cache.stride(0), splits, float(scale), *tab.byte_tables,
        G=group, GP=max(16, triton.next_power_of_2(group)), D=head_size, BLOCK_SIZE=block_size,
        BLOCK_N=cfg.block_n, MIN_CHUNK=cfg.min_chunk, **_layout_constants(spec, layout, block_size),
        VALUE_FIELDS=fields, PTX=int(inline_ptx(query.device)),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **({"maxnreg": cfg.max_regs} if cfg.max_regs else {}))
    merge_splits(part_o, part_lse, seq_lens, out, splits, cfg, fields)
    return out


def tq_store_decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                    spec: fmt.TQSpec, out: torch.Tensor) -> None:
    """A layer's step: store this step's key/value [T, Hkv, D] (tq_store), then decode attention of
    the decode rows' query [B, Hq, D] into out (tq_decode), which sees what was stored. A codebook
    key's queries and keys are rotated together: one rotation launch while their rows together are
    at most ROTATE_FEW_ROWS (rotate_pair), two past that.
    """
    n = slot_mapping.shape[0]
    query_rows, keys = query, key[:n]
    if not spec.key_fp8:
        query_rows, keys = rotate_pair(query, keys, tables(spec, query.shape[-1], query.device).rotation_t)
    tq_store(keys, value, kv_cache, slot_mapping, spec, rotated=True)
    tq_decode(query_rows, kv_cache, block_table, seq_lens, scale, spec, out=out, rotated=True)


# ---------------------------------------------------------------------------------------------
# Dequantisation for prefill (flash-attn varlen reads the result)
# ---------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["total", "num_seqs", "first_row", "stride_bt"])
def _dequant_kernel(cache_ptr, bt_ptr, cu_ptr, centroid_ptr, k_ptr, v_ptr, total, num_seqs, first_row, stride_bt, page_stride,
                    H: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr, SLOT: tl.constexpr,
                    KEY_FP8: tl.constexpr, KEY_BITS: tl.constexpr, VALUE_BITS: tl.constexpr,
                    KEY_CODE_BYTES: tl.constexpr, VALUE_CODE_BYTES: tl.constexpr,
                    OFF_VC: tl.constexpr, OFF_KN: tl.constexpr, OFF_VS: tl.constexpr, OFF_VZ: tl.constexpr,
                    BLOCK_T: tl.constexpr):
    """Keys (rotated basis, or FP8 values) and values of BLOCK_T packed tokens of one KV head.

    Request b reads block-table row first_row + b. Counts, the first row and the table's stride
    are not specialised, so one compiled kernel serves every prefill (warm_up compiles it).
    """
    head = tl.program_id(1)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    valid = t < total
    seq = tl.zeros([BLOCK_T], tl.int32)
    for j0 in range(0, num_seqs, 16):
        j = j0 + tl.arange(0, 16)
        ends = tl.load(cu_ptr + 1 + j, mask=j < num_seqs, other=2147483647)
        seq += tl.sum((ends[None, :] <= t[:, None]).to(tl.int32), axis=1)
    seq = tl.minimum(seq, num_seqs - 1)
    offs = t - tl.load(cu_ptr + seq, mask=valid, other=0)
    row = bt_ptr + (first_row + seq).to(tl.int64) * stride_bt
    region, pos = _token_bases(cache_ptr, row, offs, valid, page_stride, head * (BLOCK_SIZE * SLOT), BLOCK_SIZE)
    d = tl.arange(0, D)
    key_rows = region + pos * KEY_CODE_BYTES
    if KEY_FP8:
        raw = tl.load(key_rows[:, None] + d[None, :], mask=valid[:, None], other=0)
        k = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        k = tl.load(centroid_ptr + _load_codes(key_rows, valid, KEY_BITS, D, BLOCK_T)) * _load_half(region + OFF_KN, pos, valid)[:, None]
    vcodes = _load_codes(region + OFF_VC + pos * VALUE_CODE_BYTES, valid, VALUE_BITS, D, BLOCK_T).to(tl.float32)
    v = vcodes * _load_half(region + OFF_VS, pos, valid)[:, None] + _load_half(region + OFF_VZ, pos, valid)[:, None]
    dst = (t.to(tl.int64) * H + head)[:, None] * D + d[None, :]
    tl.store(k_ptr + dst, k.to(k_ptr.dtype.element_ty), mask=valid[:, None])
    tl.store(v_ptr + dst, v.to(v_ptr.dtype.element_ty), mask=valid[:, None])


def tq_dequant_varlen(kv_cache: torch.Tensor, block_table: torch.Tensor, cu_seqlens_k: torch.Tensor, spec: fmt.TQSpec, head_size: int,
                      dtype: torch.dtype, total_k: Optional[int] = None, first_row: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of every request, packed [total_k, Hkv, D] in dtype (flash-attn varlen order).

    Request b's tokens 0 .. cu_seqlens_k[b+1] - cu_seqlens_k[b] - 1 are read through block_table
    row first_row + b (the whole table is passed, not a slice: a slice's start would change the
    pointer alignment the kernel is compiled for). Pass total_k (= cu_seqlens_k[-1]) when the
    caller knows it; otherwise it is read from the device, which waits for the GPU.
    """
    block_size, num_kv_heads, layout = fmt.cache_geometry(kv_cache, spec, head_size)
    device = kv_cache.device
    total = int(cu_seqlens_k[-1]) if total_k is None else total_k
    num_seqs = cu_seqlens_k.shape[0] - 1
    key_dtype = dtype if spec.key_fp8 else torch.float32
    k = torch.empty(total, num_kv_heads, head_size, dtype=key_dtype, device=device)
    v = torch.empty(total, num_kv_heads, head_size, dtype=dtype, device=device)
    if total == 0 or num_seqs == 0:
        return k.to(dtype), v
    tab = tables(spec, head_size, device)
    block_t = 16
    _dequant_kernel[(triton.cdiv(total, block_t), num_kv_heads)](
        kv_cache, block_table, cu_seqlens_k, tab.centroids, k, v, total, num_seqs, first_row, block_table.stride(0),
        kv_cache.stride(0), H=num_kv_heads, D=head_size, BLOCK_SIZE=block_size, BLOCK_T=block_t,
        **_layout_constants(spec, layout, block_size), num_warps=4)
    if not spec.key_fp8:
        k = torch.matmul(k, tab.rotation).to(dtype)
    return k, v


def table_capacities(max_model_len: int, block_sizes: Sequence[int]) -> List[int]:
    """The capacities a block-table row may have: vLLM sizes it in allocation blocks (for a hybrid
    model larger than the page a kernel reads, e.g. 304 tokens), and 0.21-0.26 round it up to 128
    tokens for small blocks."""
    return sorted({-(-max_model_len // b) * b for b in (*block_sizes, 128) if b > 0})


_WARMED: Set[Tuple[Any, ...]] = set()  # shapes this process has warmed up


def warm_up(spec: fmt.TQSpec, head_size: int, num_q_heads: int, num_kv_heads: int, block_size: int,
            table_tokens: Sequence[int], max_batch: int, dtype: torch.dtype, device: torch.device) -> None:
    """Compile every kernel variant serving will launch (compile_variants) while vLLM starts; one
    log line saying what and how long. Never fatal: a variant that fails here is logged and would
    fail, or never be needed, at serving time. $SPARKMODS_TURBOQUANT_WARMUP=0 switches it off."""
    if os.environ.get(ENV_WARMUP, "1").strip().lower() in ("0", "false", "off", "no"):
        logger.info("sparkmods turboquant: warm-up switched off (%s); kernels compile on first use", ENV_WARMUP)
        return
    shape = (spec.name, head_size, num_q_heads, num_kv_heads, block_size, tuple(table_tokens), max_batch, dtype, str(device))
    if shape in _WARMED:  # vLLM builds a layer group's metadata builder more than once
        return
    start = time.monotonic()
    try:
        batches = compile_variants(spec, head_size, num_q_heads, num_kv_heads, block_size, table_tokens, max_batch,
                                   dtype, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - a warm-up must never stop the server
        logger.warning("sparkmods turboquant: warm-up failed (%s: %s); kernels compile on first use",
                       type(exc).__name__, exc)
        return
    logger.info("sparkmods turboquant: warm-up ran the store, the prefill and %d decode variants (batch sizes %s) "
                "in %.1f s", len(batches), ",".join(map(str, batches)), time.monotonic() - start)
    _WARMED.add(shape)


def compile_variants(spec: fmt.TQSpec, head_size: int, num_q_heads: int, num_kv_heads: int, block_size: int,
                     table_tokens: Sequence[int], max_batch: int, dtype: torch.dtype, device: torch.device) -> List[int]:
    """Run every kernel variant serving will launch on a scratch two-page cache; the decode batch
    sizes run, in order.

    CUDA-graph capture compiles the decode of the captured batch sizes only; without this the first
    long prompt or an eager batch (--enforce-eager, or larger than the captured sizes) would
    compile while a user waits. Decode variants differ by batch band and context band (the decode
    config), rotate tiling and merge rows (the split count), so one batch of each distinct triple
    is run for each capacity in table_tokens (the tokens a table row may address: vLLM rounds it
    up to its allocation block, which can be larger than the page a kernel reads).
    """
    cache = torch.zeros(fmt.cache_shape(2, block_size, num_kv_heads, head_size, spec), dtype=torch.uint8, device=device)
    for tokens in (1, ROTATE_FEW_ROWS // num_kv_heads + 1):  # a decode step's keys, a prefill's: both rotate and store variants
        key = torch.zeros(tokens, num_kv_heads, head_size, dtype=dtype, device=device)
        slots = torch.full((tokens,), -1, dtype=torch.int64, device=device)
        slots[:2] = torch.arange(min(tokens, 2), device=device)
        tq_store(key, key, cache, slots, spec)
    cu = torch.tensor([0, 2], dtype=torch.int32, device=device)
    tq_dequant_varlen(cache, torch.zeros(1, 2, dtype=torch.int32, device=device), cu, spec, head_size, dtype, total_k=2)
    group = num_q_heads // num_kv_heads
    seen = set()
    batches = []
    for tokens in table_tokens:
        width = triton.cdiv(tokens, block_size)
        for batch in range(1, max_batch + 1):
            cfg = decode_config(spec, head_size, group, batch, width * block_size, device)
            splits = num_splits_for(batch, num_kv_heads, width * block_size, device, cfg)
            variant = (cfg, rotate_tiling(batch * num_q_heads), merge_rows(splits))
            if variant not in seen:
                seen.add(variant)
                batches.append(batch)
                tq_decode(torch.zeros(batch, num_q_heads, head_size, dtype=dtype, device=device), cache,
                          torch.zeros(batch, width, dtype=torch.int32, device=device),
                          torch.ones(batch, dtype=torch.int32, device=device), 1.0, spec)
    return batches
