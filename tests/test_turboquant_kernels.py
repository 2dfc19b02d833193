"""turboquant: the KV format, the PyTorch reference and the Triton kernels, on the CPU.

The kernels run under Triton's interpreter (TRITON_INTERPRET=1, set by the benchmark's
load_modules before the kernels are defined; no other test in this suite launches Triton). The
files are the mod's own (mods/turboquant/files), the ones its variant installs into vLLM. The
benchmark script's CPU-runnable parts are checked here too, its --smoke run as a real
subprocess, so the GPU command cannot rot. Realistic shapes and timings: ci/bench/bench_turboquant.py
on the GPU machine.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, Sequence, Tuple

import pytest

from extras import INSTALL, need
from scriptload import load_script

torch = need("torch")
if importlib.util.find_spec("triton") is None:  # importing it here would define its kernels for the GPU
    pytest.skip(f"needs triton from the kernels extra: {INSTALL} (Linux only)", allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
BENCH_PATH = REPO / "ci" / "bench" / "bench_turboquant.py"
HKV, HQ, BLOCK, PAGES = 2, 8, 16, 6
DTYPES = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")


BENCH = load_script(BENCH_PATH)
# at collection, before any test runs: triton must first be imported with TRITON_INTERPRET=1
FORMAT, KERNELS = BENCH.load_modules(interpret=True)


@pytest.fixture(scope="module")
def fmt() -> ModuleType:
    return FORMAT


@pytest.fixture(scope="module")
def tq() -> ModuleType:
    return KERNELS


def rel(a: Any, b: Any) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


# ---- spec table, layout, boundary layers ----


def _upstream_slot(key_bits: int, value_bits: int, d: int) -> int:
    """Upstream 0.21's slot size (config.py: key D or ceil(D*b/8)+2, value ceil(D*b/8)+4, even)."""
    key = d if key_bits == 8 else math.ceil(d * key_bits / 8) + 2
    slot = key + math.ceil(d * value_bits / 8) + 4
    return slot + slot % 2


@pytest.mark.parametrize("name,bits,fp8,nc", [("turboquant_k8v4", (8, 4), True, False), ("turboquant_4bit_nc", (4, 4), False, True),
                                              ("turboquant_k3v4_nc", (3, 4), False, True), ("turboquant_3bit_nc", (3, 3), False, True)])
def test_presets_match_upstream_and_take_no_more_bytes(fmt: ModuleType, name: str, bits: Tuple[int, int], fp8: bool, nc: bool) -> None:
    spec = fmt.tq_spec(name)
    assert (spec.key_bits, spec.value_bits, spec.key_fp8, spec.norm_correction) == (*bits, fp8, nc)
    assert fmt.is_turboquant(name)
    for d in (128, 256):
        assert fmt.slot_bytes(spec, d) <= _upstream_slot(*bits, d)
        assert fmt.page_bytes(spec, 32, HKV, d) == 32 * HKV * fmt.slot_bytes(spec, d)
        assert fmt.cache_shape(7, 32, HKV, d, spec) == (7, 32, HKV, fmt.slot_bytes(spec, d))


def test_bytes_per_token_of_qwen35_attention(fmt: ModuleType) -> None:
    # head 256, 2 KV heads: bf16 2048 bytes; turboquant_k3v4_nc 2 x (96 + 2 + 128 + 4) = 460 (4.45x)
    assert fmt.kv_bytes_per_token("bf16", 256, 2) == 2048
    assert fmt.kv_bytes_per_token("fp8", 256, 2) == 1024
    assert fmt.kv_bytes_per_token("turboquant_k3v4_nc", 256, 2) == 460
    assert fmt.kv_bytes_per_token("turboquant_3bit_nc", 128, 2) == 204


def test_bad_names_and_shapes_are_refused(fmt: ModuleType) -> None:
    with pytest.raises(ValueError, match="turboquant_k3v4_nc"):
        fmt.tq_spec("turboquant_2bit")
    assert not fmt.is_turboquant("fp8") and not fmt.is_turboquant("auto")
    spec = fmt.tq_spec("turboquant_4bit_nc")
    with pytest.raises(ValueError, match="head sizes"):
        fmt.slot_bytes(spec, 96)
    with pytest.raises(ValueError, match="multiple of 16"):
        fmt.cache_shape(4, 24, 2, 128, spec)
    wrong = torch.zeros(4, 16, 2, 100, dtype=torch.uint8)
    with pytest.raises(ValueError, match="slot of 100 bytes"):
        fmt.cache_geometry(wrong, spec, 128)


def test_boundary_layers_follow_upstream_0_21(fmt: ModuleType) -> None:
    assert fmt.boundary_layers(48) == {0, 1, 46, 47}
    assert fmt.boundary_layers(3) == {0, 2}  # n capped at half the layers
    assert fmt.boundary_layers(48, n=0) == set()
    qwen35 = {"layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 12}
    ids = fmt.full_attention_layer_ids(qwen35)
    assert ids == list(range(3, 48, 4))
    assert fmt.boundary_layers(48, ids) == set()  # hybrids keep every attention layer quantised
    assert fmt.full_attention_layer_ids({"layers_block_type": ["mamba", "attention", "hybrid"]}) == [1, 2]
    assert fmt.full_attention_layer_ids({"attn_type_list": [0, 1, 0, 1]}) == [1, 3]
    assert fmt.full_attention_layer_ids({"num_hidden_layers": 4}) is None
    with pytest.raises(ValueError, match="names none"):
        fmt.boundary_layers(48, fmt.full_attention_layer_ids({"layer_types": ["linear_attention"] * 4}))


def test_rotation_is_orthogonal_deterministic_and_seeded(fmt: ModuleType) -> None:
    for d in (128, 256):
        r = fmt.rotation(d).double()
        assert torch.allclose(r @ r.T, torch.eye(d, dtype=torch.float64), atol=1e-6)
        assert torch.equal(fmt.rotation(d), fmt.rotation(d))
    assert not torch.equal(fmt.rotation(128), fmt.rotation(128, seed=1))
    # a constant vector (all channels equal) is spread over every coordinate, unlike a bare Hadamard
    y = torch.ones(128) @ fmt.rotation(128).T
    assert float(y.abs().max()) < 0.5 * math.sqrt(128)


# ---- codebook and distortion against the TurboQuant paper ----


@pytest.mark.parametrize("d", [128, 256])
def test_codebook_is_symmetric_and_sorted(fmt: ModuleType, d: int) -> None:
    for bits in (3, 4):
        c, mid = fmt.codebook(d, bits)
        assert c.numel() == 2 ** bits and mid.numel() == 2 ** bits - 1
        assert bool((c[1:] > c[:-1]).all())
        assert torch.allclose(c, -c.flip(0), atol=1e-7)
        assert torch.allclose(mid, (c[1:] + c[:-1]) / 2)


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_unit_vector_mse_is_the_papers(fmt: ModuleType, bits: int) -> None:
    # the paper rounds (0.36, 0.117, 0.03, 0.009); the exact Gaussian Lloyd-Max values are Max's
    for d in (128, 256):
        integral = fmt.codebook_mse(d, bits)
        assert abs(integral - fmt.PAPER_MSE[bits]) <= 0.16 * fmt.PAPER_MSE[bits]
        assert abs(integral - BENCH.GAUSSIAN_LLOYD_MAX[bits]) <= 0.03 * BENCH.GAUSSIAN_LLOYD_MAX[bits]
    measured = fmt.unit_vector_mse(256, bits, 3000)
    assert abs(measured - fmt.codebook_mse(256, bits)) <= 0.03 * fmt.codebook_mse(256, bits)


def test_norm_correction_keeps_unit_length_and_distortion(fmt: ModuleType) -> None:
    for bits in (3, 4):
        plain = fmt.unit_vector_mse(128, bits, 2000)
        corrected = fmt.unit_vector_mse(128, bits, 2000, norm_correction=True)
        assert corrected <= 1.05 * plain  # same distortion class at the bit widths the dtypes use


# ---- bit packing ----


def test_packing_of_hand_checked_codes(fmt: ModuleType) -> None:
    four = torch.tensor([1, 2, 3, 4, 5, 6, 7, 15])
    assert fmt.pack_codes(four, 4).tolist() == [0x21, 0x43, 0x65, 0xF7]
    three = torch.arange(8)
    # low 2 bits 0,1,2,3,0,1,2,3 four to a byte; high bits 0,0,0,0,1,1,1,1 eight to a byte
    assert fmt.pack_codes(three, 3).tolist() == [0xE4, 0xE4, 0xF0]


@pytest.mark.parametrize("bits", [3, 4])
def test_packing_round_trips(fmt: ModuleType, bits: int) -> None:
    codes = torch.randint(0, 2 ** bits, (5, 3, 256), generator=torch.Generator().manual_seed(bits))
    packed = fmt.pack_codes(codes, bits)
    assert packed.shape == (5, 3, 256 * bits // 8) and packed.dtype == torch.uint8
    assert torch.equal(fmt.unpack_codes(packed, bits, 256), codes)


# ---- store: kernel against reference, and what the bytes mean ----

_CACHES: Dict[Tuple[str, int], Dict[str, Any]] = {}


def stored(fmt: ModuleType, tq: ModuleType, name: str, d: int) -> Dict[str, Any]:
    """Keys/values written into a kernel cache and a reference cache (built once per dtype and size).

    90 of the 96 slots are written in random order, 4 slot_mapping entries are -1 and their rows
    (and the padding rows past slot_mapping) are NaN: any read of them would show.
    """
    if (name, d) not in _CACHES:
        spec = fmt.tq_spec(name)
        gen = torch.Generator().manual_seed(d + len(name))
        slots = torch.randperm(PAGES * BLOCK, generator=gen)[:90]
        mapping = torch.cat([slots[:30], torch.full((2,), -1), slots[30:], torch.full((2,), -1)])
        n = mapping.numel()
        key = (torch.randn(n + 3, HKV, d, generator=gen) * torch.exp(torch.randn(HKV, d, generator=gen))).to(torch.bfloat16)
        value = torch.randn(n + 3, HKV, d, generator=gen).to(torch.bfloat16)
        skipped = torch.cat([mapping < 0, torch.ones(3, dtype=torch.bool)])
        key[skipped] = float("nan")
        value[skipped] = float("nan")
        kernel = torch.zeros(fmt.cache_shape(PAGES, BLOCK, HKV, d, spec), dtype=torch.uint8)
        reference = kernel.clone()
        tq.tq_store(key, value, kernel, mapping, spec)
        fmt.ref_store(key, value, reference, mapping, spec)
        _CACHES[(name, d)] = {"spec": spec, "key": key, "value": value, "mapping": mapping, "kernel": kernel, "reference": reference}
    return _CACHES[(name, d)]


def _by_slot(fmt: ModuleType, case: Dict[str, Any], d: int) -> Tuple[Any, Any, Any, Any]:
    """Dequantised kernel cache read back one slot per token, next to the original key/value."""
    keep = case["mapping"] >= 0
    slots = case["mapping"][keep]
    table = torch.arange(PAGES, dtype=torch.int32)[None, :]
    k, v = fmt.ref_dequant(case["kernel"], table, [PAGES * BLOCK], case["spec"], d, torch.float32)
    n = case["mapping"].numel()
    return k[0, slots], v[0, slots], case["key"][:n][keep].float(), case["value"][:n][keep].float()


@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("name", DTYPES)
def test_store_kernel_writes_the_reference_bytes(fmt: ModuleType, tq: ModuleType, name: str, d: int) -> None:
    case = stored(fmt, tq, name, d)
    assert torch.equal(case["kernel"], case["reference"])
    # the 6 slots never named stay untouched (all zero bytes) in every sub-array of their head
    written = set(case["mapping"][case["mapping"] >= 0].tolist())
    free = [s for s in range(PAGES * BLOCK) if s not in written]
    table = torch.arange(PAGES, dtype=torch.int32)[None, :]
    k, v = fmt.ref_dequant(case["kernel"], table, [PAGES * BLOCK], case["spec"], d, torch.float32)
    assert len(free) == 6 and float(k[0, free].abs().sum() + v[0, free].abs().sum()) == 0.0


@pytest.mark.parametrize("name", DTYPES)
def test_a_prefills_store_writes_the_same_bytes_as_token_by_token(fmt: ModuleType, tq: ModuleType, name: str) -> None:
    """A prefill's rows take the store variant of several tokens a program (store_tokens), a decode
    step's one token a program: the same tokens stored either way give the same cache bytes."""
    spec = fmt.tq_spec(name)
    n = tq.ROTATE_FEW_ROWS // HKV + 5
    assert tq.store_tokens(n * HKV) > 1 and tq.store_tokens(HKV) == 1
    gen = torch.Generator().manual_seed(n)
    key, value = (torch.randn(n, HKV, 128, generator=gen).to(torch.bfloat16) for _ in range(2))
    mapping = torch.randperm(PAGES * BLOCK * 3, generator=gen)[:n]
    mapping[7] = -1
    at_once, one_by_one = (torch.zeros(fmt.cache_shape(PAGES * 3, BLOCK, HKV, 128, spec), dtype=torch.uint8) for _ in range(2))
    tq.tq_store(key, value, at_once, mapping, spec)
    for t in range(n):
        tq.tq_store(key[t:t + 1], value[t:t + 1], one_by_one, mapping[t:t + 1], spec)
    reference = torch.zeros_like(at_once)
    fmt.ref_store(key, value, reference, mapping, spec)
    assert torch.equal(at_once, reference) and torch.equal(one_by_one, reference)


@pytest.mark.parametrize("name", DTYPES)
def test_values_are_within_half_a_step(fmt: ModuleType, tq: ModuleType, name: str) -> None:
    case = stored(fmt, tq, name, 128)
    _, v_hat, _, v = _by_slot(fmt, case, 128)
    step = (v.amax(-1) - v.amin(-1)) / (2 ** case["spec"].value_bits - 1)
    # half a step, plus the float16 rounding of scale (x code <= 15) and zero point
    slack = step * (0.5 + 16 * 2 ** -11) + v.abs().amax(-1) * 2 ** -10
    assert bool(((v_hat - v).abs() <= slack[..., None]).all())


@pytest.mark.parametrize("name", DTYPES)
def test_keys_keep_their_length_and_codebook_distortion(fmt: ModuleType, tq: ModuleType, name: str) -> None:
    case = stored(fmt, tq, name, 256)
    spec = case["spec"]
    k_hat, _, k, _ = _by_slot(fmt, case, 256)
    if spec.key_fp8:
        assert torch.equal(k_hat, k.to(torch.float8_e4m3fn).float())
        return
    # norm correction: the rebuilt key has the original length up to float16 rounding
    assert torch.allclose(k_hat.norm(dim=-1), k.norm(dim=-1), rtol=2e-3)
    err = float((((k_hat - k) ** 2).sum(-1) / (k ** 2).sum(-1)).mean())
    expected = fmt.unit_vector_mse(256, spec.key_bits, 2000, norm_correction=True)
    assert 0.7 * expected <= err <= 1.3 * expected


# ---- decode and dequant: kernel, reference from the codes, plain attention on the dequantised cache ----

LENS = [1, 21, 48]  # one token, a partial page, exactly three pages
TABLE = torch.tensor([[5, 2, 0], [1, 4, 2], [3, 0, 1]], dtype=torch.int32)


def plain_attention(fmt: ModuleType, case: Dict[str, Any], query: Any, d: int) -> Any:
    """float64 softmax attention over ref_dequant's keys and values (un-rotated), one query head at a time."""
    k, v = fmt.ref_dequant(case["kernel"], TABLE, LENS, case["spec"], d, torch.float64)
    out = torch.empty(query.shape, dtype=torch.float64)
    group = HQ // HKV
    for b, length in enumerate(LENS):
        for h in range(HQ):
            scores = (k[b, :length, h // group] @ query[b, h].double()) * d ** -0.5
            out[b, h] = torch.softmax(scores, 0) @ v[b, :length, h // group]
    return out


@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("name", DTYPES)
def test_decode_matches_reference_and_plain_attention(fmt: ModuleType, tq: ModuleType, name: str, d: int) -> None:
    case = stored(fmt, tq, name, d)
    query = torch.randn(len(LENS), HQ, d, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    lens = torch.tensor(LENS, dtype=torch.int32)
    plain = plain_attention(fmt, case, query, d)
    ref = fmt.ref_decode(query, case["kernel"], TABLE, lens, d ** -0.5, case["spec"])
    assert rel(ref, plain) < 1e-2  # bf16 output rounding only
    out = tq.tq_decode(query, case["kernel"], TABLE, lens, d ** -0.5, case["spec"])
    assert out.dtype == torch.bfloat16 and out.shape == query.shape
    assert rel(out, plain) < 1e-2
    # several splits per request, merged by log-sum-exp; 48 tokens make splits of 32, 16 and none
    cfg = tq.DecodeConfig(block_n=32, num_warps=4, num_stages=1, min_chunk=8)
    split = tq.tq_decode(query, case["kernel"], TABLE, lens, d ** -0.5, case["spec"], num_splits=3, config=cfg)
    assert rel(split, plain) < 1e-2
    # the one-token request attends to exactly its value
    assert torch.allclose(out[0].float(), plain[0].float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("group", [16, 1])
@pytest.mark.parametrize("value_fields", [4, 8])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("name", DTYPES)
def test_decode_variants_match_the_reference(fmt: ModuleType, tq: ModuleType, name: str, d: int, value_fields: int, group: int) -> None:
    """Every decode configuration the benchmark sweeps gives the reference's attention: GQA groups
    of 16 (Qwen3.5) and 1, 3-bit values in 4 or 8 fields, head 64 (its fields are narrower than
    tl.dot's 16 columns and padded), ragged lengths, and three splits of which the 21- and 48-token
    requests leave some empty."""
    case = stored(fmt, tq, name, d)
    query = torch.randn(len(LENS), HKV * group, d, generator=torch.Generator().manual_seed(group)).to(torch.bfloat16)
    lens = torch.tensor(LENS, dtype=torch.int32)
    ref = fmt.ref_decode(query, case["kernel"], TABLE, lens, d ** -0.5, case["spec"])
    cfg = tq.DecodeConfig(block_n=32, num_warps=4, num_stages=1, min_chunk=8, max_regs=128, value_fields=value_fields)
    out = tq.tq_decode(query, case["kernel"], TABLE, lens, d ** -0.5, case["spec"], num_splits=3, config=cfg)
    assert out.shape == query.shape and rel(out, ref) < 1e-2
    assert torch.allclose(out[0].float(), ref[0].float(), atol=2e-2, rtol=2e-2)


@pytest.mark.slow  # every value code, under Triton's interpreter
def test_value_fields_decode_every_code_exactly(fmt: ModuleType, tq: ModuleType) -> None:
    """Values whose codes are all one number c (for each c) come back as scale * c + zero for
    every element: each field's masked subnormal times its weight is the code, in both value
    layouts and both bit widths (an attention over one token returns its value)."""
    for name in ("turboquant_k3v4_nc", "turboquant_3bit_nc"):
        spec = fmt.tq_spec(name)
        d = 128
        for code in range(2 ** spec.value_bits):
            value = torch.zeros(BLOCK, HKV, d)
            value[:, :, 0] = -1.0  # the minimum: zero point -1 (exact in float16)
            value[:, :, 1:] = -1.0 + code * 0.25  # scale 0.25 after the maximum sets it
            value[:, :, 2] = -1.0 + (2 ** spec.value_bits - 1) * 0.25
            key = torch.randn(BLOCK, HKV, d, generator=torch.Generator().manual_seed(code))
            cache = torch.zeros(fmt.cache_shape(1, BLOCK, HKV, d, spec), dtype=torch.uint8)
            tq.tq_store(key, value, cache, torch.arange(BLOCK), spec)
            query = torch.randn(1, HKV, d, generator=torch.Generator().manual_seed(1))
            for fields in (4, 8):
                cfg = tq.DecodeConfig(32, 4, 1, 8, value_fields=fields)
                out = tq.tq_decode(query, cache, torch.zeros(1, 1, dtype=torch.int32), torch.tensor([1], dtype=torch.int32), 1.0, spec, config=cfg)
                expected = value[0, :, :].clone()
                assert torch.allclose(out[0].float(), expected, atol=1e-3), (name, code, fields)


def _partner(word: torch.Tensor, bits: int) -> torch.Tensor:
    """A bijection of bits-bit words that moves every one (an odd multiplier and an offset): the
    neighbour an inline-asm call of pack=2 gets beside each word, so that every word is seen in
    both halves of the register next to a different one."""
    return (word * 0x9E3779 + 0x5A5A5A) & ((1 << bits) - 1)


@pytest.mark.slow  # every 3-bit key word, under a PTX interpreter
def test_key3_pair_asm_gives_every_word_its_codebook_entries(fmt: ModuleType, tq: ModuleType) -> None:
    """KEY3_PAIR_ASM, run instruction by instruction by a PTX interpreter on every one of the 2^24
    key words (8 two-bit fields, 8 high bits) in the first half of its register pair, each beside
    another word in the second half and with noise in the unread bits 16-31 of the high bytes,
    returns in field f's register the float16 bits of entry (low | high << 2) of field f of both
    words: the text the GPU runs, checked where Triton's CPU interpreter cannot run it."""
    import ptx_subset

    half = fmt.codebook(256, 3)[0].to(torch.float16)
    entries = half.view(torch.int16).to(torch.int64) & 0xFFFF
    assert len(set(entries.tolist())) == 8  # distinct entries: a wrong pick cannot go unseen
    tables = {f"${10 + 2 * i + copy}": torch.tensor(word, dtype=torch.int64)
              for i, word in enumerate(tq.lut_words(half)) for copy in (0, 1)}
    step = 1 << 21
    for start in range(0, 1 << 24, step):
        first = torch.arange(start, start + step, dtype=torch.int64)
        second = _partner(first, 24)
        low = (first & 0xFFFF) | ((second & 0xFFFF) << 16)
        high = (first >> 16) | ((second >> 16) << 8) | ((first & 0xFFFF) << 16)  # bits 16-31: noise
        regs = ptx_subset.run(tq.KEY3_PAIR_ASM, {"$8": low, "$9": high, **tables})
        for f in range(8):
            for word, shift in ((first, 0), (second, 16)):
                code = ((word >> (2 * f)) & 3) | (((word >> (16 + f)) & 1) << 2)
                assert torch.equal((regs[f"${f}"] >> shift) & 0xFFFF, entries[code]), (start, f, shift)


def test_value4_asm_masks_each_field_of_both_words(tq: ModuleType) -> None:
    """VALUE4_ASM[f], run by the PTX interpreter on every 16-bit value word in the low half of its
    register beside another in the high half, gives field f of both words masked in place (the
    shift by 8 for fields 2 and 3 brings no bit of the high word into the low one): the subnormal
    _value_field's plain Triton path makes from one word."""
    import ptx_subset

    first = torch.arange(1 << 16, dtype=torch.int64)
    second = _partner(first, 16)
    for f, asm in enumerate(tq.VALUE4_ASM):
        out = ptx_subset.run(asm, {"$1": first | (second << 16)})["$0"]
        for word, shift in ((first, 0), (second, 16)):
            expected = (word if f < 2 else word >> 8) & (0xF << (4 * (f % 2)))
            assert torch.equal((out >> shift) & 0xFFFF, expected), (f, shift)


def test_lut_words_pack_low_and_high_bytes_and_refuse_other_tables(tq: ModuleType) -> None:
    entries = torch.tensor([0x0102, 0x0304, 0x0506, 0x0708, 0x090A, 0x0B0C, 0x0D0E, -0x0F10], dtype=torch.int16).view(torch.float16)
    assert tq.lut_words(entries) == (0x08060402, 0xF00E0C0A - (1 << 32), 0x07050301, 0xF00D0B09 - (1 << 32))
    with pytest.raises(ValueError, match="8 float16 entries"):
        tq.lut_words(torch.zeros(16, dtype=torch.float16))
    with pytest.raises(ValueError, match="8 float16 entries"):
        tq.lut_words(torch.zeros(8))


def test_inline_assembly_runs_on_a_gpu_only(tq: ModuleType) -> None:
    assert tq.inline_ptx(torch.device("cuda")) and tq.inline_ptx(torch.device("cuda", 1))
    assert not tq.inline_ptx(torch.device("cpu"))


def test_decode_config_refuses_unknown_variants_and_defaults_come_from_the_table(tq: ModuleType) -> None:
    """A shape gets its band's entry, else its batch or context band's, else the head size's '*'
    entry; head sizes without entries use 256's (>= 256) or 128's."""
    with pytest.raises(ValueError, match="value_fields must be 4 or 8"):
        tq.DecodeConfig(32, 4, 2, 128, value_fields=2)
    with pytest.raises(ValueError, match="block_n must be"):
        tq.DecodeConfig(16, 4, 2, 128)
    table = {(256, "1", "short", "*"): tq.DecodeConfig(32, 4, 3, 64), (256, "many", "*", "*"): tq.DecodeConfig(64, 8, 2, 256, 4),
             (256, "many", "long", "turboquant_3bit_nc"): tq.DecodeConfig(64, 2, 3, 128, 4, 0, 8),
             (256, "*", "*", "*"): tq.DecodeConfig(32, 4, 2, 128, 4, 128, 8), (128, "*", "*", "*"): tq.DecodeConfig(64, 4, 2, 128)}
    saved = dict(tq.DEFAULT_DECODE)
    try:
        tq.DEFAULT_DECODE.clear()
        tq.DEFAULT_DECODE.update(table)
        assert tq.default_decode_config(256, 1, 4096) == tq.default_decode_config(256, 1, 4096, "turboquant_3bit_nc") == table[(256, "1", "short", "*")]
        assert tq.default_decode_config(256, 8, 4096) == tq.default_decode_config(256, 8, 131072) == table[(256, "many", "*", "*")]
        assert tq.default_decode_config(256, 8, 131072, "turboquant_k3v4_nc") == table[(256, "many", "*", "*")]
        assert tq.default_decode_config(256, 8, 131072, "turboquant_3bit_nc") == table[(256, "many", "long", "turboquant_3bit_nc")]
        assert tq.default_decode_config(256, 1, 131072) == tq.default_decode_config(512, 1, 65536) == table[(256, "*", "*", "*")]
        assert tq.default_decode_config(64, 8, 4096) == tq.default_decode_config(128, 1, 131072) == table[(128, "*", "*", "*")]
    finally:
        tq.DEFAULT_DECODE.clear()
        tq.DEFAULT_DECODE.update(saved)
    for (head, _, _, _) in saved:  # the shipped table covers both head sizes
        assert isinstance(tq.default_decode_config(head, 8, 131072), tq.DecodeConfig)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_rotate_is_float32_matmul_for_strided_inputs_and_any_row_count(fmt: ModuleType, tq: ModuleType, d: int) -> None:
    """tq_decode and tq_store rotate with tq.rotate, not torch.matmul (cuBLAS's float32 GEMM is slow
    for a decode step's few rows); it must give the same float32 numbers: a key view with a
    padded row stride as vLLM passes it, one row, and more rows than one tile size covers."""
    rot = fmt.rotation(d, "cpu").T.contiguous()
    gen = torch.Generator().manual_seed(d)
    padded = torch.randn(5, 3, d + 16, generator=gen).to(torch.bfloat16)[..., :d]  # stride(1) = d + 16
    few, many = tq.ROTATE_FEW_ROWS, tq.ROTATE_FEW_ROWS + 1  # the last row count of one kernel, the first of the other
    assert not tq.rotate_tiling(few) and tq.rotate_tiling(many)
    for x in (padded, padded[:1, :1], torch.randn(few, d, generator=gen), torch.randn(many, d, generator=gen),
              torch.randn(1030, d, generator=gen)):
        got = tq.rotate(x, rot)
        assert got.dtype == torch.float32 and got.shape == x.shape
        assert rel(got, torch.matmul(x.float(), rot)) < 1e-6
    assert tq.rotate(padded[:0], rot).shape == (0, 3, d)


class Launches:
    """Counts launches of a Triton kernel (grid[...](...)) and runs them."""

    def __init__(self, kernel: Any) -> None:
        self.kernel, self.count = kernel, 0

    def __getitem__(self, grid: Any) -> Any:
        self.count += 1
        return self.kernel[grid]


@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("queries,keys", [(8, 1), (1, 1), (0, 3), (3, 0), (0, 0), (24, 8), (17, 200)])
def test_rotate_pair_gives_rotates_numbers_in_one_launch_when_the_rows_are_few(
        fmt: ModuleType, tq: ModuleType, monkeypatch: pytest.MonkeyPatch, d: int, queries: int, keys: int) -> None:
    """A decode step's query rows and key rows go through one _rotate_few_kernel launch (each launch
    costs about as much as its arithmetic); the numbers are rotate()'s, bit for bit, on views into
    one qkv buffer as vLLM hands them; past ROTATE_FEW_ROWS rows together each is rotate()d alone."""
    rot = fmt.rotation(d, "cpu").T.contiguous()
    gen = torch.Generator().manual_seed(d + queries)
    qkv = torch.randn(max(queries, keys, 1), (HQ + 2 * HKV) * d, generator=gen).to(torch.bfloat16)
    query = qkv[:queries, :HQ * d].view(queries, HQ, d)
    key = qkv[:keys, HQ * d:(HQ + HKV) * d].view(keys, HKV, d)
    few, tiled = Launches(tq._rotate_few_kernel), Launches(tq._rotate_kernel)
    monkeypatch.setattr(tq, "_rotate_few_kernel", few)
    monkeypatch.setattr(tq, "_rotate_kernel", tiled)
    got_q, got_k = tq.rotate_pair(query, key, rot)
    launched = (few.count, tiled.count)
    assert torch.equal(got_q, tq.rotate(query, rot)) and torch.equal(got_k, tq.rotate(key, rot))
    assert (got_q.shape, got_k.shape) == (query.shape, key.shape) and got_q.dtype == got_k.dtype == torch.float32
    rows = queries * HQ + keys * HKV
    if tq.rotate_tiling(rows):
        assert launched == (int(0 < queries * HQ <= tq.ROTATE_FEW_ROWS) + int(0 < keys * HKV <= tq.ROTATE_FEW_ROWS),
                            int(tq.rotate_tiling(queries * HQ)) + int(tq.rotate_tiling(keys * HKV)))
    else:
        assert launched == (int(rows > 0), 0)


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("decodes,stored_tokens", [(3, 3), (2, 5), (0, 4), (3, 0)])
def test_a_step_stores_then_decodes_as_store_and_decode_do(fmt: ModuleType, tq: ModuleType, name: str,
                                                           decodes: int, stored_tokens: int) -> None:
    """forward's tq_store_decode: the same cache bytes as tq_store and the same decode rows as
    tq_decode after it (the decode sees this step's tokens), whether the step's keys were rotated
    with its queries or not, including a token whose slot is -1 and keys past the slot mapping."""
    spec, d = fmt.tq_spec(name), 128
    case = stored(fmt, tq, name, d)
    gen = torch.Generator().manual_seed(decodes * 10 + stored_tokens)
    qkv = torch.randn(stored_tokens + 2, (HQ + 2 * HKV) * d, generator=gen).to(torch.bfloat16)
    query = torch.randn(decodes, HQ, d, generator=gen).to(torch.bfloat16)
    key = qkv[:, HQ * d:(HQ + HKV) * d].view(-1, HKV, d)
    value = qkv[:, (HQ + HKV) * d:].view(-1, HKV, d)
    free = [s for s in range(PAGES * BLOCK) if s not in set(case["mapping"].tolist())]
    slots = torch.tensor(([-1] + free)[:stored_tokens], dtype=torch.int64)
    table = torch.arange(PAGES, dtype=torch.int32).repeat(max(decodes, 1), 1)[:decodes]
    lens = torch.tensor([PAGES * BLOCK - r for r in range(decodes)], dtype=torch.int32)
    apart, together = case["kernel"].clone(), case["kernel"].clone()
    tq.tq_store(key, value, apart, slots, spec)
    expected = tq.tq_decode(query, apart, table, lens, d ** -0.5, spec)
    out = torch.full_like(query, float("nan"))
    tq.tq_store_decode(query, key, value, together, slots, table, lens, d ** -0.5, spec, out)
    assert torch.equal(together, apart)
    assert torch.equal(out, expected)
    if stored_tokens > 1:
        assert not torch.equal(together, case["kernel"])  # the step stored something


@pytest.mark.parametrize("splits", [5, 20, 40, 100])
def test_merge_weights_each_used_split_by_its_log_sum_exp(tq: ModuleType, splits: int) -> None:
    """The merge reads merge_rows(splits) splits a step (16 to 64): every split a request used is
    weighted by 2^lse (one that saw no token, lse -inf, by 0), the unused ones are never read."""
    assert tq.merge_rows(splits) == {5: 16, 20: 32, 40: 64, 100: 64}[splits]
    cfg = tq.DecodeConfig(block_n=32, num_warps=4, num_stages=1, min_chunk=8)  # used: len / 8 splits at most
    lens = torch.tensor([splits * 8, 25], dtype=torch.int32)  # every split used; 4 used
    gen = torch.Generator().manual_seed(splits)
    part_o = torch.randn(2 * HQ * splits, 128, generator=gen)
    part_lse = torch.randn(2 * HQ * splits, generator=gen) * 4
    part_lse[1::7] = float("-inf")
    parts, lses = part_o.view(2, HQ, splits, 128), part_lse.view(2, HQ, splits)
    want = torch.empty(2, HQ, 128, dtype=torch.float64)
    for b, used in enumerate((splits, min(splits, 4))):
        w = torch.exp2(lses[b, :, :used].double() - lses[b, :, :used].double().amax(-1, keepdim=True))
        want[b] = (w[..., None] * parts[b, :, :used].double()).sum(1) / w.sum(-1, keepdim=True)
        parts[b, :, used:] = float("nan")
        lses[b, :, used:] = float("nan")
    out = torch.empty(2, HQ, 128, dtype=torch.bfloat16)
    tq.merge_splits(part_o, part_lse, lens, out, splits, cfg)
    assert rel(out.double(), want) < 1e-2
    for fields in (4, 8):  # the split kernel's field-major columns: column f * 128 / F + w is element F w + f
        field_major = parts.reshape(2, HQ, splits, 128 // fields, fields).transpose(-1, -2).reshape(-1, 128).contiguous()
        put_back = torch.empty_like(out)
        tq.merge_splits(field_major, part_lse, lens, put_back, splits, cfg, fields)
        assert torch.equal(put_back, out)


def test_decode_writes_into_out_and_gives_zeros_for_an_empty_request(fmt: ModuleType, tq: ModuleType) -> None:
    case = stored(fmt, tq, "turboquant_k3v4_nc", 128)
    query = torch.randn(2, HQ, 128, generator=torch.Generator().manual_seed(3)).to(torch.float16)
    out = torch.full_like(query, float("nan"))
    lens = torch.tensor([0, 20], dtype=torch.int32)
    got = tq.tq_decode(query, case["kernel"], TABLE[:2], lens, 0.1, case["spec"], out=out)
    assert got.data_ptr() == out.data_ptr() and got.dtype == torch.float16
    assert float(out[0].abs().max()) == 0.0
    ref = fmt.ref_decode(query, case["kernel"], TABLE[:2], lens, 0.1, case["spec"])
    assert rel(out[1], ref[1]) < 1e-2


def test_decode_refuses_heads_that_do_not_group(fmt: ModuleType, tq: ModuleType) -> None:
    case = stored(fmt, tq, "turboquant_k3v4_nc", 128)
    with pytest.raises(ValueError, match="not a multiple"):
        tq.tq_decode(torch.zeros(1, 3, 128), case["kernel"], TABLE[:1], torch.tensor([4], dtype=torch.int32), 0.1, case["spec"])


@pytest.mark.parametrize("name", DTYPES)
def test_dequant_varlen_packs_the_reference(fmt: ModuleType, tq: ModuleType, name: str) -> None:
    case = stored(fmt, tq, name, 128)
    cu = torch.tensor([0, 1, 22, 70], dtype=torch.int32)
    k_ref, v_ref = fmt.ref_dequant(case["kernel"], TABLE, LENS, case["spec"], 128, torch.float32)
    want_k = torch.cat([k_ref[b, :n] for b, n in enumerate(LENS)])
    want_v = torch.cat([v_ref[b, :n] for b, n in enumerate(LENS)])
    k, v = tq.tq_dequant_varlen(case["kernel"], TABLE, cu, case["spec"], 128, torch.float32)
    assert k.shape == v.shape == (70, HKV, 128)
    assert torch.allclose(k, want_k, atol=1e-5, rtol=1e-5) and torch.equal(v, want_v)
    k16, v16 = tq.tq_dequant_varlen(case["kernel"], TABLE, cu, case["spec"], 128, torch.bfloat16, total_k=70)
    assert k16.dtype == v16.dtype == torch.bfloat16
    # within one bfloat16 step (the interpreter truncates where the GPU rounds)
    assert torch.allclose(v16.float(), want_v, rtol=2 ** -7, atol=0) and torch.allclose(k16.float(), want_k, rtol=2 ** -7, atol=1e-6)


def test_dequant_varlen_reads_from_first_row_for_more_than_16_requests(fmt: ModuleType, tq: ModuleType) -> None:
    """The prefill passes the whole block table and its first prefill row; requests are found in
    chunks of 16 ends, so 20 requests cross a chunk."""
    case = stored(fmt, tq, "turboquant_k3v4_nc", 128)
    rows = [b % 3 for b in range(20)]
    lens = [1 + (7 * b) % LENS[r] for b, r in enumerate(rows)]
    table = torch.cat([TABLE[[2, 1]], TABLE[rows]])  # two decode rows first, which must not be read
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
    k_ref, v_ref = fmt.ref_dequant(case["kernel"], TABLE[rows], lens, case["spec"], 128, torch.float32)
    k, v = tq.tq_dequant_varlen(case["kernel"], table, cu, case["spec"], 128, torch.float32, first_row=2)
    assert torch.allclose(k, torch.cat([k_ref[b, :n] for b, n in enumerate(lens)]), atol=1e-5, rtol=1e-5)
    assert torch.equal(v, torch.cat([v_ref[b, :n] for b, n in enumerate(lens)]))


@pytest.mark.parametrize("name", DTYPES)
def test_warm_up_runs_each_decode_variant_once_on_a_scratch_cache(fmt: ModuleType, tq: ModuleType, name: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up warm-up needs nothing but the layer's geometry (the GPU compiles; here it runs):
    one decode per (decode config, rotate tiling) over batches 1..max_batch for each table capacity
    (here one short and one long table: both context bands), a store with each rotate kernel (one
    token, a prefill's many), the dequant."""
    decoded, stored_rows, real, real_store = [], [], tq.tq_decode, tq.tq_store

    def record(query, kv_cache, block_table, *args, **kwargs):
        decoded.append((query.shape[0], block_table.shape[1] * 16))
        return real(query, kv_cache, block_table, *args, **kwargs)

    def record_store(key, *args, **kwargs):
        stored_rows.append(key.shape[0] * key.shape[1])
        return real_store(key, *args, **kwargs)

    monkeypatch.setattr(tq, "tq_decode", record)
    monkeypatch.setattr(tq, "tq_store", record_store)
    monkeypatch.setattr(tq, "_WARMED", set())
    # a long-table config of its own, as head 256 has (head 128's bands share theirs)
    monkeypatch.setitem(tq.DEFAULT_DECODE, (128, "many", "long", "*"), tq.DecodeConfig(64, 4, 2, 128, 4))
    cpu = torch.device("cpu")
    spec = fmt.tq_spec(name)
    tq.warm_up(spec, 128, HQ, HKV, 16, [4096, 16384], 40, torch.bfloat16, cpu)

    def variant(batch: int, tokens: int) -> tuple:
        return tq.decode_config(spec, 128, HQ // HKV, batch, tokens, cpu), tq.rotate_tiling(batch * HQ)

    expected = list(dict.fromkeys(variant(b, t) for t in (4096, 16384) for b in range(1, 41)))  # first of each, in order
    assert [variant(b, t) for b, t in decoded] == expected
    assert {t for _, t in decoded} == {4096, 16384} and len(expected) >= 3
    assert [tq.rotate_tiling(rows) for rows in stored_rows] == [False, True]


def _warm_up_small(fmt: ModuleType, tq: ModuleType, table_tokens: Sequence[int] = (4096,), fresh: bool = True) -> None:
    """One warm-up of a small shape; fresh: as the first in a new process (nothing warmed before)."""
    if fresh:
        tq._WARMED.clear()
    tq.warm_up(fmt.tq_spec("turboquant_k8v4"), 128, HQ, HKV, 16, list(table_tokens), 3, torch.bfloat16, torch.device("cpu"))


def test_a_shape_warmed_once_in_a_process_is_not_warmed_again(fmt: ModuleType, tq: ModuleType,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """vLLM builds a layer group's metadata builder twice: the second build compiles and logs nothing;
    another shape (a wider table) is warmed."""
    monkeypatch.delenv(tq.ENV_WARMUP, raising=False)
    calls = []
    real = tq.compile_variants
    monkeypatch.setattr(tq, "compile_variants", lambda *args: calls.append(args[5]) or real(*args))
    with caplog.at_level("INFO", logger=tq.logger.name):
        _warm_up_small(fmt, tq)
        _warm_up_small(fmt, tq, fresh=False)
        _warm_up_small(fmt, tq, (4096, 20000), fresh=False)
    assert calls == [[4096], [4096, 20000]]
    assert len([r for r in caplog.records if "warm-up ran" in r.getMessage()]) == 2


def test_warm_up_says_what_it_ran_in_one_line(fmt: ModuleType, tq: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """The line the served report quotes: the decode batch sizes compile_variants ran, and the time."""
    monkeypatch.delenv(tq.ENV_WARMUP, raising=False)
    ran = []
    real = tq.compile_variants
    monkeypatch.setattr(tq, "compile_variants", lambda *args: ran.extend(real(*args)) or ran)
    with caplog.at_level("INFO", logger=tq.logger.name):
        _warm_up_small(fmt, tq)
    (line,) = [r.getMessage() for r in caplog.records]
    assert ran and line.startswith(f"sparkmods turboquant: warm-up ran the store, the prefill and {len(ran)} decode "
                                   f"variants (batch sizes {','.join(map(str, ran))}) in ")
    assert line.endswith(" s")


def test_a_warm_up_that_fails_is_one_warning_and_the_server_goes_on(fmt: ModuleType, tq: ModuleType,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv(tq.ENV_WARMUP, raising=False)

    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("out of resources: shared memory")

    monkeypatch.setattr(tq, "tq_decode", fail)
    with caplog.at_level("INFO", logger=tq.logger.name):
        _warm_up_small(fmt, tq)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "sparkmods turboquant: warm-up failed (RuntimeError: out of resources: shared memory); "
                    "kernels compile on first use")]


@pytest.mark.parametrize("value", ["0", "off", " No "])
def test_warm_up_switch_turns_it_off(fmt: ModuleType, tq: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                     caplog: pytest.LogCaptureFixture, value: str) -> None:
    monkeypatch.setenv(tq.ENV_WARMUP, value)
    monkeypatch.setattr(tq, "compile_variants", lambda *args: pytest.fail("warm-up ran while switched off"))
    with caplog.at_level("INFO", logger=tq.logger.name):
        _warm_up_small(fmt, tq)
    assert [r.getMessage() for r in caplog.records] == [
        "sparkmods turboquant: warm-up switched off (SPARKMODS_TURBOQUANT_WARMUP); kernels compile on first use"]


# ---- the GPU benchmark script's CPU-runnable parts ----


def test_bench_arguments_have_gpu_and_smoke_defaults() -> None:
    args = BENCH.parse_args(["--out", "x"])
    assert (args.head_size, args.kv_heads, args.q_heads, args.contexts, args.batches) == (256, 2, 32, [4096, 32768, 131072], [1, 8])
    smoke = BENCH.parse_args(["--out", "x", "--smoke", "--contexts", "5,9"])
    assert (smoke.head_size, smoke.q_heads, smoke.contexts) == (128, 4, [5, 9])
    assert not args.cold_l2 and BENCH.parse_args(["--out", "x", "--cold-l2"]).cold_l2  # back to back unless asked


@pytest.mark.parametrize("argv,message", [
    (["--out", "x", "--contexts", "4k"], "comma-separated integers"),
    (["--out", "x", "--batches", "0"], "positive integers"),
    (["--out", "x", "--block-size", "24"], "multiple of 16"),
    (["--out", "x", "--q-heads", "5"], "not a multiple"),
    (["--out", "x", "--upstream-site", "/nonexistent"], "site-packages of a vLLM"),
    (["--contexts", "4"], "--out"),
])
def test_bench_bad_arguments_are_one_line_and_exit_2(argv: list, message: str, capsys: pytest.CaptureFixture) -> None:
    assert BENCH.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_bench_upstream_site_that_cannot_import_is_exit_2(tmp_path: Path) -> None:
    marker = tmp_path / "site" / "vllm" / "v1" / "attention" / "ops" / "triton_turboquant_decode.py"
    marker.parent.mkdir(parents=True)
    marker.write_text("")
    proc = subprocess.run([sys.executable, str(BENCH_PATH), "--out", str(tmp_path / "o"), "--upstream-site", str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "cannot import vLLM's TurboQuant ops" in proc.stderr and not (tmp_path / "o").exists()


def test_bench_goal_check_reads_the_timings() -> None:
    timings = [{"kind": "ours turboquant_k3v4_nc", "batch": 1, "context": 32768, "us": 10.0},
               {"kind": "upstream turboquant_k3v4_nc", "batch": 1, "context": 32768, "us": 12.0},
               {"kind": "bf16 sdpa", "batch": 1, "context": 32768, "us": 9.0},
               {"kind": "bf16 triton split-kv", "batch": 1, "context": 32768, "us": 8.0},  # the fastest bf16 is the yardstick
               {"kind": "ours turboquant_k3v4_nc", "batch": 1, "context": 4096, "us": 5.0},
               {"kind": "upstream turboquant_k3v4_nc", "batch": 1, "context": 4096, "us": 4.0},
               {"kind": "bf16 sdpa", "batch": 1, "context": 4096, "us": 3.0}]
    lines = BENCH.verdicts(timings)
    assert lines == ["turboquant_k3v4_nc b1 ctx 4096: SLOWER vs upstream (5.0 vs 4.0 us)",
                     "turboquant_k3v4_nc b1 ctx 32768: OK vs upstream (10.0 vs 12.0 us); SLOWER vs bf16 triton split-kv (10.0 vs 8.0 us)"]
    matrix = BENCH.timing_matrix(timings)
    assert matrix[0] == {"kind": "ours turboquant_k3v4_nc", "b1 32k": 10.0, "b1 4k": 5.0}
    table = BENCH.markdown_table(matrix, ["kind", "b1 4k", "b1 32k"]).splitlines()
    assert table[2] == "| ours turboquant_k3v4_nc | 5 | 10 |" and table[3] == "| upstream turboquant_k3v4_nc | 4 | 12 |"


def test_bench_sweep_picks_a_timed_config_per_band_and_apply_defaults_writes_it(tq: ModuleType, tmp_path: Path) -> None:
    """The band winner is the config with the smallest mean log slowdown over the band's shapes
    (not the one fastest at a single shape), a config missing a shape of its band never wins, a
    dtype gets its own entry only where its own winner beats the shared one by OWN_ENTRY_GAIN,
    and --apply-defaults replaces only this head size's entries of the table."""
    fast, steady, partial = "n32/w4/s2/c128/p4/r128/f4", "n64/w4/s2/c128/p2/r0/f8", "n32/w4/s3/c64/p4/r0/f4"
    times = {("turboquant_k3v4_nc", 1, 32768): {fast: 10.0, steady: 12.0, partial: 1.0},
             ("turboquant_k3v4_nc", 1, 131072): {fast: 40.0, steady: 20.0},
             ("turboquant_k3v4_nc", 8, 4096): {fast: 5.0, steady: 6.0},
             ("turboquant_3bit_nc", 8, 4096): {fast: 6.6, steady: 6.0},  # 10 % better alone: own entry
             ("turboquant_4bit_nc", 8, 4096): {fast: 6.0, steady: 5.9}}  # 1.7 %: shares the band's
    rows = [{"dtype": name, "batch": b, "context": c, "config": cfg, "us": us} for (name, b, c), by in times.items() for cfg, us in by.items()]
    rows.append({"dtype": "turboquant_k3v4_nc", "batch": 8, "context": 4096, "config": partial, "us": None})
    table = BENCH.default_table(tq, 256, rows)
    assert table == {(256, "1", "long", "*"): steady, (256, "many", "short", "*"): fast, (256, "many", "short", "turboquant_3bit_nc"): steady}
    lines = BENCH.table_lines(tq, table)
    assert lines[2] == '    (256, "many", "short", "turboquant_3bit_nc"): DecodeConfig(64, 4, 2, 128, 2, 0, 8),'
    assert lines[-1] == '    (256, "*", "*", "*"): DecodeConfig(64, 4, 2, 128, 2, 0, 8),'  # no "many long": the first band
    assert all(BENCH.config_from_label(tq, label).label() == label for label in (fast, steady, partial))
    best = BENCH.sweep_summary(tq, 256, rows, [{"kind": "bf16 sdpa", "batch": 1, "context": 32768, "us": 2.0}])
    assert best[0]["best"] == partial and best[0]["vs_bf16"] == 0.5
    module = tmp_path / "tq_triton.py"
    source = (REPO / "mods" / "turboquant" / "files" / "tq_triton.py").read_text()
    module.write_text(source)
    results = tmp_path / "turboquant_bench.json"
    results.write_text(json.dumps({"meta": {"head_size": 256}, "sweep": rows}))
    BENCH.apply_defaults(results, module, tq)
    written = module.read_text()
    assert written.count('(256, "') == 4 and '(128, "*", "*", "*")' in written and lines[0] in written and lines[2] in written
    assert written.replace("\n".join(lines), "") != source  # only the table changed, and it did
    results.write_text(json.dumps({"meta": {"head_size": 256}}))
    with pytest.raises(BENCH.InputError, match="no sweep"):
        BENCH.apply_defaults(results, module, tq)
    results.write_text(json.dumps({"meta": {"head_size": 256}, "sweep": [dict(r, us=None) for r in rows]}))
    with pytest.raises(BENCH.InputError, match="timed nothing"):
        BENCH.apply_defaults(results, module, tq)
    assert module.read_text() == written  # refused runs leave the file as it was


def test_bench_sweep_bands_rows_by_the_table_they_were_timed_with(tq: ModuleType) -> None:
    """vLLM hands the decode a block table as wide as --max-model-len, so the decode's band comes
    from that width, not the context: a 4k row timed on a 128k-wide table belongs to the long band,
    and the shipped config it is compared with is the long band's."""
    served = tq.default_decode_config(256, 8, 131072, "turboquant_k3v4_nc").label()
    narrow = tq.default_decode_config(256, 8, 4096, "turboquant_k3v4_nc").label()
    assert served != narrow
    rows = [{"dtype": "turboquant_k3v4_nc", "batch": 8, "context": 4096, "table_tokens": 131072, "config": cfg, "us": us}
            for cfg, us in ((served, 7.0), (narrow, 5.0))]
    assert BENCH.default_table(tq, 256, rows) == {(256, "many", "long", "*"): narrow}
    [summary] = BENCH.sweep_summary(tq, 256, rows, [])
    assert (summary["best"], summary["default_us"]) == (narrow, 7.0)
    old = [{k: v for k, v in r.items() if k != "table_tokens"} for r in rows]  # results from before: cut tables
    assert BENCH.default_table(tq, 256, old) == {(256, "many", "short", "*"): narrow}


def test_bench_bf16_yardstick_is_attention_with_our_merge(tq: ModuleType) -> None:
    """The bench's bf16 split-KV kernel, merged by tq.merge_splits, is plain attention (several splits)."""
    gen = torch.Generator().manual_seed(11)
    q4, k4, v4 = (torch.randn(*shape, generator=gen).to(torch.bfloat16) for shape in ((2, 2, 4, 64), (2, 2, 300, 64), (2, 2, 300, 64)))
    got = BENCH.load_bf16_yardstick().bf16_decoder(tq, q4, k4, v4, 0.125, True)()
    k, v = k4.double().repeat_interleave(4, dim=1), v4.double().repeat_interleave(4, dim=1)
    want = torch.softmax(q4.double().reshape(2, 8, 1, 64) @ k.transpose(-1, -2) * 0.125, dim=-1) @ v
    assert got.shape == (2, 8, 64) and rel(got.double(), want.reshape(2, 8, 64)) < 1e-2


def test_a_source_variant_decodes_as_the_shipped_kernel_and_refuses_a_stale_edit(fmt: ModuleType, tq: ModuleType) -> None:
    """tq_variants' head-first grid is a copy of tq_triton.py with the split kernel's first two grid
    axes swapped: the same programs in another launch order, so the same bytes out; an edit that no
    longer matches the kernel is refused in one line."""
    variants = load_script(REPO / "ci" / "bench" / "tq_variants.py")
    case = stored(fmt, tq, "turboquant_k3v4_nc", 128)
    query = torch.randn(len(LENS), HQ, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    lens = torch.tensor(LENS, dtype=torch.int32)
    cfg = tq.DecodeConfig(block_n=32, num_warps=4, num_stages=1, min_chunk=8)
    shipped = tq.tq_decode(query, case["kernel"], TABLE, lens, 128 ** -0.5, case["spec"], num_splits=3, config=cfg)
    decode = variants.VARIANTS["head-first-grid"](tq)["tq_decode"]
    assert decode is not tq.tq_decode
    assert torch.equal(decode(query, case["kernel"], TABLE, lens, 128 ** -0.5, case["spec"], num_splits=3, config=cfg), shipped)
    for name, make in variants.VARIANTS.items():  # every variant's edits match the kernel as it is now
        assert all(hasattr(tq, attr) for attr in make(tq)), name
    with pytest.raises(variants.EditError, match=r"matches \S+tq_triton\.py 0 times, not once"):
        variants.edited_module("stale", tq.__file__, (("no such text in the kernel", "x"),))
    # --against: another copy of the file is its own module, and a source variant edits that copy
    against = variants._import_copy("against", Path(tq.__file__).read_text())
    assert against is not tq and against.tq_decode is not tq.tq_decode
    decode = variants.VARIANTS["head-first-grid"](against)["tq_decode"]
    assert decode.__module__ != variants.VARIANTS["head-first-grid"](tq)["tq_decode"].__module__
    assert torch.equal(against.tq_decode(query, case["kernel"], TABLE, lens, 128 ** -0.5, case["spec"], num_splits=3,
                                         config=against.DecodeConfig(32, 4, 1, 8)), shipped)


def test_tq_variants_refuses_an_unknown_variant_and_a_missing_against_file_in_one_line(tmp_path: Path) -> None:
    script = str(REPO / "ci" / "bench" / "tq_variants.py")
    for extra, says in ((["--variants", "shipped,warp"], "no variant warp; known: shipped"),
                        (["--against", str(tmp_path / "absent.py")], f"--against {tmp_path / 'absent.py'}: no such file")):
        proc = subprocess.run([sys.executable, script, "--out", str(tmp_path / "out"), *extra],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and says in proc.stderr.strip().splitlines()[-1], proc.stderr[-500:]
        assert not (tmp_path / "out").exists()


def test_bench_smoke_run_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, str(BENCH_PATH), "--smoke", "--out", str(out), "--contexts", "1,37", "--batches", "2",
                           "--dtypes", "turboquant_k3v4_nc"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((out / "turboquant_bench.json").read_text())
    rows = results["correctness"]
    assert [(r["batch"], r["context"]) for r in rows] == [(2, 1), (2, 37)]
    assert all(r["ours_vs_reference"] < BENCH.REL_TOLERANCE for r in rows)
    assert all(r["ours_vs_exact"] < 0.5 for r in rows)  # 3-bit keys, 4-bit values: noisy, not broken
    assert [r["bits"] for r in results["distortion"]] == [1, 2, 3, 4]
    assert {r["kind"]: r["ours"] for r in results["kv_bytes"]} == {"bf16": 1024, "fp8": 512, "turboquant_k3v4_nc": 236}
    assert results["failures"] == [] and results["meta"]["device"].startswith("cpu")
    report = (out / "turboquant_bench.md").read_text()
    assert "## Unit-vector MSE per bit width" in report and "| turboquant_k3v4_nc | 2 | 37 |" in report
