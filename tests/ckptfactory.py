"""Tiny but realistic Qwen3.5-MoE checkpoints for tests and benchmarks (no torch needed).

Import it from any test (`from ckptfactory import ...`; pytest puts tests/ on sys.path) or
from a script after adding tests/ to sys.path. Files are written by the real `safetensors`
library from raw bytes, so float8_e4m3fn and bfloat16 need no framework, and the layout
is independent of sparkmods' own header code (a bug there cannot hide in the fixture).

Where the names come from (vLLM 0.24.0 wheel, read with `unzip -p`):
- `model.language_model.*`, `model.visual.*`, `lm_head.*` prefixes: `hf_to_vllm_mapper` of
  Qwen3VLForConditionalGeneration (models/qwen3_vl.py), which Qwen3.5-MoE inherits.
- decoder layer layout (`linear_attn` on layers where (i + 1) % 4 != 0, `self_attn` on
  layers 3, 7, ...; `input_layernorm`, `post_attention_layernorm`, `mlp`):
  Qwen3_5DecoderLayer (models/qwen3_5.py) and Qwen3_5MoeTextConfig.layer_types
  (transformers_utils/configs/qwen3_5_moe.py).
- Gated DeltaNet checkpoint names `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`:
  `stacked_params_mapping` in Qwen3_5Model.load_weights (they are fused into vLLM's
  `in_proj_qkvz` / `in_proj_ba` at load time; Qwen3-Next checkpoints store the fused names,
  Qwen3.5 ones do not); `conv1d` ([conv_dim, 1, kernel]), `dt_bias`, `A_log` (F32),
  `norm`, `out_proj`: QwenGatedDeltaNetAttention (layers/mamba/gdn/qwen_gdn_linear_attn.py),
  whose comment also says in_proj_ba has no block-FP8 support (so it stays BF16 in FP8).
- full attention `q_proj` (2 x heads x head_dim: query and gate), `k_proj`, `v_proj`,
  `o_proj`, `q_norm`, `k_norm`: Qwen3NextAttention (models/qwen3_next.py).
- MoE block `gate`, `shared_expert_gate`, `shared_expert.{gate,up,down}_proj`,
  `experts.{e}.{gate,up,down}_proj`: Qwen3NextSparseMoeBlock (models/qwen3_next.py).
- MTP head `mtp.fc`, `mtp.pre_fc_norm_hidden`, `mtp.pre_fc_norm_embedding`, `mtp.norm`,
  `mtp.layers.{i}.*` (a full-attention MoE decoder layer): Qwen3_5MultiTokenPredictor
  (models/qwen3_5_mtp.py). With 256 experts that is 17 + 3 x 256 = 785 tensors, the count
  Intel's checkpoint has.
- AutoRound GPTQ packing (qweight [in/8, out] int32, qzeros [in/group, out/8] int32,
  scales [in/group, out] F16) and the quantization_config keys (bits, group_size, sym,
  packing_format, extra_config, block_name_to_quantize): INCConfig and its WNA16 scheme
  (layers/quantization/inc/). Symmetric 4-bit GPTQ stores zero point 8 as 8 - 1 = 7 per
  nibble, hence qzeros 0x77777777.
Assumptions (not visible in vLLM): which layers the INT4 checkpoint quantizes (routed
experts and attention/DeltaNet projections INT4; shared experts, router gates, in_proj_a/b
kept at 16 bit and listed in extra_config) and which the FP8 one does (every projection
except in_proj_a/b, gates, embeddings and LM head, with weight_block_size [128, 128]).
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Literal, Mapping, Sequence

import numpy as np
import safetensors

# safetensors dtype code -> (numpy dtype used to produce the bytes, name the library expects)
_DTYPES: dict[str, tuple[str, str]] = {
    "BF16": ("uint16", "bfloat16"),
    "F16": ("float16", "float16"),
    "F32": ("float32", "float32"),
    "I32": ("int32", "int32"),
    "F8_E4M3": ("uint8", "float8_e4m3fn"),
    "U8": ("uint8", "uint8"),
}
GROUP_SIZE = 128
FP8_BLOCK = (128, 128)
GPTQ_SYM4_QZERO = 0x77777777


@dataclass(frozen=True)
class Shape:
    """Model dimensions; defaults are tiny (a few MB per checkpoint) but keep every rule.

    `shared_intermediate` defaults to 192, not a multiple of 128, so FP8 scales of the
    shared expert have a partial last block (ceil division matters).
    """

    num_layers: int = 4
    hidden: int = 256
    num_experts: int = 4
    moe_intermediate: int = 128
    shared_intermediate: int = 192
    vocab: int = 320
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    linear_key_heads: int = 2
    linear_value_heads: int = 4
    linear_head_dim: int = 64
    conv_kernel: int = 4
    full_attention_interval: int = 4
    mtp_layers: int = 1
    vision: bool = True

    def layer_type(self, i: int) -> str:
        return "full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"


@dataclass(frozen=True)
class Spec:
    """One tensor to write: safetensors dtype code and shape; data is generated."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(_DTYPES[self.dtype][0]).itemsize


Quant = Literal["int4", "fp8", "bf16"]


def _linear(name: str, out_f: int, in_f: int, quant: Quant) -> list[Spec]:
    """The tensors of one linear layer `name` stored as BF16, AutoRound INT4 or block FP8."""
    if quant == "int4":
        assert in_f % GROUP_SIZE == 0 and out_f % 8 == 0, (name, out_f, in_f)
        groups = in_f // GROUP_SIZE
        return [
            Spec(f"{name}.qweight", "I32", (in_f // 8, out_f)),
            Spec(f"{name}.qzeros", "I32", (groups, out_f // 8)),
            Spec(f"{name}.scales", "F16", (groups, out_f)),
        ]
    if quant == "fp8":
        rows, cols = (-(-out_f // FP8_BLOCK[0]), -(-in_f // FP8_BLOCK[1]))
        return [
            Spec(f"{name}.weight", "F8_E4M3", (out_f, in_f)),
            Spec(f"{name}.weight_scale_inv", "F32", (rows, cols)),
        ]
    return [Spec(f"{name}.weight", "BF16", (out_f, in_f))]


def _norm(name: str, size: int) -> Spec:
    return Spec(f"{name}.weight", "BF16", (size,))


def _moe(p: str, s: Shape, experts: Quant | None, shared: Quant) -> list[Spec]:
    """MoE block: router gate, shared expert (+ its gate), routed experts (None: omitted)."""
    h, m, si = s.hidden, s.moe_intermediate, s.shared_intermediate
    specs = [Spec(f"{p}.gate.weight", "BF16", (s.num_experts, h)),
             Spec(f"{p}.shared_expert_gate.weight", "BF16", (1, h))]
    specs += _linear(f"{p}.shared_expert.gate_proj", si, h, shared)
    specs += _linear(f"{p}.shared_expert.up_proj", si, h, shared)
    specs += _linear(f"{p}.shared_expert.down_proj", h, si, shared)
    if experts is not None:
        for e in range(s.num_experts):
            specs += _linear(f"{p}.experts.{e}.gate_proj", m, h, experts)
            specs += _linear(f"{p}.experts.{e}.up_proj", m, h, experts)
            specs += _linear(f"{p}.experts.{e}.down_proj", h, m, experts)
    return specs


def _full_attention(p: str, s: Shape, quant: Quant) -> list[Spec]:
    q_out, kv_out = 2 * s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    return [
        *_linear(f"{p}.q_proj", q_out, s.hidden, quant),
        *_linear(f"{p}.k_proj", kv_out, s.hidden, quant),
        *_linear(f"{p}.v_proj", kv_out, s.hidden, quant),
        *_linear(f"{p}.o_proj", s.hidden, s.num_heads * s.head_dim, quant),
        _norm(f"{p}.q_norm", s.head_dim),
        _norm(f"{p}.k_norm", s.head_dim),
    ]


def _linear_attention(p: str, s: Shape, quant: Quant) -> list[Spec]:
    key_dim = s.linear_key_heads * s.linear_head_dim
    value_dim = s.linear_value_heads * s.linear_head_dim
    conv_dim = 2 * key_dim + value_dim
    return [
        *_linear(f"{p}.in_proj_qkv", conv_dim, s.hidden, quant),
        *_linear(f"{p}.in_proj_z", value_dim, s.hidden, quant),
        *_linear(f"{p}.in_proj_b", s.linear_value_heads, s.hidden, "bf16"),
        *_linear(f"{p}.in_proj_a", s.linear_value_heads, s.hidden, "bf16"),
        Spec(f"{p}.conv1d.weight", "BF16", (conv_dim, 1, s.conv_kernel)),
        Spec(f"{p}.dt_bias", "BF16", (s.linear_value_heads,)),
        Spec(f"{p}.A_log", "F32", (s.linear_value_heads,)),
        _norm(f"{p}.norm", s.linear_head_dim),
        *_linear(f"{p}.out_proj", s.hidden, value_dim, quant),
    ]


def _decoder(p: str, s: Shape, kind: str, attn: Quant, experts: Quant | None, shared: Quant) -> list[Spec]:
    specs = [_norm(f"{p}.input_layernorm", s.hidden), _norm(f"{p}.post_attention_layernorm", s.hidden)]
    if kind == "full_attention":
        specs += _full_attention(f"{p}.self_attn", s, attn)
    else:
        specs += _linear_attention(f"{p}.linear_attn", s, attn)
    return specs + _moe(f"{p}.mlp", s, experts, shared)


def main_specs(s: Shape, *, attn: Quant, experts: Quant | None, shared: Quant) -> list[Spec]:
    """Every non-MTP tensor of a Qwen3.5-MoE checkpoint with the given storage per group."""
    lm = "model.language_model"
    specs = [Spec(f"{lm}.embed_tokens.weight", "BF16", (s.vocab, s.hidden))]
    for i in range(s.num_layers):
        specs += _decoder(f"{lm}.layers.{i}", s, s.layer_type(i), attn, experts, shared)
    specs += [_norm(f"{lm}.norm", s.hidden), Spec("lm_head.weight", "BF16", (s.vocab, s.hidden))]
    if s.vision:
        specs += [
            Spec("model.visual.patch_embed.proj.weight", "BF16", (64, 3, 2, 16, 16)),
            Spec("model.visual.merger.linear_fc1.weight", "BF16", (256, 256)),
            Spec("model.visual.merger.linear_fc2.weight", "BF16", (s.hidden, 256)),
        ]
    return specs


def mtp_specs(s: Shape, quant: Quant = "bf16") -> list[Spec]:
    """The MTP head: fc over [embedding; hidden], norms, and `mtp_layers` decoder layers."""
    specs = [
        Spec("mtp.fc.weight", "BF16", (s.hidden, 2 * s.hidden)),
        _norm("mtp.pre_fc_norm_hidden", s.hidden),
        _norm("mtp.pre_fc_norm_embedding", s.hidden),
        _norm("mtp.norm", s.hidden),
    ]
    for i in range(s.mtp_layers):
        specs += _decoder(f"mtp.layers.{i}", s, "full_attention", quant, quant, quant)
    return specs


def tensor_bytes(spec: Spec, seed: int) -> np.ndarray:
    """Deterministic, plausible data for `spec` (per name and seed) as a contiguous array."""
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    n = int(np.prod(spec.shape, dtype=np.int64))
    if spec.name.endswith(".qzeros"):
        return np.full(n, GPTQ_SYM4_QZERO, dtype=np.uint32).view(np.int32)
    if spec.dtype == "I32":
        info = np.iinfo(np.int32)
        return rng.integers(info.min, info.max, n, dtype=np.int32, endpoint=True)
    if spec.dtype == "F8_E4M3":
        data = rng.integers(0, 256, n, dtype=np.uint8)
        data[(data & 0x7F) == 0x7F] ^= 0x01  # 0x7F / 0xFF are NaN in e4m3fn
        return data
    values = rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)
    if spec.name.endswith(("weight_scale_inv", ".scales")):
        values = np.abs(values) + np.float32(1e-3)
    if spec.dtype == "BF16":
        return (values.view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(_DTYPES[spec.dtype][0])


def write_safetensors(
    path: Path,
    specs: Sequence[Spec],
    *,
    seed: int = 0,
    data: Mapping[str, bytes | bytearray] | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write one .safetensors file with the real library; `data` overrides generated bytes."""
    arrays = {}
    for spec in specs:
        raw = (data or {}).get(spec.name)
        arr = np.frombuffer(raw, dtype=np.uint8) if raw is not None else tensor_bytes(spec, seed)
        assert arr.nbytes == spec.nbytes, (spec, arr.nbytes)
        arrays[spec.name] = (spec, np.ascontiguousarray(arr))
    meta = dict(metadata or {"format": "pt"})
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.7: raw pointers
        tensors = {
            name: safetensors.TensorSpec(
                dtype=_DTYPES[spec.dtype][1], shape=list(spec.shape),
                data_ptr=arr.ctypes.data, data_len=arr.nbytes,
            )
            for name, (spec, arr) in arrays.items()
        }
    else:  # older releases take the bytes themselves
        tensors = {
            name: {"dtype": _DTYPES[spec.dtype][1], "shape": list(spec.shape), "data": arr.tobytes()}
            for name, (spec, arr) in arrays.items()
        }
    safetensors.serialize_file(tensors, str(path), metadata=meta)
    return Path(path)


def shard(specs: Sequence[Spec], max_bytes: int) -> list[list[Spec]]:
    """Split `specs` in order into shards of at most `max_bytes` (one big tensor: alone)."""
    shards: list[list[Spec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + spec.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    return shards


def write_checkpoint(
    root: Path,
    specs: Sequence[Spec],
    *,
    config: Mapping[str, object],
    shard_bytes: int = 1 << 20,
    extra_files: Mapping[str, Sequence[Spec]] | None = None,
    index_extra: bool = True,
    seed: int = 0,
    data: Mapping[str, bytes | bytearray] | None = None,
) -> Path:
    """A Hugging Face style folder: sharded model-XXXXX-of-YYYYY files, index, config.

    `extra_files` are further .safetensors files (e.g. the MTP file); `index_extra`
    says whether the index names their tensors. `data` gives the bytes of any tensor by
    name (the rest are generated), e.g. the designed weights of ci/gpu/tiny_qwen35.py.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    groups = shard(specs, shard_bytes)
    weight_map: dict[str, str] = {}
    total = 0
    for n, group in enumerate(groups, 1):
        name = f"model-{n:05d}-of-{len(groups):05d}.safetensors"
        write_safetensors(root / name, group, seed=seed, data=data)
        weight_map.update({spec.name: name for spec in group})
        total += sum(spec.nbytes for spec in group)
    for name, extra in (extra_files or {}).items():
        write_safetensors(root / name, extra, seed=seed, data=data)
        if index_extra:
            weight_map.update({spec.name: name for spec in extra})
            total += sum(spec.nbytes for spec in extra)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (root / "config.json").write_text(json.dumps(config, indent=2))
    (root / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.6}))
    return root


def text_config(s: Shape) -> dict[str, object]:
    return {
        "model_type": "qwen3_5_moe_text",
        "num_hidden_layers": s.num_layers,
        "hidden_size": s.hidden,
        "num_experts": s.num_experts,
        "moe_intermediate_size": s.moe_intermediate,
        "shared_expert_intermediate_size": s.shared_intermediate,
        "vocab_size": s.vocab,
        "num_attention_heads": s.num_heads,
        "num_key_value_heads": s.num_kv_heads,
        "head_dim": s.head_dim,
        "linear_num_key_heads": s.linear_key_heads,
        "linear_num_value_heads": s.linear_value_heads,
        "linear_key_head_dim": s.linear_head_dim,
        "linear_value_head_dim": s.linear_head_dim,
        "linear_conv_kernel_dim": s.conv_kernel,
        "full_attention_interval": s.full_attention_interval,
        "layer_types": [s.layer_type(i) for i in range(s.num_layers)],
        "mtp_num_hidden_layers": s.mtp_layers,
    }


def model_config(s: Shape, quantization_config: Mapping[str, object]) -> dict[str, object]:
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text_config(s),
        "quantization_config": dict(quantization_config),
    }


def autoround_config(s: Shape) -> dict[str, object]:
    """INT4 AutoRound quantization_config; 16-bit layers are listed in extra_config."""
    extra: dict[str, dict[str, int]] = {}
    for i in range(s.num_layers):
        p = f"model.language_model.layers.{i}"
        for proj in ("gate_proj", "up_proj", "down_proj"):
            extra[f"{p}.mlp.shared_expert.{proj}"] = {"bits": 16}
        if s.layer_type(i) == "linear_attention":
            extra[f"{p}.linear_attn.in_proj_b"] = {"bits": 16}
            extra[f"{p}.linear_attn.in_proj_a"] = {"bits": 16}
    return {
        "quant_method": "auto-round",
        "bits": 4,
        "group_size": GROUP_SIZE,
        "sym": True,
        "data_type": "int",
        "packing_format": "auto_round:auto_gptq",
        "block_name_to_quantize": "model.language_model.layers",
        "extra_config": extra,
    }


def fp8_config() -> dict[str, object]:
    return {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(FP8_BLOCK),
        "modules_to_not_convert": ["lm_head", "mlp.gate", "shared_expert_gate", "in_proj_a", "in_proj_b"],
    }


MtpMode = Literal["indexed", "unindexed", "absent"]


def write_int4_autoround(
    root: Path, s: Shape = Shape(), *, mtp: MtpMode = "indexed", shard_bytes: int = 1 << 20, seed: int = 0
) -> Path:
    """Intel-style AutoRound INT4 checkpoint; the MTP head lives in model_extra_tensors.

    mtp="indexed" is Intel's original, "unindexed" what the public hybrid builder left
    behind (file present, index entries dropped), "absent" a checkpoint without the file.
    """
    specs = main_specs(s, attn="int4", experts="int4", shared="bf16")
    extra = {"model_extra_tensors.safetensors": mtp_specs(s)} if mtp != "absent" else {}
    return write_checkpoint(
        root, specs, config=model_config(s, autoround_config(s)), shard_bytes=shard_bytes,
        extra_files=extra, index_extra=mtp == "indexed", seed=seed,
    )


def write_fp8(
    root: Path, s: Shape = Shape(), *, routed_experts: bool = True, shard_bytes: int = 1 << 20, seed: int = 1
) -> Path:
    """Qwen-style block-FP8 checkpoint (MTP head in the regular shards, FP8 too).

    routed_experts=False leaves out the routed experts (the bulk of the bytes), for
    benchmarks of tools that never read them.
    """
    specs = main_specs(s, attn="fp8", experts="fp8" if routed_experts else None, shared="fp8")
    specs += mtp_specs(replace(s, num_experts=s.num_experts if routed_experts else 0), "fp8")
    return write_checkpoint(
        root, specs, config=model_config(s, fp8_config()), shard_bytes=shard_bytes, seed=seed
    )


def hf_snapshot(cache: Path, repo_id: str, src: Path, revision: str = "0" * 40) -> Path:
    """Move the files of `src` into a Hugging Face cache layout and return the snapshot.

    Files go to `models--owner--name/blobs/<name-hash>`; the snapshot folder holds relative
    symlinks to them and `refs/main` names the revision, as huggingface_hub lays it out.
    """
    repo = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    blobs, snap = repo / "blobs", repo / "snapshots" / revision
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    for path in sorted(Path(src).iterdir()):
        blob = blobs / f"{zlib.crc32(path.name.encode()):08x}{path.stat().st_size:x}"
        os.replace(path, blob)
        (snap / path.name).symlink_to(os.path.relpath(blob, snap))
    return snap


def read_tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """name -> (dtype code, shape, bytes) of a whole file, parsed by the real library."""
    return {
        name: (t["dtype"], tuple(t["shape"]), bytes(t["data"]))
        for name, t in safetensors.deserialize(Path(path).read_bytes())
    }


def edit_index(root: Path, edit: Callable[[dict], None]) -> None:
    """Apply `edit` to the parsed model.safetensors.index.json of `root` and save it."""
    path = Path(root) / "model.safetensors.index.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc, indent=2))
