"""A bf16 KV-cache decode yardstick for bench_turboquant.py: split-KV Triton attention over a
contiguous bf16 cache, with the same program shape as our TurboQuant decode (one program per
request, KV head and split; the query heads of a GQA group ride along as the rows of one tile;
tq_triton's log-sum-exp merge). torch's SDPA is not a sound yardstick on every machine: on one
H100 it ran a non-flash path at a few percent of the memory bandwidth. This kernel does nothing
but read K and V once, so its time is the bf16 cache's cost at this program shape.

Imported by the benchmark after it has loaded tq_triton (so that triton is already imported with
or without TRITON_INTERPRET, as the run needs).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
import triton
import triton.language as tl


@triton.jit
def _bf16_split_kernel(q_ptr, k_ptr, v_ptr, part_o_ptr, part_lse_ptr, length, num_splits, qk_scale,
                       G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, MIN_CHUNK: tl.constexpr,
                       WIDEN: tl.constexpr):
    """Partial attention of one (split, KV head, request) over k/v [B, Hkv, L, D]; q [B, Hkv, G, D].
    Split ranges follow tq_triton._split_range's rule (written out: a jit helper of another module
    is not visible here). WIDEN=1 computes in float32: Triton's CPU interpreter multiplies bfloat16
    tiles as raw integers; on the GPU bfloat16 goes to the matrix unit as it is."""
    split = tl.program_id(0)
    kv_head = tl.program_id(1)
    req = tl.program_id(2)
    used = tl.minimum(num_splits, tl.cdiv(length, MIN_CHUNK))
    chunk = tl.cdiv(tl.cdiv(length, tl.maximum(used, 1)), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, length)
    if split < used:
        rows = tl.arange(0, GP)
        d = tl.arange(0, D)
        head = req * tl.num_programs(1) + kv_head
        q = tl.load(q_ptr + (head * G + rows)[:, None] * D + d[None, :], mask=(rows < G)[:, None], other=0.0)
        if WIDEN:
            q = q.to(tl.float32)
        m_i = tl.full([GP], float("-inf"), tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        base = head.to(tl.int64) * length * D
        for n0 in range(start, end, BLOCK_N):
            offs = n0 + tl.arange(0, BLOCK_N)
            valid = offs < end
            kv_off = base + offs.to(tl.int64)[:, None] * D + d[None, :]
            k = tl.load(k_ptr + kv_off, mask=valid[:, None], other=0.0)
            if WIDEN:
                k = k.to(tl.float32)
            qk = tl.where(valid[None, :], tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new[:, None])
            v = tl.load(v_ptr + kv_off, mask=valid[:, None], other=0.0)
            if WIDEN:
                v = v.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            m_i = m_new
        part = (head * G + rows) * num_splits + split
        tl.store(part_o_ptr + part[:, None].to(tl.int64) * D + d[None, :], acc / l_i[:, None], mask=(rows < G)[:, None])
        tl.store(part_lse_ptr + part, m_i + tl.log2(l_i), mask=rows < G)


def bf16_decoder(tq: ModuleType, q4: Any, k4: Any, v4: Any, scale: float, interpreted: bool) -> Any:
    """A no-argument callable: decode attention of q4 [B, Hkv, G, D] over k4/v4 [B, Hkv, L, D]
    (bf16, contiguous), output [B, Hkv * G, D]; 4 programs per SM (the split count our faster
    configs use). interpreted: running on Triton's CPU interpreter."""
    batch, hkv, group, d = q4.shape
    length = k4.shape[2]
    cfg = tq.DecodeConfig(64 if d <= 128 else 32, 4, 2, 128, programs_per_sm=4)
    splits = tq.num_splits_for(batch, hkv, length, q4.device, cfg)
    part_o = torch.empty(batch * hkv * group * splits, d, dtype=torch.float32, device=q4.device)
    part_lse = torch.empty(batch * hkv * group * splits, dtype=torch.float32, device=q4.device)
    lens = torch.full((batch,), length, dtype=torch.int32, device=q4.device)
    out = torch.empty(batch, hkv * group, d, dtype=q4.dtype, device=q4.device)

    def run() -> Any:
        _bf16_split_kernel[(splits, hkv, batch)](q4, k4, v4, part_o, part_lse, length, splits, scale * 1.4426950408889634,
                                                 G=group, GP=max(16, triton.next_power_of_2(group)), D=d, BLOCK_N=cfg.block_n,
                                                 MIN_CHUNK=cfg.min_chunk, WIDEN=int(interpreted), num_warps=4, num_stages=3)
        tq.merge_splits(part_o, part_lse, lens, out, splits, cfg)
        return out

    return run
