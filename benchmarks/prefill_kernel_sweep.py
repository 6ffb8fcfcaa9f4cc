"""Launch variants of the packed prefill attention kernel at the Qwen3-8B shape (a probe for issue 20).

    python -m benchmarks.prefill_kernel_sweep --out FILE

The kernel of corun/kernels/prefill_attention.py, copied with its fixed choices made parameters: query positions per
program, KV positions per tile, warps, pipeline stages, whether KV tiles wholly below a query tile skip the causal
mask, and exp2 with the scale folded in. For each variant: ms and TFLOP/s for one 4096-token prompt and for packs,
and the property the product needs (a prompt's rows bitwise equal whether it is prefilled alone or packed behind
others, in one chunk or two).
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton
import triton.language as tl

from benchmarks.harness import timed

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
GROUP = HEADS // KV_HEADS
LOG2E = 1.4426950408889634


@triton.jit
def _kernel(q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, tile_seqs_ptr, tile_starts_ptr, query_starts_ptr,
            start_positions_ptr, num_tokens_ptr, scale, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
            stride_ot, stride_oh, stride_table, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
            BLOCK_SIZE: tl.constexpr, QUERY_TOKENS: tl.constexpr, TILE: tl.constexpr, SPLIT: tl.constexpr,
            EXP2: tl.constexpr, LONGEST_FIRST: tl.constexpr, NUM_KV_HEADS: tl.constexpr):
    if LONGEST_FIRST:  # NOTE: one grid axis, kv heads innermost, the tiles sorted longest first (Pack)
        program, kv_head = tl.program_id(0) // NUM_KV_HEADS, tl.program_id(0) % NUM_KV_HEADS
    else:
        program, kv_head = tl.program_id(0), tl.program_id(1)
    seq = tl.load(tile_seqs_ptr + program)
    if seq >= 0:
        tile_start = tl.load(tile_starts_ptr + program)
        query_start = tl.load(query_starts_ptr + seq)
        start_pos = tl.load(start_positions_ptr + seq)
        num_tokens = tl.load(num_tokens_ptr + seq)
        table_ptr = tables_ptr + seq.to(tl.int64) * stride_table
        rows = tl.arange(0, QUERY_TOKENS * GROUP_PAD)
        tokens = tile_start - start_pos + rows // GROUP_PAD
        heads = kv_head * GROUP + rows % GROUP_PAD
        row_valid = (tokens >= 0) & (tokens < num_tokens) & (rows % GROUP_PAD < GROUP)
        step_rows = (query_start + tokens).to(tl.int64)
        dims = tl.arange(0, HEAD_DIM)
        q = tl.load(q_ptr + step_rows[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                    mask=row_valid[:, None], other=0.0)
        query_positions = start_pos + tokens
        last_position = tl.minimum(tile_start + QUERY_TOKENS, start_pos + num_tokens) - 1
        qk_scale = scale * 1.4426950408889634 if EXP2 else scale
        m = tl.full([QUERY_TOKENS * GROUP_PAD], float("-inf"), tl.float32)
        denom = tl.zeros([QUERY_TOKENS * GROUP_PAD], tl.float32)
        acc = tl.zeros([QUERY_TOKENS * GROUP_PAD, HEAD_DIM], tl.float32)
        num_tiles = last_position // TILE + 1
        unmasked_tiles = tile_start // TILE if SPLIT else 0  # NOTE: every key of these is below every query row
        for tile in range(0, unmasked_tiles):
            positions = tile * TILE + tl.arange(0, TILE)
            blocks = tl.load(table_ptr + positions // BLOCK_SIZE)
            offsets = blocks.to(tl.int64) * stride_kb + (positions % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
            k = tl.load(k_ptr + offsets[:, None] + dims[None, :])
            v = tl.load(v_ptr + offsets[:, None] + dims[None, :])
            scores = tl.dot(q, tl.trans(k)) * qk_scale
            m_new = tl.maximum(m, tl.max(scores, 1))
            if EXP2:
                alpha = tl.where(m_new == m, 1.0, tl.exp2(m - m_new))
                p = tl.exp2(scores - m_new[:, None])
            else:
                alpha = tl.where(m_new == m, 1.0, tl.exp(m - m_new))
                p = tl.exp(scores - m_new[:, None])
            denom = denom * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        for tile in range(unmasked_tiles, num_tiles):
            positions = tile * TILE + tl.arange(0, TILE)
            kv_valid = positions <= last_position
            blocks = tl.load(table_ptr + positions // BLOCK_SIZE, mask=kv_valid, other=0)
            offsets = blocks.to(tl.int64) * stride_kb + (positions % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
            k = tl.load(k_ptr + offsets[:, None] + dims[None, :], mask=kv_valid[:, None], other=0.0)
            v = tl.load(v_ptr + offsets[:, None] + dims[None, :], mask=kv_valid[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k)) * qk_scale
            scores = tl.where(positions[None, :] <= query_positions[:, None], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, 1))
            if EXP2:
                alpha = tl.where(m_new == m, 1.0, tl.exp2(m - m_new))
                p = tl.exp2(scores - m_new[:, None])
            else:
                alpha = tl.where(m_new == m, 1.0, tl.exp(m - m_new))
                p = tl.exp(scores - m_new[:, None])
            denom = denom * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        out = acc / denom[:, None]
        tl.store(out_ptr + step_rows[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


class Pack:
    """Sequences (start position, tokens) of one launch over a shared paged cache."""

    def __init__(self, cache_k, cache_v, tables, seqs: list[tuple[int, int, int]], query_tile: int,
                 longest_first: bool = False, coarse_positions: int = 1):
        """seqs: (table row, start position, tokens); the step's rows are the sequences' tokens in order.
        longest_first: the query tiles sorted by their keys, most first (else sequence by sequence, in order)."""
        device = cache_k.device
        self.cache_k, self.cache_v = cache_k, cache_v
        self.tables = tables[[s[0] for s in seqs]].contiguous()
        starts, counts = [s[1] for s in seqs], [s[2] for s in seqs]
        query_starts = [0] + list(itertools.accumulate(counts))[:-1]
        tile_seqs, tile_starts = [], []
        for i, (start, count) in enumerate(zip(starts, counts)):
            first, last = start // query_tile, (start + count - 1) // query_tile
            tile_seqs += [i] * (last - first + 1)
            tile_starts += [t * query_tile for t in range(first, last + 1)]
        if longest_first:
            # NOTE: coarse_positions > 1: tiles in bands of that many positions, longest band first, and within a
            # band sequence by sequence (a sequence's tiles launch together, its keys still in L2)
            band = lambda i: (-(tile_starts[i] // coarse_positions), tile_seqs[i], -tile_starts[i])  # noqa: E731
            order = sorted(range(len(tile_starts)), key=band)
            tile_seqs, tile_starts = [tile_seqs[i] for i in order], [tile_starts[i] for i in order]
        ints = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
        self.query_starts, self.start_positions, self.num_tokens = ints(query_starts), ints(starts), ints(counts)
        self.tile_seqs, self.tile_starts = ints(tile_seqs), ints(tile_starts)
        self.rows = sum(counts)


def pack_for(variant: dict, k, v, tables, seqs: list[tuple[int, int, int]]) -> Pack:
    order = variant.get("order", "launch")
    return Pack(k, v, tables, seqs, variant["query"], longest_first=order != "launch",
                coarse_positions=int(order.split("_")[-1]) if order.startswith("bands_") else 1)


def launch(variant: dict, q, pack: Pack, out):
    longest_first = variant.get("order", "launch") != "launch"
    grid = (pack.tile_seqs.shape[0] * KV_HEADS,) if longest_first else (pack.tile_seqs.shape[0], KV_HEADS)
    _kernel[grid](
        q, pack.cache_k, pack.cache_v, out, pack.tables, pack.tile_seqs, pack.tile_starts, pack.query_starts,
        pack.start_positions, pack.num_tokens, HEAD_DIM ** -0.5, q.stride(0), q.stride(1), pack.cache_k.stride(0),
        pack.cache_k.stride(1), pack.cache_k.stride(2), out.stride(0), out.stride(1), pack.tables.stride(0),
        GROUP=GROUP, GROUP_PAD=GROUP, HEAD_DIM=HEAD_DIM, BLOCK_SIZE=BLOCK, QUERY_TOKENS=variant["query"],
        TILE=variant["tile"], SPLIT=variant["split"], EXP2=variant["exp2"], LONGEST_FIRST=longest_first,
        NUM_KV_HEADS=KV_HEADS, num_warps=variant["warps"], num_stages=variant["stages"])
    return out


def causal_tflops(lengths: list[int], seconds: float) -> float:
    return round(sum(4 * n * (n + 1) / 2 * HEAD_DIM * HEADS for n in lengths) / seconds / 1e12, 1)


def make_cache(lengths: list[int], gen):
    """A cache holding each sequence's K and V on scattered blocks, and its block tables."""
    blocks_each = [-(-n // BLOCK) for n in lengths]
    total_blocks = sum(blocks_each) + 1
    k = torch.randn(total_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(total_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
    order = torch.randperm(total_blocks - 1, generator=gen, device="cuda") + 1
    tables = torch.zeros(len(lengths), max(blocks_each), dtype=torch.int64, device="cuda")
    used = 0
    for i, b in enumerate(blocks_each):
        tables[i, :b] = order[used:used + b]
        used += b
    return k, v, tables


def check_invariance(variant: dict, gen) -> bool:
    """A 700-token prompt's rows: alone in one chunk = behind two others = in two chunks (300 + 400)."""
    lengths = [700, 123, 517]
    k, v, tables = make_cache(lengths, gen)
    q_all = torch.randn(sum(lengths), HEADS, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
    q0 = q_all[:700].contiguous()
    alone = launch(variant, q0, pack_for(variant, k, v, tables, [(0, 0, 700)]), torch.empty_like(q0))
    q_behind = torch.cat([q_all[700:], q0])
    behind = launch(variant, q_behind, pack_for(variant, k, v, tables, [(1, 0, 123), (2, 0, 517), (0, 0, 700)]),
                    torch.empty_like(q_behind))[640:]
    first = launch(variant, q0[:300].contiguous(), pack_for(variant, k, v, tables, [(0, 0, 300)]),
                   torch.empty_like(q0[:300]))
    second = launch(variant, q0[300:].contiguous(), pack_for(variant, k, v, tables, [(0, 300, 400)]),
                    torch.empty_like(q0[300:]))
    return bool(torch.equal(alone, behind) and torch.equal(alone, torch.cat([first, second])))


def measure(variant: dict, packs: dict[str, list[int]], gen) -> dict:
    row = {"invariant": check_invariance(variant, gen)}
    for name, lengths in packs.items():
        k, v, tables = make_cache(lengths, gen)
        pack = pack_for(variant, k, v, tables, [(i, 0, n) for i, n in enumerate(lengths)])
        q = torch.randn(pack.rows, HEADS, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(q)
        seconds = timed(lambda: launch(variant, q, pack, out), 20)
        row[name] = {"ms": round(1e3 * seconds, 4), "tflops": causal_tflops(lengths, seconds)}
    return row


PRODUCT = dict(query=64, tile=64, warps=8, stages=3, split=True, exp2=True)
"""The product's launch until stop 55 (launch order: sequence by sequence, kv head outermost)."""
VARIANTS = [PRODUCT] + [{**PRODUCT, "order": order} for order in ("longest_first", "bands_256", "bands_512")]
VARIANTS += [dict(query=q, tile=t, warps=w, stages=st, split=True, exp2=True, order="longest_first")
             for q, t, w, st in [(64, 64, 16, 3), (64, 64, 16, 2), (64, 128, 16, 2), (64, 128, 16, 3),
                                 (32, 128, 8, 3), (64, 32, 8, 3)]]
"""Orders: launch (sequence by sequence), longest_first (every tile by its keys, most first), bands_N (tiles in bands
of N positions, longest band first, sequence by sequence within one)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    packs = {"4096": [4096], "2x2048": [2048] * 2, "8x1024": [1024] * 8, "32x256": [256] * 32}
    report = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "variants": []}
    for variant in VARIANTS:
        gen = torch.Generator(device="cuda").manual_seed(0)
        try:
            result = measure(variant, packs, gen)
        except Exception as e:  # noqa: BLE001 - a variant the compiler refuses (shared memory) is reported
            result = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        report["variants"].append({"variant": variant, **result})
        print(json.dumps(report["variants"][-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
