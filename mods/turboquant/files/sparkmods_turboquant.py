"""TurboQuant KV cache with sparkmods' layout and kernels (sparkmods turboquant mod).

Installed as vllm/v1/attention/backends/sparkmods_turboquant.py by the mod's patch (generated from
mods/turboquant/files/ by mods/turboquant/make_patches.py). vLLM 0.20 added the same
`--kv-cache-dtype turboquant_*` names with its own backend; this module gives 0.18-0.19 those names
with the same meaning, on the packed cache layout and Triton kernels of sparkmods_tq_format /
sparkmods_tq_triton (installed next to vLLM's attention ops). From 0.21 upstream's backend class
stays (its spec, page size and cache shape are the release's own, with the same bytes per token)
and its get_impl_cls / get_builder_cls return ours: upstream's decode kernel reads its
per-token records one at a time, ours reads each KV head's page region in long aligned runs.

What the mod's small hunks in vLLM call here, and why:
- `configure_engine` (engine/arg_utils.py, after CacheConfig is built): adds the boundary layers
  (they keep an unquantised cache) to `kv_cache_dtype_skip_layers`, which vLLM's Attention layer
  already honours, and logs the one start-up line that proves the mod is active.
- `page_bytes_per_token` (model_executor/models/config.py): a hybrid model's attention page must
  match the DeltaNet/Mamba state page, and vLLM sizes it from bytes per token; ours are packed.
- `select_backend` (v1/attention/selector.py): a turboquant dtype always means this backend.
- `kv_cache_spec` (model_executor/layers/attention/attention.py): the page size of a TurboQuant
  layer is block_size * num_kv_heads * slot bytes, not 2 * head_size * dtype size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, List, Optional, Sequence, Set

import torch

from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills
from vllm.v1.attention.ops import sparkmods_tq_format as fmt
from vllm.v1.attention.ops import sparkmods_tq_triton as tqk
from vllm.v1.kv_cache_interface import AttentionSpec, FullAttentionSpec

try:  # vLLM 0.18-0.22 pick a layer's KV cache manager by its spec's exact type (our spec: 0.18-0.19)
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager, spec_manager_map
except ImportError:
    spec_manager_map = None

logger = init_logger(__name__)

BACKEND_NAME = "TURBOQUANT"  # upstream's enum name, so logs and --attention-backend read the same


def _spec(kv_cache_dtype: str) -> "fmt.TQSpec":
    """The spec of a turboquant dtype; a one-line error naming the accepted ones otherwise."""
    try:
        return fmt.tq_spec(kv_cache_dtype)
    except ValueError as exc:
        raise ValueError(f"sparkmods turboquant: {exc} (accepted: {', '.join(fmt.DTYPES)})") from None


# ---- engine configuration (front end) ----


def startup_line(kv_cache_dtype: str, attn_ids: Sequence[int], boundary: Set[int], kv_heads: int,
                 head_size: int) -> str:
    """The serve-log line that proves the mod is active (sparkmods verify looks for it)."""
    spec = _spec(kv_cache_dtype)
    per_layer = kv_heads * fmt.slot_bytes(spec, head_size)
    bf16 = 2 * kv_heads * head_size * 2
    names = ", ".join(str(i) for i in sorted(boundary)) or "none"
    key = "FP8" if spec.key_fp8 else f"{spec.key_bits} bit"
    return (f"[turboquant] KV cache {kv_cache_dtype} on {len(attn_ids) - len(boundary)} of {len(attn_ids)} "
            f"attention layers (boundary: {names}); K {key}, V {spec.value_bits} bit, "
            f"{per_layer} bytes/token/layer ({bf16} in bf16)")


def configure_engine(cache_config, model_config) -> None:
    """Add the boundary layers to kv_cache_dtype_skip_layers and log the start-up line."""
    dtype = cache_config.cache_dtype
    if not fmt.is_turboquant(dtype):
        return
    text_config = model_config.hf_text_config
    num_layers = int(text_config.num_hidden_layers)
    hybrid_ids = fmt.full_attention_layer_ids(text_config) if model_config.is_hybrid else None
    if model_config.is_hybrid and not hybrid_ids:
        raise ValueError(f"sparkmods turboquant: --kv-cache-dtype {dtype} needs the full-attention layers of "
                         f"the hybrid model {model_config.model}, and its config names none")
    boundary = fmt.boundary_layers(num_layers, hybrid_ids)
    existing = set(cache_config.kv_cache_dtype_skip_layers)
    if hybrid_ids and existing:
        raise ValueError(f"sparkmods turboquant: --kv-cache-dtype-skip-layers {' '.join(sorted(existing))} on the "
                         f"hybrid model {model_config.model} is not supported before vLLM 0.20: unquantised pages "
                         "do not unify with the packed ones and the DeltaNet/Mamba state; drop it")
    cache_config.kv_cache_dtype_skip_layers = sorted(existing | {str(i) for i in boundary}, key=_skip_key)
    attn_ids = hybrid_ids if hybrid_ids is not None else list(range(num_layers))
    skipped = boundary | {int(s) for s in existing if s.isdigit()}
    logger.info(startup_line(dtype, attn_ids, skipped & set(attn_ids), model_config.get_total_num_kv_heads(),
                             model_config.get_head_size()))


def _skip_key(entry: str):
    """Layer numbers in numeric order, names such as "sliding_window" after them."""
    return (0, int(entry), "") if entry.isdigit() else (1, 0, entry)


def page_bytes_per_token(kv_cache_dtype: str, num_kv_heads: int, head_size: int) -> int:
    """Bytes one token takes in one TurboQuant layer (K and V of every KV head)."""
    return fmt.page_bytes(_spec(kv_cache_dtype), 1, num_kv_heads, head_size)


# ---- KV cache spec ----


@dataclass(frozen=True, kw_only=True)
class TurboQuantAttentionSpec(FullAttentionSpec):
    """A full-attention spec whose page holds packed TurboQuant slots."""

    slot_bytes: int = 0

    @property
    def real_page_size_bytes(self) -> int:
        return self.block_size * self.num_kv_heads * self.slot_bytes

    @classmethod
    def merge(cls, specs: list) -> "TurboQuantAttentionSpec":
        if any(s.slot_bytes != specs[0].slot_bytes for s in specs):
            raise ValueError("sparkmods turboquant: layers of one KV cache group use different slot sizes")
        return replace(super().merge(specs), slot_bytes=specs[0].slot_bytes)


# The KV cache manager picks its class by the exact spec type: ours is a full-attention cache.
if spec_manager_map is not None:
    spec_manager_map.setdefault(TurboQuantAttentionSpec, FullAttentionManager)


def kv_cache_spec(layer, block_size: int) -> TurboQuantAttentionSpec:
    """The spec of one Attention layer whose kv_cache_dtype is a turboquant dtype."""
    if layer.sliding_window is not None:
        raise ValueError(f"sparkmods turboquant: {layer.layer_name} uses sliding-window attention, which the "
                         "TurboQuant backend does not support: add --kv-cache-dtype-skip-layers sliding_window")
    return TurboQuantAttentionSpec(
        block_size=block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        head_size_v=layer.head_size_v,
        dtype=torch.uint8,
        slot_bytes=fmt.slot_bytes(_spec(layer.kv_cache_dtype), layer.head_size),
    )


# ---- backend selection ----


def select_backend(selector_config) -> type:
    """Our backend for a turboquant dtype, or a one-line error saying what it cannot do."""
    reasons = TurboQuantBackend.validate_configuration(**selector_config._asdict(), device_capability=None)
    if reasons:
        raise ValueError(f"sparkmods turboquant: --kv-cache-dtype {selector_config.kv_cache_dtype} cannot serve "
                         f"this attention layer ({'; '.join(reasons)}); keep it unquantised with "
                         "--kv-cache-dtype-skip-layers")
    # vLLM names the backend it picks in the log; ours is picked by our hook, which says it instead.
    logger.info_once("Using %s attention backend for --kv-cache-dtype %s (sparkmods turboquant)", BACKEND_NAME,
                     selector_config.kv_cache_dtype)
    return TurboQuantBackend


class TurboQuantBackend(AttentionBackend):
    accept_output_buffer: bool = True
    forward_includes_kv_cache_update: bool = True  # forward stores (its keys rotate with the queries)
    supported_dtypes: ClassVar[List[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list] = list(fmt.DTYPES)

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type:
        return TurboQuantImpl

    @staticmethod
    def get_builder_cls() -> type:
        return TurboQuantMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list:  # vLLM 0.31 added the argument
        return [MultipleOf(16)]

    @classmethod
    def supports_block_size(cls, block_size: Optional[int]) -> bool:
        return block_size is None or block_size % 16 == 0

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        try:
            fmt.check_head_size(head_size)
        except ValueError:
            return False
        return True

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        return capability is None or capability.major >= 8  # plain Triton: Ampere, Hopper, GB10

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple:
        if block_size % 16 != 0:
            raise ValueError(f"sparkmods turboquant: block size {block_size} is not a multiple of 16")
        return tuple(fmt.cache_shape(num_blocks, block_size, num_kv_heads, head_size, _spec(cache_dtype_str)))

    @staticmethod
    def use_cascade_attention(*args, **kwargs) -> bool:
        return False


# ---- metadata ----


@dataclass
class TurboQuantMetadata:
    """One step's batch, decodes first (the builder asks vLLM to reorder the batch that way)."""

    num_actual_tokens: int
    num_decodes: int  # requests served by the decode kernel (query length <= decode threshold)
    num_decode_tokens: int
    num_reqs: int
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32, device
    seq_lens: torch.Tensor  # [num_reqs] int32, device
    block_table: torch.Tensor  # [num_reqs, max_blocks] int32, device
    slot_mapping: torch.Tensor  # [num_tokens] int64, device
    # Prefill part (requests num_decodes..num_reqs), set only when there is one.
    prefill_cu_seqlens_k: Optional[torch.Tensor] = None
    prefill_max_query_len: int = 0
    prefill_max_seq_len: int = 0


def warm_up_shape(kv_cache_spec: AttentionSpec, vllm_config: VllmConfig) -> dict:
    """What tq_triton.warm_up compiles for: the layer group's geometry and the server's limits (a
    decode row per query token: with speculative tokens, 1 + k rows per request)."""
    model = vllm_config.model_config
    rows_per_request = 1 + (getattr(vllm_config.speculative_config, "num_speculative_tokens", None) or 0)
    blocks = (kv_cache_spec.block_size, vllm_config.cache_config.block_size or 0)
    return {"spec": _spec(vllm_config.cache_config.cache_dtype), "head_size": kv_cache_spec.head_size,
            "num_q_heads": model.get_num_attention_heads(vllm_config.parallel_config),
            "num_kv_heads": kv_cache_spec.num_kv_heads, "block_size": kv_cache_spec.block_size,
            "table_tokens": tqk.table_capacities(model.max_model_len, blocks),
            "max_batch": vllm_config.scheduler_config.max_num_seqs * rows_per_request, "dtype": model.dtype}


class TurboQuantMetadataBuilder(AttentionMetadataBuilder[TurboQuantMetadata]):
    # Full CUDA graphs for decode batches of one query length (1, or 1 + speculative tokens):
    # the decode path reads only persistent device tensors. Prefill chunks run eagerly.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: List[str], vllm_config: VllmConfig,
                 device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
        if torch.device(device).type == "cuda":  # before the server is healthy (Triton's interpreter compiles nothing)
            tqk.warm_up(**warm_up_shape(kv_cache_spec, vllm_config), device=torch.device(device))

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> TurboQuantMetadata:
        metadata = self.build(0, common_attn_metadata)
        metadata.seq_lens.fill_(1)  # capture with short contexts; replays read the real lengths
        return metadata

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> TurboQuantMetadata:
        common = common_attn_metadata
        num_decodes, num_prefills, num_decode_tokens, _ = split_decodes_and_prefills(
            common, decode_threshold=self.reorder_batch_threshold or 1)
        metadata = TurboQuantMetadata(
            num_actual_tokens=common.num_actual_tokens, num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens, num_reqs=common.num_reqs,
            query_start_loc=common.query_start_loc, seq_lens=common.seq_lens,
            block_table=common.block_table_tensor, slot_mapping=common.slot_mapping)
        if num_prefills:
            seq_lens = common.seq_lens[num_decodes:common.num_reqs]
            cu = torch.zeros(num_prefills + 1, dtype=torch.int32, device=seq_lens.device)
            torch.cumsum(seq_lens, dim=0, out=cu[1:])
            qsl = common.query_start_loc_cpu[num_decodes:common.num_reqs + 1]
            metadata.prefill_cu_seqlens_k = cu
            metadata.prefill_max_query_len = int((qsl[1:] - qsl[:-1]).max())
            metadata.prefill_max_seq_len = common.max_seq_len
        return metadata


# ---- the attention implementation ----


def decode_rows(metadata: TurboQuantMetadata) -> tuple:
    """Per query token of the decode part: its request's block-table row and its causal length.

    One query token per request (no speculative tokens): the metadata's own rows, as views, so a
    decode step launches no kernel for them. Otherwise a request with q query tokens becomes q
    rows; row i sees the context up to and including itself: seq_len - (q - 1 - i). Only device
    ops on persistent tensors, no host syncs, so it is safe inside a captured CUDA graph; padded
    rows get length 1.
    """
    n = metadata.num_decode_tokens
    if n == metadata.num_decodes:
        return metadata.block_table[:n], metadata.seq_lens[:n]
    ends = metadata.query_start_loc[1:metadata.num_decodes + 1]
    token = torch.arange(n, device=ends.device, dtype=ends.dtype)
    req = torch.searchsorted(ends, token, right=True).clamp_(max=max(metadata.num_decodes - 1, 0))
    after = ends.index_select(0, req) - 1 - token  # query tokens of the request after this one
    lens = (metadata.seq_lens.index_select(0, req) - after).clamp_(min=1).to(torch.int32)
    return metadata.block_table.index_select(0, req), lens


def _varlen_attention(q, k, v, cu_q, cu_k, max_q: int, max_k: int, scale: float, out) -> None:
    """Causal attention of packed varlen q over packed k/v (bottom-right aligned), into out."""
    if q.is_cuda:
        from vllm.v1.attention.backends.fa_utils import flash_attn_varlen_func, get_flash_attn_version

        flash_attn_varlen_func(q=q, k=k, v=v, max_seqlen_q=max_q, cu_seqlens_q=cu_q, max_seqlen_k=max_k,
                               cu_seqlens_k=cu_k, softmax_scale=scale, causal=True, out=out,
                               fa_version=get_flash_attn_version() or 2)
        return
    # Host path (CPU test runs only): one request at a time with an explicit mask.
    group = q.shape[1] // k.shape[1]
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for r in range(len(cq) - 1):
        qi, ki, vi = q[cq[r]:cq[r + 1]], k[ck[r]:ck[r + 1]], v[ck[r]:ck[r + 1]]
        nq, nk = qi.shape[0], ki.shape[0]
        mask = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(diagonal=nk - nq)
        ki, vi = ki.repeat_interleave(group, dim=1), vi.repeat_interleave(group, dim=1)
        attn = torch.nn.functional.scaled_dot_product_attention(
            qi.transpose(0, 1).float(), ki.transpose(0, 1).float(), vi.transpose(0, 1).float(),
            attn_mask=mask, scale=scale)
        out[cq[r]:cq[r + 1]] = attn.transpose(0, 1).to(out.dtype)


def pages(kv_cache: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """A layer's cache as (blocks, block_size, kv_heads, slot bytes), over the same bytes.

    Our backend asks for that shape; upstream's (0.21+) gets the release's own: (blocks, kv_heads,
    block_size, slot) from 0.26, ordered in memory by a layout from 0.29. Our kernels address
    each page's bytes themselves, so any order of the inner dimensions will do as long as a page
    is one dense run; a cache that is not is refused, never misread.
    """
    if kv_cache.dim() != 4:
        raise ValueError(f"sparkmods turboquant: a 4-D cache was expected, got shape {tuple(kv_cache.shape)}")
    dense = 1
    for stride, size in sorted(zip(kv_cache.stride()[1:], kv_cache.shape[1:])):
        if size > 1 and stride != dense:
            raise ValueError(f"sparkmods turboquant: the cache's pages are not dense runs of bytes (shape "
                             f"{tuple(kv_cache.shape)}, strides {kv_cache.stride()})")
        dense *= size
    slot = kv_cache.shape[3]
    block_size = dense // (num_kv_heads * slot)
    return kv_cache.as_strided((kv_cache.shape[0], block_size, num_kv_heads, slot),
                               (kv_cache.stride(0), num_kv_heads * slot, slot, 1))


class TurboQuantImpl(AttentionImpl[TurboQuantMetadata]):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: Optional[int] = None,
                 alibi_slopes: Optional[List[float]] = None, sliding_window: Optional[int] = None,
                 kv_cache_dtype: str = "auto", logits_soft_cap: Optional[float] = None,
                 attn_type: str = AttentionType.DECODER, kv_sharing_target_layer_name: Optional[str] = None,
                 **extra) -> None:
        unsupported = [name for name, value in (
            ("ALiBi", alibi_slopes), ("sliding window", sliding_window), ("logits soft-cap", logits_soft_cap),
            ("attention sinks", extra.get("sinks"))) if value]
        if attn_type != AttentionType.DECODER:
            unsupported.append(f"attention type {attn_type}")
        if unsupported:
            raise ValueError(f"sparkmods turboquant: {', '.join(unsupported)} not supported; keep such layers "
                             "unquantised with --kv-cache-dtype-skip-layers")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.spec = _spec(kv_cache_dtype)
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        # the serve log's proof that TurboQuant layers run on our layout and kernels (any release)
        logger.info_once("TurboQuant attention on sparkmods kernels: --kv-cache-dtype %s, head size %d",
                         kv_cache_dtype, head_size)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: Optional[TurboQuantMetadata], output: Optional[torch.Tensor] = None,
                output_scale: Optional[torch.Tensor] = None,
                output_block_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        assert output is not None, "sparkmods turboquant: vLLM passes the output buffer (accept_output_buffer)"
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("sparkmods turboquant: fused output quantisation is not supported")
        if attn_metadata is None:  # memory profiling run
            return output.fill_(0)
        m = attn_metadata
        kv_cache = pages(kv_cache, self.num_kv_heads)
        query = query.view(-1, self.num_heads, self.head_size)
        out = output.view(-1, self.num_heads, self.head_size)
        # this step's keys and values first (a layer sharing another's cache stores none), so the
        # decode rows and the prefill see them
        n = 0 if self.kv_sharing_target_layer_name is not None else m.slot_mapping.shape[0]
        nd = m.num_decode_tokens
        block_table, lens = decode_rows(m)
        tqk.tq_store_decode(query[:nd], key[:n].view(n, self.num_kv_heads, self.head_size),
                            value[:n].view(n, self.num_kv_heads, self.head_size), kv_cache, m.slot_mapping[:n],
                            block_table, lens, self.scale, self.spec, out[:nd])
        if m.prefill_cu_seqlens_k is not None:
            self._prefill(query, kv_cache, m, out)
        return output

    def _prefill(self, query: torch.Tensor, kv_cache: torch.Tensor, m: TurboQuantMetadata,
                 output: torch.Tensor) -> None:
        """Dequantise the prefill requests' whole context, then varlen causal attention over it."""
        start, end = m.num_decode_tokens, m.num_actual_tokens
        qsl = m.query_start_loc[m.num_decodes:m.num_reqs + 1]
        k, v = tqk.tq_dequant_varlen(kv_cache, m.block_table, m.prefill_cu_seqlens_k, self.spec, self.head_size,
                                     query.dtype, first_row=m.num_decodes)
        _varlen_attention(query[start:end], k, v, qsl - qsl[0], m.prefill_cu_seqlens_k, m.prefill_max_query_len,
                          m.prefill_max_seq_len, self.scale, output[start:end])


__all__ = [
    "TurboQuantAttentionSpec", "TurboQuantBackend", "TurboQuantImpl", "TurboQuantMetadata",
    "TurboQuantMetadataBuilder", "configure_engine", "kv_cache_spec",
    "decode_rows", "page_bytes_per_token", "pages", "select_backend", "startup_line", "warm_up_shape",
]
