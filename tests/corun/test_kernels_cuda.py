"""Triton kernels against references, and their (in)variance, on CUDA only (skipped on CPU hosts and in CI)."""

import pytest
import torch
import torch.nn.functional as F

from corun.attention import fixed_window_decode_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def paged_case(num_rows: int, dtype, seed: int = 0, num_heads: int = 32, num_kv_heads: int = 8, head_dim: int = 128,
               block_size: int = 16, window_blocks: int = 64):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    num_blocks = num_rows * window_blocks + 1
    kv = torch.randn(num_blocks, 2, 2, block_size, num_kv_heads, head_dim, generator=gen, device="cuda").to(dtype)
    k_cache, v_cache = kv[:, 1, 0], kv[:, 1, 1]  # NOTE: strided per-layer views, as in PagedKVCache
    q = torch.randn(num_rows, num_heads, head_dim, generator=gen, device="cuda").to(dtype)
    tables = torch.randperm(num_blocks - 1, generator=gen, device="cuda")[: num_rows * window_blocks] + 1
    tables = tables.view(num_rows, window_blocks)
    lens = torch.randint(1, window_blocks * block_size, (num_rows,), generator=gen, device="cuda")
    return q, k_cache, v_cache, tables, lens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_paged_decode_matches_reference(dtype, num_splits):
    from corun.kernels.decode_attention import paged_decode_attention

    q, k_cache, v_cache, tables, lens = paged_case(12, dtype)
    ours = paged_decode_attention(q, k_cache, v_cache, tables, lens, 128 ** -0.5, num_splits)
    reference = fixed_window_decode_attention(q.float(), k_cache.float(), v_cache.float(), tables, lens, 128 ** -0.5)
    tolerance = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours.float(), reference, atol=tolerance, rtol=tolerance)


def test_no_split_decode_is_batch_invariant_and_split_kv_is_not():
    from corun.kernels.decode_attention import paged_decode_attention, split_kv_heuristic

    q, k_cache, v_cache, tables, lens = paged_case(64, torch.bfloat16, seed=1)
    scale = 128 ** -0.5
    alone = paged_decode_attention(q[:1], k_cache, v_cache, tables[:1], lens[:1], scale, 1)
    batched = paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, 1)
    assert torch.equal(alone[0], batched[0])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    split_alone = paged_decode_attention(q[:1], k_cache, v_cache, tables[:1], lens[:1], scale,
                                         split_kv_heuristic(1, 8, sms))
    split_batched = paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, split_kv_heuristic(64, 8, sms))
    assert not torch.equal(split_alone[0], split_batched[0])  # the standard path's batch dependence


def test_batch_invariant_linear_matches_and_is_invariant_where_cublas_is_not():
    from corun.kernels.batch_invariant import batch_invariant_linear

    gen = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(256, 4096, generator=gen, device="cuda").to(torch.bfloat16)
    w = torch.randn(4096, 4096, generator=gen, device="cuda").to(torch.bfloat16) / 64
    torch.testing.assert_close(batch_invariant_linear(x, w).float(), F.linear(x, w).float(), atol=5e-2, rtol=2e-2)
    for rows in (1, 3, 64, 128, 256):
        assert torch.equal(batch_invariant_linear(x[:rows], w)[0], batch_invariant_linear(x, w)[0])
    assert any(not torch.equal(F.linear(x[:rows], w)[0], F.linear(x[:1], w)[0]) for rows in (64, 128, 256))


def test_token_wise_prefill_is_chunking_invariant():
    """batch_invariant mode's prefill attention: a token's output is the same however its prompt is chunked."""
    from corun.attention import RequestSegment, token_wise_attention

    q, k_cache, v_cache, tables, _ = paged_case(1, torch.bfloat16, seed=3, window_blocks=8)
    prompt = torch.randn(100, 32, 128, device="cuda").to(torch.bfloat16)
    whole = token_wise_attention(prompt, k_cache, v_cache, RequestSegment(0, 100, 100, tables[0]), 0.088)
    tail = token_wise_attention(prompt[60:], k_cache, v_cache, RequestSegment(0, 40, 100, tables[0]), 0.088)
    assert torch.equal(whole[60:], tail)
