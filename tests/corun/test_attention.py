"""Prompt attention: the causal rule a later chunk needs (query i of n sees keys 0 .. context - n + i), on CPU
(SDPA with the mask it implies) and on CUDA (FlashAttention, whose causal mask is aligned at the last key), and
mixed mode's varlen form (every chunk of a step in one launch, keys gathered from the cache), whose CPU reference
must give each chunk exactly what its own call gives.
"""

import pytest
import torch

from corun.attention import causal_attention, request_attention, varlen_prompt_attention
from corun.block_manager import BlockManager
from corun.request import Request
from corun.scheduler import PrefillChunk
from corun.step_inputs import build_step, varlen_prompt_meta
from wire.sampling_params import SamplingParams

CASES = [(7, 0), (5, 9), (1, 12), (300, 700)]  # first chunk, later chunk, decode token, long later chunk
BLOCK_SIZE, KV_HEADS, HEADS, HEAD_DIM = 4, 2, 8, 16


def reference(q, keys, values, scale):
    """The rule written out: float64 scores, -inf where a key lies after the query's position."""
    num_new, context = q.shape[0], keys.shape[0]
    group = q.shape[1] // keys.shape[1]
    keys, values = (t.double().repeat_interleave(group, dim=1) for t in (keys, values))
    scores = torch.einsum("qhd,khd->hqk", q.double(), keys) * scale
    visible = torch.arange(context)[None, :] <= torch.arange(num_new)[:, None] + (context - num_new)
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, values)


def random_qkv(num_new, num_prior, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(num_new * 100 + num_prior)
    context = num_new + num_prior
    return [torch.randn(n, h, HEAD_DIM, generator=gen).to(device, dtype)
            for n, h in ((num_new, HEADS), (context, KV_HEADS), (context, KV_HEADS))]


@pytest.mark.parametrize("num_new,num_prior", CASES)
def test_cpu_causal_attention_follows_the_rule(num_new, num_prior):
    q, k, v = random_qkv(num_new, num_prior)
    torch.testing.assert_close(causal_attention(q, k, v, 0.25).double(), reference(q, k, v, 0.25),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("num_new,num_prior", CASES)
def test_cuda_causal_attention_follows_the_rule(num_new, num_prior):
    q, k, v = random_qkv(num_new, num_prior, torch.bfloat16, "cuda")
    out = causal_attention(q, k, v, 0.25)
    expected = reference(q.cpu(), k.cpu(), v.cpu(), 0.25)
    torch.testing.assert_close(out.cpu().double(), expected, atol=2e-2, rtol=2e-2)
    # NOTE: inverse: the top-left rule (query i sees keys 0 .. i) is a different answer for a later chunk
    if num_prior and num_new > 1:
        top_left = reference(q.cpu(), k.cpu()[:num_new], v.cpu()[:num_new], 0.25)
        assert (out.cpu().double() - top_left).abs().max() > 0.1


def cache_and_chunks(dtype=torch.float32, device="cpu"):
    """A paged cache filled at random and three chunks over it: a first chunk, a later one, a one-token one."""
    gen = torch.Generator().manual_seed(3)
    num_blocks, num_layers = 64, 3
    # NOTE: block-major, as corun/kv_cache.py lays it out: each layer's K and V are strided views
    data = torch.randn(num_blocks, num_layers, 2, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    k_cache, v_cache = data[:, 1, 0], data[:, 1, 1]
    blocks = BlockManager(num_blocks, BLOCK_SIZE)
    params = SamplingParams(max_tokens=4)

    def chunk(name, prompt_len, start, count):
        request = Request(name, list(range(prompt_len)), params, 0, frozenset())
        request.block_ids = blocks.allocate(request.max_num_tokens)
        return PrefillChunk(request, start, count)

    chunks = [chunk("a", 13, 0, 13), chunk("b", 40, 17, 23), chunk("c", 9, 8, 1)]
    num_rows = sum(c.num_tokens for c in chunks)
    q = torch.randn(num_rows, HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    return q, k_cache, v_cache, chunks


def per_chunk(q, k_cache, v_cache, chunks):
    step = build_step([], 0, chunks, BLOCK_SIZE, q.device)
    out = torch.empty_like(q)
    for seg in step.meta.segments:
        rows = slice(seg.query_start, seg.query_start + seg.num_query_tokens)
        # NOTE: this step's k, v are in the cache already: read them back as the engine would have written them
        keys = k_cache[seg.block_table].flatten(0, 1)[seg.context_len - seg.num_query_tokens:seg.context_len]
        values = v_cache[seg.block_table].flatten(0, 1)[seg.context_len - seg.num_query_tokens:seg.context_len]
        out[rows] = request_attention(q[rows], keys, values, k_cache, v_cache, seg, 0.25)
    return out


def test_varlen_reference_gives_each_chunk_its_own_calls_bits():
    q, k_cache, v_cache, chunks = cache_and_chunks()
    prompts = varlen_prompt_meta(chunks, 0, BLOCK_SIZE)
    assert prompts.query_starts.tolist() == [0, 13, 36, 37]
    assert prompts.key_starts.tolist() == [0, 13, 53, 62]
    assert (prompts.max_query_len, prompts.max_context_len) == (23, 40)
    expected = per_chunk(q, k_cache, v_cache, chunks)
    assert torch.equal(varlen_prompt_attention(q, k_cache, v_cache, prompts, 0.25), expected)
    # NOTE: inverse: keys read one block off give other values, so the comparison can fail
    prompts.key_blocks = (prompts.key_blocks + 1) % k_cache.shape[0]
    assert not torch.equal(varlen_prompt_attention(q, k_cache, v_cache, prompts, 0.25), expected)


@pytest.mark.gpu
def test_cuda_varlen_launch_matches_each_chunk_alone():
    q, k_cache, v_cache, chunks = cache_and_chunks(torch.bfloat16, "cuda")
    prompts = varlen_prompt_meta(chunks, 0, BLOCK_SIZE).to("cuda")
    out = varlen_prompt_attention(q, k_cache, v_cache, prompts, 0.25)
    torch.testing.assert_close(out, per_chunk(q, k_cache, v_cache, chunks), atol=2e-2, rtol=2e-2)


def test_a_standard_engine_with_varlen_prompts_generates_the_per_chunk_bits(tiny_model_dir, monkeypatch):
    """mixed mode's steps with every chunk in one varlen call (its CPU reference) give exactly what one call
    per chunk gives: the varlen bookkeeping (rows, key slots across decode rows and later chunks) loses nothing."""
    from corun import LLM
    from tests.conftest import varied_prompts

    params = SamplingParams(temperature=0.6, seed=42, max_tokens=12, logprobs=3, ignore_eos=True)
    llm = LLM(tiny_model_dir, mode="mixed", max_num_seqs=8, max_model_len=512, prefill_chunk_size=64,
              max_num_batched_tokens=96)
    llm.engine.runner.batched_decode_rows = True  # NOTE: the CUDA path's step building, torch kernels

    def run():
        outputs = llm.generate(varied_prompts(8, seed=5), params)
        return [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs]) for o in outputs]

    per_chunk_outputs = run()
    import corun.attention

    calls = []
    monkeypatch.setattr(corun.attention, "varlen_prompt_attention",
                        lambda *args: calls.append(args[3].max_context_len) or varlen_prompt_attention(*args))
    llm.engine.runner.varlen_prompt_kernel = True
    assert run() == per_chunk_outputs
    assert len(calls) > 0 and max(calls) > 64  # NOTE: later chunks (prompts longer than a chunk) went through it
