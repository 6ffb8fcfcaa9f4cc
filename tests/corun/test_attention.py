"""Prompt attention's CUDA form (4-D, kv heads expanded, for the fused SDPA kernels) computes the CPU form's math."""

import pytest
import torch
import torch.nn.functional as F

from corun.attention import _fused_sdpa


@pytest.mark.parametrize("num_new,num_prior", [(7, 0), (5, 9), (1, 12)])  # first chunk, later chunk, decode
def test_cuda_sdpa_form_equals_the_gqa_form(num_new, num_prior):
    gen = torch.Generator().manual_seed(num_new * 100 + num_prior)
    context = num_new + num_prior
    q, k, v = (torch.randn(n, h, 16, generator=gen) for n, h in ((num_new, 8), (context, 2), (context, 2)))
    mask, causal = None, num_prior == 0
    if num_prior and num_new > 1:
        mask = torch.arange(context)[None, :] <= torch.arange(num_new)[:, None] + num_prior
    expected = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                              attn_mask=mask, is_causal=causal, scale=0.25, enable_gqa=True)
    torch.testing.assert_close(_fused_sdpa(q, k, v, mask, causal, 0.25), expected.transpose(0, 1),
                               atol=1e-6, rtol=1e-5)
