"""Chunking-invariant paged prefill attention in Triton (batch_invariant mode's prompt attention).

Under a token budget a prompt is cut into chunks that depend on its co-runners, so a prompt token's attention
must not depend on which chunk it came in. Each program takes a tile of BLOCK_M query tokens x the q heads of one
kv head and walks the KV in tiles of TILE_TOKENS positions aligned at position 0, with the online softmax of the
decode kernel. For one query row everything is fixed by its own position: query tiles are aligned at position 0,
so the token sits in the same row of its tile whatever chunk brought it (a dot's row then depends only on that
row's inputs, on tensor cores and in BLAS alike); the KV tiles up to its own are the same tiles in the same order;
later tiles (reached because a later row of its query tile needs them) are wholly masked for it and leave it
exactly as it was (rescale factor exactly 1, zero probabilities). Each tile of K and V is read once per query
tile, not once per token as when prompt tokens go through the decode kernel one row each.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from corun.kernels.decode_attention import precision_for

BLOCK_M = 16
"""Query tokens per program (x the kv head's group of q heads = the rows of one dot)."""
TILE_TOKENS = 64
"""KV positions per inner iteration, aligned at position 0: part of every prompt token's reduction order."""


@triton.jit
def _paged_prefill_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, out_ptr, scale, num_tokens, start_pos,
    stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_ot, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    QUERY_TOKENS: tl.constexpr, TILE: tl.constexpr, PRECISION: tl.constexpr,
):
    query_tile, kv_head = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, QUERY_TOKENS * GROUP_PAD)
    # NOTE: query tiles are aligned at absolute position 0, so a token always sits in the same row of its tile,
    # whichever chunk brought it; rows of the tile outside this chunk are masked.
    tile_start = (start_pos // QUERY_TOKENS + query_tile) * QUERY_TOKENS
    tokens = tile_start - start_pos + rows // GROUP_PAD
    heads = kv_head * GROUP + rows % GROUP_PAD
    row_valid = (tokens >= 0) & (tokens < num_tokens) & (rows % GROUP_PAD < GROUP)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + tokens[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                mask=row_valid[:, None], other=0.0)  # [rows, HEAD_DIM]
    query_positions = start_pos + tokens
    last_position = tl.minimum(tile_start + QUERY_TOKENS, start_pos + num_tokens) - 1
    m = tl.full([QUERY_TOKENS * GROUP_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([QUERY_TOKENS * GROUP_PAD], tl.float32)
    acc = tl.zeros([QUERY_TOKENS * GROUP_PAD, HEAD_DIM], tl.float32)
    for tile in range(0, last_position // TILE + 1):
        positions = tile * TILE + tl.arange(0, TILE)
        kv_valid = positions <= last_position
        blocks = tl.load(table_ptr + positions // BLOCK_SIZE, mask=kv_valid, other=0)
        offsets = blocks.to(tl.int64) * stride_kb + (positions % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
        k = tl.load(k_ptr + offsets[:, None] + dims[None, :], mask=kv_valid[:, None], other=0.0)  # [TILE, D]
        v = tl.load(v_ptr + offsets[:, None] + dims[None, :], mask=kv_valid[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [rows, TILE] fp32
        scores = tl.where(positions[None, :] <= query_positions[:, None], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        # NOTE: a tile wholly masked for a row must leave it bit for bit: rescale by exactly 1, not exp(0)
        alpha = tl.where(m_new == m, 1.0, tl.exp(m - m_new))
        p = tl.exp(scores - m_new[:, None])
        denom = denom * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    out = acc / denom[:, None]  # NOTE: every valid row sees position 0, so denom > 0
    tl.store(out_ptr + tokens[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                            start_pos: int, scale: float) -> torch.Tensor:
    """q: [tokens, heads, head_dim], the prompt tokens at positions start_pos, start_pos + 1, ... whose K and V
    are already in the cache; k_cache, v_cache: [num_blocks, block_size, kv_heads, head_dim] (strided views
    allowed, last dim contiguous); block_table: [blocks] of the request. -> [tokens, heads, head_dim]."""
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    q = q.contiguous()
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    num_query_tiles = (start_pos + num_tokens - 1) // BLOCK_M - start_pos // BLOCK_M + 1
    _paged_prefill_kernel[(num_query_tiles, num_kv_heads)](
        q, k_cache, v_cache, block_table, out, scale, num_tokens, start_pos,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), out.stride(0),
        out.stride(1), GROUP=group, GROUP_PAD=triton.next_power_of_2(group), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, QUERY_TOKENS=BLOCK_M, TILE=TILE_TOKENS, PRECISION=precision_for(q.dtype))
    return out
