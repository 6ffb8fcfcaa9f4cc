"""Paged decode attention in Triton: one query token per row, each row reading only its own KV blocks.

Three ways to cut a context (graph-capturable: no host sync, grids depend only on shapes):
- one range (num_splits = 1; batch_invariant mode, fixed_shape with decode_kv_split_tokens 0): one program per
  (row, kv head) reduces over its request's whole context in one fixed order;
- ranges of split_tokens tokens (fixed_shape): as many as the request's context needs, so where the cuts fall, and
  with them the bits, depend on the request alone. Either a pool of programs per kv head takes the step's
  (row, range) items in turn and _merge_ranges_kernel merges each row's ranges in range order, or one program per
  (row, kv head) walks its row's ranges merging as it goes (which program computes a range, and where the merge
  runs, does not change its bits). In a step of few rows with long contexts the pool keeps the SMs busy where one
  program per row leaves most of them idle;
- num_splits > 1 equal ranges (mixed mode, like FlashAttention's split-KV for small batches): num_splits is chosen
  from the batch shape, so a request's bits depend on its co-runners.

Every grid puts the kv head first: the GPU hands consecutive program ids to different SMs, so the programs of a
step's real rows (the first rows) spread over the SMs. With the row first, the programs of a few long rows of a
128-row step land n * rows apart and share SMs (h200_decode_attention_padding.json: 8 rows of 1.2k tokens, 37 us per
layer alone, 52 us as the first 8 of 128 rows).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from wire.config import DECODE_TILE_TOKENS


@dataclass(frozen=True)
class LaunchConfig:
    """Fixed launch parameters. tile_tokens sets the order of the online-softmax reduction, so it is part of a
    request's bits and must never be autotuned per shape or per machine."""

    tile_tokens: int = DECODE_TILE_TOKENS
    """Tokens per inner iteration (several KV blocks gathered through the block table)."""
    num_warps: int = 4
    num_stages: int = 2  # NOTE: with 128-token tiles, 2 stages beat 3 on every step measured (the same file)


DEFAULT_LAUNCH = LaunchConfig()
PIPELINED_SHARED_MEMORY = 160 * 1024
"""Shared memory per block that two stages of 128-token K and V tiles need with room to spare (8B shape: 64 KiB a
stage): A100, H100, H200 have it; Ada and consumer GPUs (~100 KiB) run one stage."""


@functools.cache
def launch_for(device: torch.device) -> LaunchConfig:
    """The launch on this device. Only num_stages varies: software pipelining reorders loads, never arithmetic, so
    a row's bits are the same at any stage count (h200_decode_attention_variants.json: 1, 2, 3 and 4 stages
    bitwise equal); 8 warps would change them, so warps stay fixed."""
    if device.type != "cuda":
        return DEFAULT_LAUNCH
    shared = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 0)
    return DEFAULT_LAUNCH if shared >= PIPELINED_SHARED_MEMORY else dataclasses.replace(DEFAULT_LAUNCH, num_stages=1)


@triton.jit
def _attend_tiles(q, k_ptr, v_ptr, tables_ptr, row, kv_head, context_len, tile_start, tile_end, scale,
                  stride_kb, stride_kt, stride_kh, stride_tr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr, TILE_TOKENS: tl.constexpr, PRECISION: tl.constexpr):
    """Online softmax of one row's query heads over tiles [tile_start, tile_end) of its context, in tile order:
    -> (running max, denominator, unnormalized output)."""
    dims = tl.arange(0, HEAD_DIM)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for tile in range(tile_start, tile_end):
        k, v, valid = _load_tile(k_ptr, v_ptr, tables_ptr, row, kv_head, tile * TILE_TOKENS + tl.arange(0, TILE_TOKENS),
                                 context_len, dims, stride_kb, stride_kt, stride_kh, stride_tr, BLOCK_SIZE)
        m, denom, acc = _reduce_tile(q, k, v, valid, m, denom, acc, scale, PRECISION)
    return m, denom, acc


@triton.jit
def _load_tile(k_ptr, v_ptr, tables_ptr, row, kv_head, positions, context_len, dims, stride_kb, stride_kt, stride_kh,
               stride_tr, BLOCK_SIZE: tl.constexpr):
    """K and V of a row's positions (gathered through its block table; masked past its context): [TILE, HEAD_DIM]
    each, and the mask."""
    valid = positions < context_len
    blocks = tl.load(tables_ptr + row * stride_tr + positions // BLOCK_SIZE, mask=valid, other=0)
    offsets = blocks.to(tl.int64) * stride_kb + (positions % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
    k = tl.load(k_ptr + offsets[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
    v = tl.load(v_ptr + offsets[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
    return k, v, valid


@triton.jit
def _reduce_tile(q, k, v, valid, m, denom, acc, scale, PRECISION: tl.constexpr):
    """One tile folded into the online softmax (running max, denominator, unnormalized output): the arithmetic every
    decode kernel shares, so that a layout changes which program runs it, never what it computes."""
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [GROUP_PAD, TILE] fp32
    scores = tl.where(valid[None, :], scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, 1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(scores - m_new[:, None])
    return (m_new, denom * alpha + tl.sum(p, 1),
            acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION))


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, out_ptr, lse_ptr, scale,
    stride_qr, stride_qh, stride_kb, stride_kt, stride_kh, stride_tr,
    stride_or, stride_oh, stride_os, stride_lr, stride_lh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_TOKENS: tl.constexpr, NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr,
):
    kv_head, row, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
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
    m, denom, acc = _attend_tiles(q, k_ptr, v_ptr, tables_ptr, row, kv_head, context_len, tile_start, tile_end, scale,
                                  stride_kb, stride_kt, stride_kh, stride_tr, GROUP_PAD, HEAD_DIM, BLOCK_SIZE,
                                  TILE_TOKENS, PRECISION)
    out_offsets = row * stride_or + heads[:, None] * stride_oh + split * stride_os + dims[None, :]
    safe_denom = tl.where(denom > 0, denom, 1.0)
    tl.store(out_ptr + out_offsets, (acc / safe_denom[:, None]).to(out_ptr.dtype.element_ty), mask=head_mask[:, None])
    if NUM_SPLITS > 1:
        lse = tl.where(denom > 0, m + tl.log(safe_denom), float("-inf"))
        tl.store(lse_ptr + row * stride_lr + heads * stride_lh + split, lse, mask=head_mask)


@triton.jit
def _ranged_decode_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, item_rows_ptr, item_ranges_ptr, num_items_ptr, partial_ptr, lse_ptr,
    scale,
    stride_qr, stride_qh, stride_kb, stride_kt, stride_kh, stride_tr,
    stride_pr, stride_ph, stride_ps, stride_lr, stride_lh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_TOKENS: tl.constexpr, SPLIT_TILES: tl.constexpr, NUM_PROGRAMS: tl.constexpr, PRECISION: tl.constexpr,
):
    """Program p of kv head h computes items p, p + NUM_PROGRAMS, ... of the step's (row, range) list
    (RangeItems), each leaving its normalized partial and log-sum-exp (_attend_range)."""
    kv_head, program = tl.program_id(0), tl.program_id(1)
    group = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + group
    head_mask = group < GROUP
    dims = tl.arange(0, HEAD_DIM)
    for item in range(program, tl.load(num_items_ptr), NUM_PROGRAMS):
        row = tl.load(item_rows_ptr + item)
        q = tl.load(q_ptr + row * stride_qr + heads[:, None] * stride_qh + dims[None, :], mask=head_mask[:, None],
                    other=0.0)
        _attend_range(q, k_ptr, v_ptr, tables_ptr, partial_ptr, lse_ptr, row, kv_head, tl.load(item_ranges_ptr + item),
                      tl.load(lens_ptr + row), heads, head_mask, dims, scale, stride_kb, stride_kt, stride_kh,
                      stride_tr, stride_pr, stride_ph, stride_ps, stride_lr, stride_lh, GROUP_PAD, HEAD_DIM,
                      BLOCK_SIZE, TILE_TOKENS, SPLIT_TILES, PRECISION)


@triton.jit
def _row_ranges_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, ranges_ptr, out_ptr, scale,
    stride_qr, stride_qh, stride_kb, stride_kt, stride_kh, stride_tr, stride_or, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_TOKENS: tl.constexpr, SPLIT_TILES: tl.constexpr, PRECISION: tl.constexpr,
):
    """The same ranges as _ranged_decode_kernel, one program per (row, kv head) walking its row's ranges in order
    and merging each as it ends (_range_result, _merge_range: the merge kernel's arithmetic), so a step whose rows
    alone fill the GPU writes no partials: the layout of full steps."""
    kv_head, row = tl.program_id(0), tl.program_id(1)
    group = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + group
    head_mask = group < GROUP
    dims = tl.arange(0, HEAD_DIM)
    context_len = tl.load(lens_ptr + row)
    num_tiles = tl.cdiv(context_len, TILE_TOKENS)
    q = tl.load(q_ptr + row * stride_qr + heads[:, None] * stride_qh + dims[None, :], mask=head_mask[:, None],
                other=0.0)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for split in range(0, tl.load(ranges_ptr + row)):
        tile_start = split * SPLIT_TILES
        range_m, range_denom, range_acc = _attend_tiles(
            q, k_ptr, v_ptr, tables_ptr, row, kv_head, context_len, tile_start,
            tl.minimum(num_tiles, tile_start + SPLIT_TILES), scale, stride_kb, stride_kt, stride_kh, stride_tr,
            GROUP_PAD, HEAD_DIM, BLOCK_SIZE, TILE_TOKENS, PRECISION)
        part, lse = _range_result(range_m, range_denom, range_acc)
        m, denom, acc = _merge_range(m, denom, acc, part, lse)
    tl.store(out_ptr + row * stride_or + heads[:, None] * stride_oh + dims[None, :],
             (acc / denom[:, None]).to(out_ptr.dtype.element_ty), mask=head_mask[:, None])


@triton.jit
def _range_result(m, denom, acc):
    """A range's online-softmax state -> its normalized partial and log-sum-exp (-inf where it saw no token)."""
    safe_denom = tl.where(denom > 0, denom, 1.0)
    return acc / safe_denom[:, None], tl.where(denom > 0, m + tl.log(safe_denom), float("-inf"))


@triton.jit
def _merge_range(m, denom, acc, part, lse):
    """One range folded into a row's running merge (online softmax over the ranges' log-sum-exps). Both layouts
    merge through this, so their bits agree."""
    m_new = tl.maximum(m, lse)
    alpha = tl.exp(m - m_new)
    weight = tl.exp(lse - m_new)
    return m_new, denom * alpha + weight, acc * alpha[:, None] + weight[:, None] * part


@triton.jit
def _attend_range(q, k_ptr, v_ptr, tables_ptr, partial_ptr, lse_ptr, row, kv_head, split, context_len, heads,
                  head_mask, dims, scale, stride_kb, stride_kt, stride_kh, stride_tr, stride_pr, stride_ph, stride_ps,
                  stride_lr, stride_lh, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                  TILE_TOKENS: tl.constexpr, SPLIT_TILES: tl.constexpr, PRECISION: tl.constexpr):
    """Range `split` of a row in the pool: its normalized partial and log-sum-exp, for _merge_ranges_kernel."""
    tile_start = split * SPLIT_TILES
    tile_end = tl.minimum(tl.cdiv(context_len, TILE_TOKENS), tile_start + SPLIT_TILES)
    m, denom, acc = _attend_tiles(q, k_ptr, v_ptr, tables_ptr, row, kv_head, context_len, tile_start, tile_end, scale,
                                  stride_kb, stride_kt, stride_kh, stride_tr, GROUP_PAD, HEAD_DIM, BLOCK_SIZE,
                                  TILE_TOKENS, PRECISION)
    part, lse = _range_result(m, denom, acc)
    tl.store(partial_ptr + row * stride_pr + heads[:, None] * stride_ph + split * stride_ps + dims[None, :], part,
             mask=head_mask[:, None])
    tl.store(lse_ptr + row * stride_lr + heads * stride_lh + split, lse, mask=head_mask)


@triton.jit
def _list_items_kernel(ranges_ptr, ends_ptr, item_rows_ptr, item_ranges_ptr, MAX_RANGES: tl.constexpr):
    """One program per row: its items' (row, range index) at [end - ranges, end) of the item list."""
    row = tl.program_id(0)
    count = tl.load(ranges_ptr + row)
    start = tl.load(ends_ptr + row) - count
    index = tl.arange(0, MAX_RANGES)
    tl.store(item_rows_ptr + start + index, row + 0 * index, mask=index < count)
    tl.store(item_ranges_ptr + start + index, index, mask=index < count)


@triton.jit
def _merge_ranges_kernel(partial_ptr, lse_ptr, ranges_ptr, out_ptr,
                         stride_pr, stride_ph, stride_ps, stride_lr, stride_lh, stride_or, stride_oh,
                         GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One program per (row, kv head): a row's ranges merged one after another in range order, so the order is the
    request's alone. A row of one range comes out as its range left it (weight 1, denominator 1)."""
    kv_head, row = tl.program_id(0), tl.program_id(1)
    num_ranges = tl.load(ranges_ptr + row)
    group = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + group
    head_mask = group < GROUP
    dims = tl.arange(0, HEAD_DIM)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for split in range(0, num_ranges):
        lse = tl.load(lse_ptr + row * stride_lr + heads * stride_lh + split, mask=head_mask, other=0.0)
        part = tl.load(partial_ptr + row * stride_pr + heads[:, None] * stride_ph + split * stride_ps + dims[None, :],
                       mask=head_mask[:, None], other=0.0)
        m, denom, acc = _merge_range(m, denom, acc, part, lse)
    tl.store(out_ptr + row * stride_or + heads[:, None] * stride_oh + dims[None, :],
             (acc / denom[:, None]).to(out_ptr.dtype.element_ty), mask=head_mask[:, None])


def paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale: float, num_splits: int = 1,
                           launch: LaunchConfig | None = None):
    """q: [rows, heads, head_dim]; k_cache, v_cache: [num_blocks, block_size, kv_heads, head_dim] (strided views
    allowed, last dim contiguous); block_tables: [rows, max_blocks] int; context_lens: [rows] int (>= 1)."""
    num_rows, num_heads, head_dim = q.shape
    launch = launch or launch_for(q.device)
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
    _paged_decode_kernel[(num_kv_heads, num_rows, num_splits)](  # NOTE: grid order, see module docstring
        q, k_cache, v_cache, block_tables, context_lens, target, lse, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        *out_strides, lse.stride(0), lse.stride(1),
        GROUP=group, GROUP_PAD=group_pad(group), HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        TILE_TOKENS=launch.tile_tokens, NUM_SPLITS=num_splits, PRECISION=precision_for(q.dtype),
        num_warps=launch.num_warps, num_stages=launch.num_stages)
    if partial is None:
        return out
    weights = torch.softmax(lse, dim=-1)  # [rows, heads, splits]; empty splits have lse -inf -> weight 0
    return (partial * weights[..., None]).sum(dim=2).to(q.dtype)


@dataclass
class RangeItems:
    """A step's (row, range) list for ranged_decode_attention, made once per step on the device (every layer
    shares it): ranges per row (at least one), and for each item its row and range index, rows in order."""

    ranges: torch.Tensor  # [rows] int64
    item_rows: torch.Tensor  # [rows * max_ranges] int64, the first num_items used
    item_ranges: torch.Tensor  # [rows * max_ranges] int64
    num_items: torch.Tensor  # [1] int64
    max_ranges: int


def range_items(context_lens: torch.Tensor, max_context: int, split_tokens: int,
                tile_tokens: int = DECODE_TILE_TOKENS) -> RangeItems:
    split_tiles = split_tokens // tile_tokens
    assert split_tiles * tile_tokens == split_tokens, "split_tokens must be a multiple of the tile"
    tiles = (context_lens + tile_tokens - 1) // tile_tokens
    ranges = ((tiles + split_tiles - 1) // split_tiles).clamp_(min=1)
    ends = torch.cumsum(ranges, 0)
    max_ranges = max(1, -(-max_context // split_tokens))
    num_rows = len(context_lens)
    items = RangeItems(ranges, torch.empty(num_rows * max_ranges, dtype=torch.int64, device=ranges.device),
                       torch.empty(num_rows * max_ranges, dtype=torch.int64, device=ranges.device), ends[-1:],
                       max_ranges)
    _list_items_kernel[(num_rows,)](ranges, ends, items.item_rows, items.item_ranges,
                                    MAX_RANGES=triton.next_power_of_2(max_ranges))
    return items


def ranged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, items: RangeItems, scale: float,
                            split_tokens: int, num_programs: int, launch: LaunchConfig | None = None):
    """The fixed-size-range cut (module docstring); items = range_items(context_lens, ...) with the same
    split_tokens. num_programs per kv head changes speed, never bits; 0: one program per (row, kv head) walks the
    row's ranges (_row_ranges_kernel)."""
    num_rows, num_heads, head_dim = q.shape
    launch = launch or launch_for(q.device)
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    common = dict(GROUP=group, GROUP_PAD=group_pad(group), HEAD_DIM=head_dim)
    tiling = dict(BLOCK_SIZE=block_size, TILE_TOKENS=launch.tile_tokens, SPLIT_TILES=split_tokens // launch.tile_tokens,
                  PRECISION=precision_for(q.dtype), num_warps=launch.num_warps, num_stages=launch.num_stages)
    kv_strides = (q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                  block_tables.stride(0))
    if not num_programs:
        _row_ranges_kernel[(num_kv_heads, num_rows)](
            q, k_cache, v_cache, block_tables, context_lens, items.ranges, out, scale, *kv_strides, out.stride(0),
            out.stride(1), **common, **tiling)
        return out
    partial = torch.empty(num_rows, num_heads, items.max_ranges, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(num_rows, num_heads, items.max_ranges, dtype=torch.float32, device=q.device)
    partial_strides = (partial.stride(0), partial.stride(1), partial.stride(2), lse.stride(0), lse.stride(1))
    _ranged_decode_kernel[(num_kv_heads, num_programs)](
        q, k_cache, v_cache, block_tables, context_lens, items.item_rows, items.item_ranges, items.num_items,
        partial, lse, scale, *kv_strides, *partial_strides, **common, **tiling, NUM_PROGRAMS=num_programs)
    _merge_ranges_kernel[(num_kv_heads, num_rows)](
        partial, lse, items.ranges, out, *partial_strides, out.stride(0), out.stride(1), **common)
    return out


def ranged_programs(num_rows: int, num_kv_heads: int, num_sms: int, waves: int = 16) -> int:
    """Programs per kv head for ranged_decode_attention: 0 (one per row) where the rows alone give every SM
    several programs, else a pool of `waves` programs per SM that takes the items in turn, so that a step of
    many padding rows and a few long contexts (the smallest decode step, in the tail of a run) fills the GPU.
    Measured on the H200 (benchmarks/results/h200_decode_attention_splits_merged.json): 128 rows of which 2 hold
    2048 tokens, 29.5 us per layer in the pool against 68.2 walking rows; every row real, the two within 2%."""
    if num_rows * num_kv_heads > 8 * num_sms:
        return 0
    return max(1, -(-waves * num_sms // num_kv_heads))


def group_pad(group: int) -> int:
    return max(16, triton.next_power_of_2(group))  # NOTE: tl.dot needs 16 rows


def precision_for(dtype: torch.dtype) -> str:
    # NOTE: float32 models (the CPU-parity tests) keep full precision; tf32 would drift from the reference.
    return "ieee" if dtype == torch.float32 else "tf32"


def split_kv_heuristic(num_rows: int, num_kv_heads: int, num_sms: int, max_splits: int = 16) -> int:
    """Mixed mode: split the context when rows x kv heads cannot fill the GPU (FlashAttention's idea), so the
    split count, and with it a request's reduction order, follows the batch size."""
    programs = num_rows * num_kv_heads
    return 1 if programs == 0 or programs >= num_sms else max(1, min(max_splits, -(-2 * num_sms // programs)))
