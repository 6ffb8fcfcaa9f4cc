"""Paged decode attention in Triton: one query token per row, each row reading only its own KV blocks.

One program per (row, kv head, split). With num_splits = 1 (fixed_shape, batch_invariant mode) a program reduces over
its request's whole context in one fixed order: the result depends only on the request. With num_splits > 1
(mixed mode, like FlashAttention's split-KV for small batches) the context is cut into num_splits ranges whose
partial results are merged afterwards; num_splits is chosen from the batch shape, so a request's bits depend on
its co-runners. Graph-capturable: no host sync, the grid depends only on the shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class LaunchConfig:
    """Fixed launch parameters. tile_tokens sets the order of the online-softmax reduction, so it is part of a
    request's bits and must never be autotuned per shape or per machine."""

    tile_tokens: int = 64
    """Tokens per inner iteration (several KV blocks gathered through the block table)."""
    num_warps: int = 4
    num_stages: int = 3


DEFAULT_LAUNCH = LaunchConfig()


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, out_ptr, lse_ptr, scale,
    stride_qr, stride_qh, stride_kb, stride_kt, stride_kh, stride_tr,
    stride_or, stride_oh, stride_os, stride_lr, stride_lh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_TOKENS: tl.constexpr, NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr,
):
    row, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    context_len = tl.load(lens_ptr + row)
    num_tiles = tl.cdiv(context_len, TILE_TOKENS)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tile_start = split * tiles_per_split
    tile_end = tl.minimum(num_tiles, tile_start + tiles_per_split)

    group = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + group
    head_mask = group < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + row * stride_qr + heads[:, None] * stride_qh + dims[None, :], mask=head_mask[:, None],
                other=0.0)  # [GROUP_PAD, HEAD_DIM]
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for tile in range(tile_start, tile_end):
        positions = tile * TILE_TOKENS + tl.arange(0, TILE_TOKENS)
        valid = positions < context_len
        blocks = tl.load(tables_ptr + row * stride_tr + positions // BLOCK_SIZE, mask=valid, other=0)
        offsets = blocks.to(tl.int64) * stride_kb + (positions % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
        k = tl.load(k_ptr + offsets[:, None] + dims[None, :], mask=valid[:, None], other=0.0)  # [TILE, HEAD_DIM]
        v = tl.load(v_ptr + offsets[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [GROUP_PAD, TILE] fp32
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        denom = denom * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    out_offsets = row * stride_or + heads[:, None] * stride_oh + split * stride_os + dims[None, :]
    safe_denom = tl.where(denom > 0, denom, 1.0)
    tl.store(out_ptr + out_offsets, (acc / safe_denom[:, None]).to(out_ptr.dtype.element_ty), mask=head_mask[:, None])
    if NUM_SPLITS > 1:
        lse = tl.where(denom > 0, m + tl.log(safe_denom), float("-inf"))
        tl.store(lse_ptr + row * stride_lr + heads * stride_lh + split, lse, mask=head_mask)


def paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale: float, num_splits: int = 1,
                           launch: LaunchConfig = DEFAULT_LAUNCH):
    """q: [rows, heads, head_dim]; k_cache, v_cache: [num_blocks, block_size, kv_heads, head_dim] (strided views
    allowed, last dim contiguous); block_tables: [rows, max_blocks] int; context_lens: [rows] int (>= 1)."""
    num_rows, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    if num_splits == 1:
        out, partial, lse = torch.empty_like(q), None, q  # NOTE: lse unused without splits
        out_strides = (out.stride(0), out.stride(1), 0)
    else:
        partial = torch.empty(num_rows, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(num_rows, num_heads, num_splits, dtype=torch.float32, device=q.device)
        out_strides = (partial.stride(0), partial.stride(1), partial.stride(2))
    target = out if partial is None else partial
    _paged_decode_kernel[(num_rows, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, target, lse, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        *out_strides, lse.stride(0), lse.stride(1),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        TILE_TOKENS=launch.tile_tokens, NUM_SPLITS=num_splits, PRECISION=precision_for(q.dtype),
        num_warps=launch.num_warps, num_stages=launch.num_stages)
    if partial is None:
        return out
    weights = torch.softmax(lse, dim=-1)  # [rows, heads, splits]; empty splits have lse -inf -> weight 0
    return (partial * weights[..., None]).sum(dim=2).to(q.dtype)


def precision_for(dtype: torch.dtype) -> str:
    # NOTE: float32 models (the CPU-parity tests) keep full precision; tf32 would drift from the reference.
    return "ieee" if dtype == torch.float32 else "tf32"


def split_kv_heuristic(num_rows: int, num_kv_heads: int, num_sms: int, max_splits: int = 16) -> int:
    """Mixed mode: split the context when rows x kv heads cannot fill the GPU (FlashAttention's idea), so the
    split count, and with it a request's reduction order, follows the batch size."""
    programs = num_rows * num_kv_heads
    return 1 if programs == 0 or programs >= num_sms else max(1, min(max_splits, -(-2 * num_sms // programs)))
