"""Why a decode step of few long rows is slow in the one-range kernel, and what keeps its bits (a probe).

    python -m benchmarks.decode_attention_variants --out FILE

In the smallest fixed-shape decode step (128 rows, ~8 real of ~1.2k tokens) each (row, kv head) program walks
its context tile by tile and the GPU is mostly idle: ~2.8 us per 64-token tile against ~1 us on a full step
(h200_tail_step_profile.json). This times, per layer of the 8B shape in CUDA graphs, the one-range kernel
(`_paged_decode_kernel`) at other launch settings and a variant that loads tile t + 1's K and V (and tile t + 2's
block-table entries) before it reduces tile t, the same arithmetic in the same order, and checks each against
the committed kernel's bits. It also reports whether Triton pipelined the committed kernel's loads (cp.async in
its PTX).
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from benchmarks.decode_attention_splits import BLOCK, HEAD_DIM, KV_HEADS, graph_seconds, make_case
from corun.kernels.decode_attention import (
    DEFAULT_LAUNCH,
    _attend_tiles,
    _load_tile,
    _merge_range,
    _merge_ranges_kernel,
    _paged_decode_kernel,
    _range_result,
    _reduce_tile,
    group_pad,
    paged_decode_attention,
    precision_for,
    range_items,
    ranged_decode_attention,
    ranged_programs,
    split_kv_heuristic,
)


@triton.jit
def _prefetch_decode_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, out_ptr, scale,
    stride_qr, stride_qh, stride_kb, stride_kt, stride_kh, stride_tr, stride_or, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_TOKENS: tl.constexpr, PRECISION: tl.constexpr,
):
    row, kv_head = tl.program_id(0), tl.program_id(1)
    context_len = tl.load(lens_ptr + row)
    num_tiles = tl.cdiv(context_len, TILE_TOKENS)
    group = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + group
    head_mask = group < GROUP
    dims = tl.arange(0, HEAD_DIM)
    lanes = tl.arange(0, TILE_TOKENS)
    q = tl.load(q_ptr + row * stride_qr + heads[:, None] * stride_qh + dims[None, :], mask=head_mask[:, None],
                other=0.0)
    table = tables_ptr + row * stride_tr
    k, v, valid = _load_tile(k_ptr, v_ptr, tables_ptr, row, kv_head, lanes, context_len, dims, stride_kb, stride_kt,
                             stride_kh, stride_tr, BLOCK_SIZE)
    ahead = lanes + TILE_TOKENS
    blocks_ahead = tl.load(table + ahead // BLOCK_SIZE, mask=ahead < context_len, other=0)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for tile in range(0, num_tiles):
        # NOTE: tile + 1's K and V and tile + 2's table entries are in flight while tile t is reduced
        next_valid = ahead < context_len
        next_offsets = blocks_ahead.to(tl.int64) * stride_kb + (ahead % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
        next_k = tl.load(k_ptr + next_offsets[:, None] + dims[None, :], mask=next_valid[:, None], other=0.0)
        next_v = tl.load(v_ptr + next_offsets[:, None] + dims[None, :], mask=next_valid[:, None], other=0.0)
        further = ahead + TILE_TOKENS
        blocks_ahead = tl.load(table + further // BLOCK_SIZE, mask=further < context_len, other=0)
        m, denom, acc = _reduce_tile(q, k, v, valid, m, denom, acc, scale, PRECISION)
        k, v, valid, ahead = next_k, next_v, next_valid, further
    safe_denom = tl.where(denom > 0, denom, 1.0)
    tl.store(out_ptr + row * stride_or + heads[:, None] * stride_oh + dims[None, :],
             (acc / safe_denom[:, None]).to(out_ptr.dtype.element_ty), mask=head_mask[:, None])


@triton.jit
def _grid_ranges_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, partial_ptr, lse_ptr, scale,
    stride_qr, stride_qh, stride_kb, stride_kt, stride_kh, stride_tr, stride_pr, stride_ph, stride_ps,
    stride_lr, stride_lh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_TOKENS: tl.constexpr, SPLIT_TILES: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program per (kv head, row, range): mixed mode's flat split kernel with fixed-size ranges."""
    kv_head, row, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    context_len = tl.load(lens_ptr + row)
    num_tiles = tl.cdiv(context_len, TILE_TOKENS)
    tile_start = split * SPLIT_TILES
    if tile_start < num_tiles:
        group = tl.arange(0, GROUP_PAD)
        heads = kv_head * GROUP + group
        head_mask = group < GROUP
        dims = tl.arange(0, HEAD_DIM)
        q = tl.load(q_ptr + row * stride_qr + heads[:, None] * stride_qh + dims[None, :], mask=head_mask[:, None],
                    other=0.0)
        m, denom, acc = _attend_tiles(q, k_ptr, v_ptr, tables_ptr, row, kv_head, context_len, tile_start,
                                      tl.minimum(num_tiles, tile_start + SPLIT_TILES), scale, stride_kb, stride_kt,
                                      stride_kh, stride_tr, GROUP_PAD, HEAD_DIM, BLOCK_SIZE, TILE_TOKENS, PRECISION)
        part, lse = _range_result(m, denom, acc)
        tl.store(partial_ptr + row * stride_pr + heads[:, None] * stride_ph + split * stride_ps + dims[None, :], part,
                 mask=head_mask[:, None])
        tl.store(lse_ptr + row * stride_lr + heads * stride_lh + split, lse, mask=head_mask)


@triton.jit
def _flat_walk_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, out_ptr, scale,
    stride_qr, stride_qh, stride_kb, stride_kt, stride_kh, stride_tr, stride_or, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_TOKENS: tl.constexpr, SPLIT_TILES: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program per (kv head, row) walking the row's tiles in one loop; at each range's last tile the range is
    folded into the row's merge (selected, not branched, so the loop stays one pipelined loop)."""
    kv_head, row = tl.program_id(0), tl.program_id(1)
    context_len = tl.load(lens_ptr + row)
    num_tiles = tl.cdiv(context_len, TILE_TOKENS)
    group = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + group
    head_mask = group < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + row * stride_qr + heads[:, None] * stride_qh + dims[None, :], mask=head_mask[:, None],
                other=0.0)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    range_m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    range_denom = tl.zeros([GROUP_PAD], tl.float32)
    range_acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for tile in range(0, num_tiles):
        k, v, valid = _load_tile(k_ptr, v_ptr, tables_ptr, row, kv_head, tile * TILE_TOKENS + tl.arange(0, TILE_TOKENS),
                                 context_len, dims, stride_kb, stride_kt, stride_kh, stride_tr, BLOCK_SIZE)
        range_m, range_denom, range_acc = _reduce_tile(q, k, v, valid, range_m, range_denom, range_acc, scale,
                                                       PRECISION)
        ends = ((tile + 1) % SPLIT_TILES == 0) | (tile + 1 == num_tiles)
        part, lse = _range_result(range_m, range_denom, range_acc)
        merged_m, merged_denom, merged_acc = _merge_range(m, denom, acc, part, lse)
        m = tl.where(ends, merged_m, m)
        denom = tl.where(ends, merged_denom, denom)
        acc = tl.where(ends, merged_acc, acc)
        range_m = tl.where(ends, float("-inf"), range_m)
        range_denom = tl.where(ends, 0.0, range_denom)
        range_acc = tl.where(ends, 0.0, range_acc)
    tl.store(out_ptr + row * stride_or + heads[:, None] * stride_oh + dims[None, :],
             (acc / denom[:, None]).to(out_ptr.dtype.element_ty), mask=head_mask[:, None])


def grid_ranges_attention(q, k_cache, v_cache, tables, lens, scale, split_tokens):
    rows, heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    max_ranges = -(-tables.shape[1] * block_size // split_tokens)
    items = range_items(lens, tables.shape[1] * block_size, split_tokens)
    partial = torch.empty(rows, heads, max_ranges, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(rows, heads, max_ranges, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    common = dict(GROUP=heads // kv_heads, GROUP_PAD=group_pad(heads // kv_heads), HEAD_DIM=head_dim)
    partial_strides = (partial.stride(0), partial.stride(1), partial.stride(2), lse.stride(0), lse.stride(1))
    _grid_ranges_kernel[(kv_heads, rows, max_ranges)](
        q, k_cache, v_cache, tables, lens, partial, lse, scale, q.stride(0), q.stride(1), k_cache.stride(0),
        k_cache.stride(1), k_cache.stride(2), tables.stride(0), *partial_strides, **common, BLOCK_SIZE=block_size,
        TILE_TOKENS=DEFAULT_LAUNCH.tile_tokens, SPLIT_TILES=split_tokens // DEFAULT_LAUNCH.tile_tokens,
        PRECISION=precision_for(q.dtype), num_warps=4, num_stages=3)
    _merge_ranges_kernel[(kv_heads, rows)](partial, lse, items.ranges, out, *partial_strides, out.stride(0),
                                           out.stride(1), **common)
    return out


def flat_walk_attention(q, k_cache, v_cache, tables, lens, scale, split_tokens):
    rows, heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    _flat_walk_kernel[(kv_heads, rows)](
        q, k_cache, v_cache, tables, lens, out, scale, q.stride(0), q.stride(1), k_cache.stride(0),
        k_cache.stride(1), k_cache.stride(2), tables.stride(0), out.stride(0), out.stride(1),
        GROUP=heads // kv_heads, GROUP_PAD=group_pad(heads // kv_heads), HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        TILE_TOKENS=DEFAULT_LAUNCH.tile_tokens, SPLIT_TILES=split_tokens // DEFAULT_LAUNCH.tile_tokens,
        PRECISION=precision_for(q.dtype), num_warps=4, num_stages=3)
    return out


def prefetch_attention(q, k_cache, v_cache, tables, lens, scale, num_warps=4, num_stages=1):
    rows, heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    _prefetch_decode_kernel[(rows, kv_heads)](
        q, k_cache, v_cache, tables, lens, out, scale, q.stride(0), q.stride(1), k_cache.stride(0),
        k_cache.stride(1), k_cache.stride(2), tables.stride(0), out.stride(0), out.stride(1),
        GROUP=heads // kv_heads, GROUP_PAD=group_pad(heads // kv_heads), HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        TILE_TOKENS=DEFAULT_LAUNCH.tile_tokens, PRECISION=precision_for(q.dtype), num_warps=num_warps,
        num_stages=num_stages)
    return out


def launched(num_warps, num_stages, tile_tokens=DEFAULT_LAUNCH.tile_tokens):
    launch = type(DEFAULT_LAUNCH)(tile_tokens=tile_tokens, num_warps=num_warps, num_stages=num_stages)
    return lambda q, k, v, t, lens, scale: paged_decode_attention(q, k, v, t, lens, scale, 1, launch)


def variants(sms: int, rows: int, active: int, launches: bool, tiles: bool = False) -> dict:
    found = {"committed": lambda q, k, v, t, lens, scale: paged_decode_attention(q, k, v, t, lens, scale)}
    if launches:
        for warps, stages in ((4, 1), (4, 2), (4, 4), (8, 3), (2, 3)):
            found[f"launch_w{warps}_s{stages}"] = launched(warps, stages)
        for warps, stages in ((4, 1), (4, 2), (8, 1), (8, 2)):
            found[f"prefetch_w{warps}_s{stages}"] = (lambda w, s: lambda q, k, v, t, lens, scale: prefetch_attention(
                q, k, v, t, lens, scale, w, s))(warps, stages)
    if tiles:
        for tile, warps, stages in ((128, 4, 3), (128, 8, 3), (128, 4, 2), (128, 8, 2), (32, 4, 3), (32, 2, 3)):
            found[f"tile{tile}_w{warps}_s{stages}"] = launched(warps, stages, tile)
    splits = split_kv_heuristic(active, KV_HEADS, sms)
    found["mixed_split"] = lambda q, k, v, t, lens, scale: paged_decode_attention(q, k, v, t, lens, scale, splits)
    for split in (256, 512):
        for how, programs in (("", ranged_programs(rows, KV_HEADS, sms)), ("_pool", ranged_programs(1, KV_HEADS, sms)),
                              ("_rows", 0)):
            found[f"split_{split}{how}"] = (lambda s, p: lambda q, k, v, t, lens, scale: ranged_decode_attention(
                q, k, v, t, lens, range_items(lens, t.shape[1] * BLOCK, s), scale, s, p))(split, programs)
        found[f"split_{split}_grid"] = (lambda s: lambda q, k, v, t, lens, scale: grid_ranges_attention(
            q, k, v, t, lens, scale, s))(split)
        found[f"split_{split}_flat"] = (lambda s: lambda q, k, v, t, lens, scale: flat_walk_attention(
            q, k, v, t, lens, scale, s))(split)
    return found


def pipelined_loads() -> dict:
    """cp.async / TMA instructions in the committed kernel's PTX: whether Triton pipelined its K/V loads."""
    kernels = list(_paged_decode_kernel.device_caches[torch.cuda.current_device()][0].values())
    ptx = kernels[0].asm["ptx"] if kernels else ""
    return {"cp_async": ptx.count("cp.async"), "ld_global": ptx.count("ld.global"), "kernels_compiled": len(kernels)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", default="128:8:1200,128:2:2048,256:256:512,256:256:1024",
                        help="rows:active:context[:padding rows' context, default 1]")
    parser.add_argument("--launches", action="store_true", help="also other launch settings and the prefetch kernel")
    parser.add_argument("--tiles", action="store_true", help="also other tile sizes (a different reduction order)")
    parser.add_argument("--max-model-len", type=int, default=6144)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(0)
    scale = HEAD_DIM ** -0.5
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "layer_us": [], "bits_equal_committed": {}}
    variants_cache = {}  # NOTE: each ranged variant's bits against the first layout of its split size
    for step in args.steps.split(","):
        rows, active, context, pad_context = (int(x) for x in (step + ":1").split(":")[:4])
        q, k, v, tables, lens = make_case(rows, active, context, args.max_model_len // BLOCK, gen, pad_context)
        entry = {"rows": rows, "active": active, "context": context, "padding_context": pad_context}
        reference = paged_decode_attention(q, k, v, tables, lens, scale)
        for name, fn in variants(sms, rows, active, args.launches, args.tiles).items():
            try:
                entry[name] = round(1e6 * graph_seconds(lambda: fn(q, k, v, tables, lens, scale)), 1)
                base = name.split("_")[:2]
                against = reference if not name.startswith("split_") else variants_cache.setdefault(
                    (step, "_".join(base)), fn(q, k, v, tables, lens, scale))
                same = torch.equal(fn(q, k, v, tables, lens, scale)[:active], against[:active])
                report["bits_equal_committed"][name] = report["bits_equal_committed"].get(name, True) and same
            except Exception as error:  # NOTE: a launch that does not compile (registers) is a finding, not a stop
                entry[name] = f"failed: {type(error).__name__}: {str(error)[:200]}"
        report["layer_us"].append(entry)
        print(json.dumps(entry), flush=True)
    try:
        report["committed_ptx"] = pipelined_loads()
    except Exception as error:
        report["committed_ptx"] = f"failed: {error}"
    print(json.dumps({k: report[k] for k in ("bits_equal_committed", "committed_ptx")}), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
