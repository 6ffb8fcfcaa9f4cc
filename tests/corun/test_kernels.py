"""Triton kernels against references, and their (in)variance.

On a GPU everything runs at model-like sizes. On CPU hosts (CI) the invariance tests run small shapes through
Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 there); GPU-only facts (cuBLAS and split-KV
batch dependence) are skipped.
"""

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from corun.attention import fixed_window_decode_attention
from wire.config import DECODE_TILE_TOKENS

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# NOTE: not marked numerics: on CPU the kernels run in Triton's interpreter, on numpy, whose rounding ATen's and
# MKL's CPU capability (the other-capability run) does not change; the torch references are compared with a tolerance
pytestmark = [pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")]
gpu_only = pytest.mark.gpu  # NOTE: a GPU fact
# NOTE: Triton's CPU interpreter mishandles bfloat16 dots (garbage values), so bf16 cases need the GPU.
BF16 = pytest.param(torch.bfloat16, marks=gpu_only)


HEADS, KV_HEADS = (32, 8) if ON_GPU else (8, 2)
"""Query and kv heads of the cases. NOTE: on CPU, two kv heads of four query heads each: the GPU cases' GQA group
at a quarter of the programs, which Triton's interpreter runs one at a time (every kv head's programs walk the
same positions)."""


def paged_case(num_rows: int, dtype, seed: int = 0, num_heads: int = HEADS, num_kv_heads: int = KV_HEADS,
               head_dim: int = 128 if ON_GPU else 32, block_size: int = 16, window_blocks: int = 64 if ON_GPU else 20):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    num_blocks = num_rows * window_blocks + 1
    kv = torch.randn(num_blocks, 2, 2, block_size, num_kv_heads, head_dim, generator=gen, device=DEVICE).to(dtype)
    k_cache, v_cache = kv[:, 1, 0], kv[:, 1, 1]  # NOTE: strided per-layer views, as in PagedKVCache
    q = torch.randn(num_rows, num_heads, head_dim, generator=gen, device=DEVICE).to(dtype)
    tables = torch.randperm(num_blocks - 1, generator=gen, device=DEVICE)[: num_rows * window_blocks] + 1
    tables = tables.view(num_rows, window_blocks)
    lens = torch.randint(1, window_blocks * block_size, (num_rows,), generator=gen, device=DEVICE)
    return q, k_cache, v_cache, tables, lens


def ranged(q, k_cache, v_cache, tables, lens, split_tokens: int, programs: int = 3):
    from corun.kernels.decode_attention import range_items, ranged_decode_attention

    items = range_items(lens, tables.shape[1] * k_cache.shape[1], split_tokens)
    return ranged_decode_attention(q, k_cache, v_cache, tables, lens, items, q.shape[-1] ** -0.5, split_tokens,
                                   programs)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("cut", ["one", "equal_4", "ranges"])
def test_paged_decode_matches_reference(dtype, cut):
    from corun.kernels.decode_attention import paged_decode_attention

    q, k_cache, v_cache, tables, lens = paged_case(12 if ON_GPU else 3, dtype)
    scale = q.shape[-1] ** -0.5
    if cut == "ranges":
        ours = ranged(q, k_cache, v_cache, tables, lens, DECODE_TILE_TOKENS)
    else:
        ours = paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, 1 if cut == "one" else 4)
    reference = fixed_window_decode_attention(q.float(), k_cache.float(), v_cache.float(), tables, lens, scale)
    tolerance = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours.float(), reference, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_fixed_size_split_decode_is_batch_invariant(dtype):
    """fixed_shape's split-KV: ranges of a fixed token count, so a row's bits are the same alone, in a batch, in
    another slot and whatever number of programs share the ranges. Inverse: where the cuts fall does change bits,
    so they must depend on the request alone."""
    rows = 32 if ON_GPU else 4
    q, k_cache, v_cache, tables, lens = paged_case(rows, dtype, seed=3, window_blocks=64 if ON_GPU else 24)
    lens[0] = lens.max()  # NOTE: several ranges, the last one partial
    split = 256 if ON_GPU else DECODE_TILE_TOKENS
    batched = ranged(q, k_cache, v_cache, tables, lens, split)
    alone = ranged(q[:1], k_cache, v_cache, tables[:1], lens[:1], split, programs=1)
    moved = ranged(q.flip(0), k_cache, v_cache, tables.flip(0), lens.flip(0), split, programs=2)
    row_walk = ranged(q, k_cache, v_cache, tables, lens, split, programs=0)  # NOTE: the layout of full steps
    assert torch.equal(alone[0], batched[0]) and torch.equal(moved.flip(0), batched)
    assert torch.equal(row_walk, batched)
    other_cut = ranged(q[:1], k_cache, v_cache, tables[:1], lens[:1], 2 * split)
    assert not torch.equal(other_cut[0], alone[0])


@gpu_only
def test_no_split_decode_is_batch_invariant_and_split_kv_is_not():
    from corun.kernels.decode_attention import paged_decode_attention, split_kv_heuristic

    q, k_cache, v_cache, tables, lens = paged_case(64, torch.bfloat16, seed=1)
    lens[0] = tables.shape[1] * k_cache.shape[1]  # NOTE: many tiles, so the splits alone each hold some of row 0
    scale = 128 ** -0.5
    alone = paged_decode_attention(q[:1], k_cache, v_cache, tables[:1], lens[:1], scale, 1)
    batched = paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, 1)
    assert torch.equal(alone[0], batched[0])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    split_alone = paged_decode_attention(q[:1], k_cache, v_cache, tables[:1], lens[:1], scale,
                                         split_kv_heuristic(1, 8, sms))
    split_batched = paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, split_kv_heuristic(64, 8, sms))
    assert not torch.equal(split_alone[0], split_batched[0])  # the mixed path's batch dependence


@gpu_only
def test_batch_invariant_linear_matches_and_is_invariant_where_cublas_is_not():
    from corun.kernels.batch_invariant import batch_invariant_linear

    gen = torch.Generator(device=DEVICE).manual_seed(2)
    x = torch.randn(256, 4096, generator=gen, device=DEVICE).to(torch.bfloat16)
    w = torch.randn(4096, 4096, generator=gen, device=DEVICE).to(torch.bfloat16) / 64
    torch.testing.assert_close(batch_invariant_linear(x, w).float(), F.linear(x, w).float(), atol=5e-2, rtol=2e-2)
    for rows in (1, 3, 64, 128, 256):
        assert torch.equal(batch_invariant_linear(x[:rows], w)[0], batch_invariant_linear(x, w)[0])
    # NOTE: cuBLAS is not batch-invariant: one row runs another kernel than many (with or without split-K)
    assert any(not torch.equal(F.linear(x[:rows], w)[0], F.linear(x[:1], w)[0]) for rows in (3, 64, 128, 256))


def prefill_case(num_tokens: int, dtype, seed: int):
    q, k_cache, v_cache, tables, _ = paged_case(1, dtype, seed=seed, window_blocks=-(-num_tokens // 16))
    gen = torch.Generator(device=DEVICE).manual_seed(seed + 1)
    prompt = torch.randn(num_tokens, HEADS, q.shape[-1], generator=gen, device=DEVICE).to(dtype)
    return prompt, k_cache, v_cache, tables[0]


def prefill_reference(prompt, k_cache, v_cache, table, start: int, scale: float):
    """Causal attention of prompt tokens at positions start.. over the cached prefix, in float32 SDPA."""
    num_new, context = prompt.shape[0], start + prompt.shape[0]
    keys = k_cache[table].flatten(0, 1)[:context].float()
    values = v_cache[table].flatten(0, 1)[:context].float()
    mask = torch.arange(context, device=DEVICE)[None, :] <= torch.arange(num_new, device=DEVICE)[:, None] + start
    out = F.scaled_dot_product_attention(prompt.float().transpose(0, 1), keys.transpose(0, 1),
                                         values.transpose(0, 1), attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_chunk_invariant_prefill_matches_causal_attention(dtype):
    from corun.kernels.prefill_attention import paged_prefill_attention

    prompt, k_cache, v_cache, table = prefill_case(100, dtype, seed=3)
    for start, num in ((0, 100), (37, 63), (99, 1)):
        ours = paged_prefill_attention(prompt[start:start + num], k_cache, v_cache, table, start, 0.088)
        expected = prefill_reference(prompt[start:start + num], k_cache, v_cache, table, start, 0.088)
        tolerance = 2e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(ours.float(), expected, atol=tolerance, rtol=tolerance)


def test_chunk_invariant_prefill_is_chunking_invariant():
    """batch_invariant mode's prompt attention: a token's output is the same however its prompt is chunked."""
    from corun.kernels.prefill_attention import paged_prefill_attention

    dtype = torch.bfloat16 if ON_GPU else torch.float32
    prompt, k_cache, v_cache, table = prefill_case(100, dtype, seed=4)

    def chunked(cuts: list[int]) -> torch.Tensor:
        bounds = [0, *cuts, 100]
        return torch.cat([paged_prefill_attention(prompt[a:b], k_cache, v_cache, table, a, 0.088)
                          for a, b in zip(bounds, bounds[1:])])

    whole = chunked([])
    for cuts in ([60], [1, 2, 3], [17, 64, 65], [33, 98]):  # NOTE: across query and KV tile boundaries
        assert torch.equal(chunked(cuts), whole), cuts


def test_chunk_invariant_prefill_is_chunking_invariant_far_from_position_0():
    """Several KV tiles below a query tile (unmasked) and one on its diagonal (masked), cut anywhere."""
    from corun.kernels.prefill_attention import paged_prefill_attention

    dtype = torch.bfloat16 if ON_GPU else torch.float32
    prompt, k_cache, v_cache, table = prefill_case(700, dtype, seed=6)

    def chunked(cuts: list[int]) -> torch.Tensor:
        bounds = [0, *cuts, 700]
        return torch.cat([paged_prefill_attention(prompt[a:b], k_cache, v_cache, table, a, 0.088)
                          for a, b in zip(bounds, bounds[1:])])

    whole = chunked([])
    expected = prefill_reference(prompt, k_cache, v_cache, table, 0, 0.088)
    tolerance = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(whole.float(), expected, atol=tolerance, rtol=tolerance)
    for cuts in ([300], [127, 128, 129], [200, 450, 699]):
        assert torch.equal(chunked(cuts), whole), cuts


def test_packed_prefill_is_pack_invariant():
    """fixed_shape's packed prefill: a sequence's attention rows are the same alone, among other sequences, at any
    row of the step and with spare programs in the grid (a captured graph's fixed grid)."""
    from corun.kernels.prefill_attention import packed_prefill_attention
    from corun.packed_prefill import PackedPrefillMeta, max_prefill_tiles, packed_prefill_tiles

    dtype = torch.bfloat16 if ON_GPU else torch.float32
    prompt, k_cache, v_cache, table = prefill_case(100, dtype, seed=5)
    others = [(7, 30), (0, 19), (48, 5)]  # NOTE: (start position, tokens) of co-packed chunks (same KV here)

    def run(seqs: list[tuple[int, int]], target: int, num_rows: int) -> torch.Tensor:
        """seqs: (start, tokens) laid out one after another; -> the target sequence's output rows."""
        starts, counts = [s for s, _ in seqs], [n for _, n in seqs]
        query_starts = [sum(counts[:i]) for i in range(len(seqs))]
        q = torch.zeros(num_rows, *prompt.shape[1:], dtype=dtype, device=DEVICE)
        for (start, num), row in zip(seqs, query_starts, strict=True):
            q[row:row + num] = prompt[start:start + num]
        tiles = packed_prefill_tiles(starts, counts, max_prefill_tiles(num_rows, len(seqs)))

        def ints(values):
            return torch.tensor(values, dtype=torch.int32, device=DEVICE)

        meta = PackedPrefillMeta(ints(query_starts), ints(starts), ints(counts),
                                 table.reshape(1, -1).expand(len(seqs), -1).contiguous(), *map(ints, tiles))
        out = torch.zeros_like(q)
        packed_prefill_attention(q, k_cache, v_cache, meta, 0.088, out)
        row = query_starts[target]
        return out[row:row + counts[target]]

    alone = run([(37, 40)], 0, 96)
    assert torch.equal(run(others + [(37, 40)], 3, 96), alone)
    assert torch.equal(run([others[1], (37, 40), others[0]], 1, 128), alone)
    expected = prefill_reference(prompt[37:77], k_cache, v_cache, table, 37, 0.088)
    tolerance = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(alone.float(), expected, atol=tolerance, rtol=tolerance)


def test_packed_prefill_tiles_cover_every_query_tile_latest_band_first():
    """Each sequence's query tiles once (from the one its chunk starts in), in bands of positions with the latest
    band first, sequence by sequence within a band, each sequence's tiles latest first; then the padding."""
    from corun.packed_prefill import PREFILL_QUERY_TILE as TILE
    from corun.packed_prefill import PREFILL_TILE_BAND as BAND
    from corun.packed_prefill import packed_prefill_tiles

    starts, counts = [0, BAND - 2 * TILE + 5, 0, TILE], [BAND + TILE + 1, 2 * TILE, 0, 1]
    seqs, tile_starts = packed_prefill_tiles(starts, counts, 40)
    used = len(seqs) - seqs.count(-1)
    expected = {(0, t * TILE) for t in range(BAND // TILE + 2)} | {(1, BAND - 2 * TILE), (1, BAND - TILE),
                                                                   (1, BAND)} | {(3, TILE)}
    tiles = list(zip(seqs[:used], tile_starts[:used], strict=True))
    assert len(tiles) == len(expected) and set(tiles) == expected
    assert tiles == sorted(tiles, key=lambda tile: (-(tile[1] // BAND), tile[0], -tile[1]))
    assert tiles[:3] == [(0, BAND + TILE), (0, BAND), (1, BAND)]
    assert seqs[used:] == [-1] * (40 - used) and tile_starts[used:] == [0] * (40 - used)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_batch_invariant_row_kernels_are_row_invariant_and_close(dtype):
    """Linear, RMSNorm and log_softmax of batch_invariant mode: a row's bits do not depend on the row count."""
    from corun.kernels.batch_invariant import (
        batch_invariant_linear,
        batch_invariant_log_softmax,
        batch_invariant_rms_norm,
    )
    from corun.models.decoder import RMSNorm

    gen = torch.Generator(device=DEVICE).manual_seed(4)
    x = torch.randn(9, 96, generator=gen, device=DEVICE).to(dtype)
    w = (torch.randn(80, 96, generator=gen, device=DEVICE) / 10).to(dtype)
    norm = RMSNorm(96, 1e-6).to(DEVICE, dtype)
    logits = torch.randn(9, 300, generator=gen, device=DEVICE)
    cases = [(lambda a: batch_invariant_linear(a, w), lambda a: F.linear(a, w), x),
             (lambda a: batch_invariant_rms_norm(a, norm.weight, 1e-6), norm, x),
             (batch_invariant_log_softmax, lambda a: torch.log_softmax(a, -1), logits)]
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    for kernel, reference, inputs in cases:
        full = kernel(inputs)
        torch.testing.assert_close(full.float(), reference(inputs).float(), atol=tolerance, rtol=tolerance)
        for rows in (1, 2, 5):
            assert torch.equal(kernel(inputs[:rows])[0], full[0])


def test_fused_sampling_kernel_has_the_samplers_noise_and_choice():
    """The CUDA sampler's fused Gumbel-max: the same murmur3 bits as corun.sampler, the same tokens."""
    from corun.kernels.sampling import gumbel_argmax, noise_hash_triton
    from corun.sampler import gumbel_noise, noise_hash

    seeds = torch.tensor([0, 1, 42, 2**63 - 1, 123456789012345, 7], dtype=torch.int64, device=DEVICE)
    positions = torch.tensor([0, 5, 77, 2**32 - 1, 1000, 3], dtype=torch.int64, device=DEVICE)
    assert torch.equal(noise_hash_triton(seeds, positions, 3000), noise_hash(seeds, positions, 3000))
    logits = torch.randn(6, 3000, generator=torch.Generator(device=DEVICE).manual_seed(5), device=DEVICE)
    logits[5, 100:] = float("-inf")  # a row masked down to 100 tokens (top-k/top-p)
    expected = (logits + gumbel_noise(seeds, positions, 3000)).argmax(-1)
    chosen = gumbel_argmax(logits, seeds, positions)
    assert torch.equal(chosen, expected) and chosen[5] < 100
    for rows in (1, 3):  # one program per row: a row's choice does not depend on the others
        assert torch.equal(gumbel_argmax(logits[:rows], seeds[:rows], positions[:rows]), chosen[:rows])


def test_fused_sampling_split_over_vocab_chunks_gives_the_whole_rows_argmax(monkeypatch):
    """The vocab is cut into chunks, one program each: the first maximum still wins, ties across chunks too."""
    import corun.kernels.sampling as sampling
    from corun.sampler import gumbel_noise

    seeds = torch.arange(4, dtype=torch.int64, device=DEVICE) * 1000003
    positions = torch.tensor([3, 9, 27, 81], dtype=torch.int64, device=DEVICE)
    logits = torch.randn(4, 3000, generator=torch.Generator(device=DEVICE).manual_seed(9), device=DEVICE)
    logits[2, [1500, 2500]] = float("inf")  # a tie between chunks 1 and 2: index 1500 must win
    logits[3, 1024:] = float("-inf")  # chunks 1 and 2 hold nothing
    monkeypatch.setattr(sampling, "VOCAB_CHUNK", 1024)
    chosen = sampling.gumbel_argmax(logits, seeds, positions)
    assert torch.equal(chosen, (logits + gumbel_noise(seeds, positions, 3000)).argmax(-1))
    assert chosen[2] == 1500 and chosen[3] < 1024


@pytest.mark.parametrize(("shared_kib", "stages"), [(227, 2), (163, 2), (99, 1)])
def test_the_launch_pipelines_only_where_shared_memory_holds_two_stages(monkeypatch, shared_kib, stages):
    """H200/H100/A100 run the measured two stages; a GPU of ~100 KiB per block (Ada) one: stages never change bits."""
    from types import SimpleNamespace

    from corun.kernels import decode_attention

    monkeypatch.setattr(decode_attention.torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(shared_memory_per_block_optin=shared_kib * 1024))
    decode_attention.launch_for.cache_clear()
    try:
        launch = decode_attention.launch_for(torch.device("cuda", 0))
        assert launch.num_stages == stages
        assert (launch.tile_tokens, launch.num_warps) == (DECODE_TILE_TOKENS, decode_attention.DEFAULT_LAUNCH.num_warps)
        assert decode_attention.launch_for(torch.device("cpu")) == decode_attention.DEFAULT_LAUNCH
    finally:
        decode_attention.launch_for.cache_clear()
