"""Chunking- and packing-invariant paged prefill attention in Triton.

Used for prompt rows by batch_invariant mode (whose token budget cuts prompts at co-runner-dependent places) and
by fixed_shape's bucketed and packed prefill on CUDA (whose shapes must be captured in CUDA graphs: every launch fact
is a device tensor, the grid is a function of the forward's fixed shape).

Each program takes one query tile of one sequence (QUERY_TOKENS consecutive positions x the q heads of one kv
head) and walks the sequence's KV in tiles of TILE_TOKENS positions aligned at position 0, with the online
softmax of the decode kernel (in log2 units). For one query row everything is fixed by its own position: query
tiles are aligned at the sequence's position 0, so the token sits in the same row of its tile whatever chunk brought
it and wherever that chunk sits in the packed forward (a dot's row then depends only on that row's inputs, on tensor
cores and in BLAS alike); the KV tiles up to its own are the same tiles in the same order, those wholly below its
query tile unmasked and the rest masked whatever the chunk; later tiles (reached because a later row of its query
tile needs them) are wholly masked for it and leave it exactly as it was (rescale factor exactly 1, zero
probabilities). Each tile of K and V is read once per query tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from corun.kernels.decode_attention import precision_for
from corun.packed_prefill import PREFILL_QUERY_TILE, PackedPrefillMeta, packed_prefill_tiles

TILE_TOKENS = 64
"""KV positions per inner iteration, aligned at position 0: part of every prompt token's reduction order."""


LAUNCH = {"num_warps": 8, "num_stages": 3}
"""Fixed, like every launch fact here. Measured on the H200 (8B shape, benchmarks/prefill_kernel_sweep.py,
benchmarks/results/h200_prefill_kernel_sweep.json): with 64-position query tiles, the tiles below the diagonal
unmasked and exp2, one 4096-token prompt's layer takes 0.43 ms (321 TFLOP/s) against 0.72 ms before and
FlashAttention-2's 0.58 ms; packs of 8 x 1024 and 32 x 256 tokens 0.26 and 0.13 ms against 0.39 and 0.16."""


@triton.jit
def _attend_tile(q, m, denom, acc, k_ptr, v_ptr, table_ptr, tile, last_position, query_positions, qk_scale, kv_head,
                 stride_kb, stride_kt, stride_kh, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                 TILE: tl.constexpr, PRECISION: tl.constexpr, MASKED: tl.constexpr):
    """One KV tile into a query tile's online softmax (scores in log2 units: exp2, the scale folded in)."""
    dims = tl.arange(0, HEAD_DIM)
    positions = tile * TILE + tl.arange(0, TILE)
    if MASKED:
        kv_valid = positions <= last_position
        blocks = tl.load(table_ptr + positions // BLOCK_SIZE, mask=kv_valid, other=0)
    else:
        blocks = tl.load(table_ptr + positions // BLOCK_SIZE)
    offsets = blocks.to(tl.int64) * stride_kb + (positions % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
    if MASKED:
        k = tl.load(k_ptr + offsets[:, None] + dims[None, :], mask=kv_valid[:, None], other=0.0)  # [TILE, D]
        v = tl.load(v_ptr + offsets[:, None] + dims[None, :], mask=kv_valid[:, None], other=0.0)
    else:
        k = tl.load(k_ptr + offsets[:, None] + dims[None, :])
        v = tl.load(v_ptr + offsets[:, None] + dims[None, :])
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [rows, TILE] fp32
    if MASKED:
        scores = tl.where(positions[None, :] <= query_positions[:, None], scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, 1))
    # NOTE: a tile wholly masked for a row must leave it bit for bit: rescale by exactly 1, not exp2(0)
    alpha = tl.where(m_new == m, 1.0, tl.exp2(m - m_new))
    p = tl.exp2(scores - m_new[:, None])
    denom = denom * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, denom, acc


@triton.jit
def _packed_prefill_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, tile_seqs_ptr, tile_starts_ptr, query_starts_ptr, start_positions_ptr,
    num_tokens_ptr, scale, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_ot, stride_oh, stride_table,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, QUERY_TOKENS: tl.constexpr, TILE: tl.constexpr, PRECISION: tl.constexpr,
):
    # NOTE: one grid axis, the kv heads innermost: every head of a tile launches together, in the tiles' order
    # (the most keys first: corun/packed_prefill.packed_prefill_tiles)
    program, kv_head = tl.program_id(0) // NUM_KV_HEADS, tl.program_id(0) % NUM_KV_HEADS
    seq = tl.load(tile_seqs_ptr + program)
    if seq >= 0:  # NOTE: the grid is sized for the fullest pack; programs without a tile do nothing
        tile_start = tl.load(tile_starts_ptr + program)  # absolute position, a multiple of QUERY_TOKENS
        query_start = tl.load(query_starts_ptr + seq)
        start_pos = tl.load(start_positions_ptr + seq)
        num_tokens = tl.load(num_tokens_ptr + seq)
        table_ptr = tables_ptr + seq.to(tl.int64) * stride_table
        rows = tl.arange(0, QUERY_TOKENS * GROUP_PAD)
        tokens = tile_start - start_pos + rows // GROUP_PAD  # index in this step's chunk of the sequence
        heads = kv_head * GROUP + rows % GROUP_PAD
        row_valid = (tokens >= 0) & (tokens < num_tokens) & (rows % GROUP_PAD < GROUP)
        step_rows = (query_start + tokens).to(tl.int64)
        dims = tl.arange(0, HEAD_DIM)
        q = tl.load(q_ptr + step_rows[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                    mask=row_valid[:, None], other=0.0)  # [rows, HEAD_DIM]
        query_positions = start_pos + tokens
        last_position = tl.minimum(tile_start + QUERY_TOKENS, start_pos + num_tokens) - 1
        qk_scale = scale * 1.4426950408889634  # NOTE: log2(e): exp2 in the loop
        m = tl.full([QUERY_TOKENS * GROUP_PAD], float("-inf"), tl.float32)
        denom = tl.zeros([QUERY_TOKENS * GROUP_PAD], tl.float32)
        acc = tl.zeros([QUERY_TOKENS * GROUP_PAD, HEAD_DIM], tl.float32)
        # NOTE: tiles below the query tile are visible to every row of it whatever chunk brought the row: no mask
        # (a mask there selects every score, so the split leaves each row's bits a function of its position)
        unmasked_tiles = tile_start // TILE
        for tile in range(0, unmasked_tiles):
            m, denom, acc = _attend_tile(q, m, denom, acc, k_ptr, v_ptr, table_ptr, tile, last_position,
                                         query_positions, qk_scale, kv_head, stride_kb, stride_kt, stride_kh,
                                         HEAD_DIM, BLOCK_SIZE, TILE, PRECISION, False)
        for tile in range(unmasked_tiles, last_position // TILE + 1):
            m, denom, acc = _attend_tile(q, m, denom, acc, k_ptr, v_ptr, table_ptr, tile, last_position,
                                         query_positions, qk_scale, kv_head, stride_kb, stride_kt, stride_kh,
                                         HEAD_DIM, BLOCK_SIZE, TILE, PRECISION, True)
        out = acc / denom[:, None]  # NOTE: every valid row sees position 0, so denom > 0
        tl.store(out_ptr + step_rows[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


def packed_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PackedPrefillMeta,
                             scale: float, out: torch.Tensor) -> None:
    """Writes into out [step_tokens, heads, head_dim] the attention of every packed sequence's query rows;
    q: [step_tokens, heads, head_dim] (K and V of this step already in the cache); k_cache, v_cache:
    [num_blocks, block_size, kv_heads, head_dim] (strided views allowed, last dim contiguous)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    assert q.stride(2) == 1 and out.stride(2) == 1, "head_dim must be contiguous"
    _packed_prefill_kernel[(meta.tile_seqs.shape[0] * num_kv_heads,)](
        q, k_cache, v_cache, out, meta.block_tables, meta.tile_seqs, meta.tile_starts, meta.query_starts,
        meta.start_positions, meta.num_tokens, scale, q.stride(0), q.stride(1), k_cache.stride(0),
        k_cache.stride(1), k_cache.stride(2), out.stride(0), out.stride(1), meta.block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads, GROUP=group, GROUP_PAD=triton.next_power_of_2(group), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, QUERY_TOKENS=PREFILL_QUERY_TILE, TILE=TILE_TOKENS, PRECISION=precision_for(q.dtype),
        **LAUNCH)


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                            start_pos: int, scale: float) -> torch.Tensor:
    """One sequence: q [tokens, heads, head_dim] at positions start_pos, start_pos + 1, ... whose K and V are in
    the cache; block_table: [blocks] of the request. -> [tokens, heads, head_dim]."""
    out = torch.empty_like(q)
    if q.shape[0] == 0:
        return out
    tile_seqs, tile_starts = packed_prefill_tiles([start_pos], [q.shape[0]], 0)
    device = q.device

    def ints(values):
        return torch.tensor(values, dtype=torch.int32, device=device)

    meta = PackedPrefillMeta(ints([0]), ints([start_pos]), ints([q.shape[0]]), block_table.reshape(1, -1),
                             ints(tile_seqs), ints(tile_starts))
    packed_prefill_attention(q.contiguous(), k_cache, v_cache, meta, scale, out)
    return out
