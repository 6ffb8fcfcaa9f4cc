"""The prefix cache in the engine (issue 25): a prompt served from cached full chunks gives bit for bit what its
cold prefill gives (token ids, logprobs, prompt logprobs), warm, after eviction and after a reset; no KV block
leaks; and the inverse: serving a hit from KV computed at another shape (decode steps, a partial last chunk)
changes bits, so the full-chunk rule is needed."""

import dataclasses
import random

import pytest
import torch

from corun import LLM, SamplingParams
from wire.config import CacheConfig, EngineConfig, SchedulerConfig
from wire.prefix_hash import chunk_hash_chain

CHUNK = 16
NUM_BLOCKS = 256
"""8 MiB of KV: every test's requests and cached chunks with room to spare (nothing evicted but where a test asks).
NOTE: the default budget's 512 MiB took each of the module's ~20 engines a third of a second to zero."""
# NOTE: N = 16 rows (the default 32), still more than any test runs at once: every decode step computes N rows, and
# most prompts here run alone
ENGINE = dict(prefill_chunk_size=CHUNK, max_model_len=256, num_threads=1, num_blocks=NUM_BLOCKS, max_num_seqs=16)
PARAMS = SamplingParams(temperature=0.8, seed=7, max_tokens=8, logprobs=3, ignore_eos=True)
WITH_PROMPT_LOGPROBS = SamplingParams(temperature=0.8, seed=7, max_tokens=8, logprobs=3, ignore_eos=True,
                                      prompt_logprobs=2)


def shared_prefix_prompts(seed: int = 0) -> list[list[int]]:
    """Two families of prompts sharing 48- and 40-token prefixes, suffixes of 1-30 tokens, and prompts of exactly
    whole chunks (whose last chunk must be recomputed)."""
    rng = random.Random(seed)
    families = [[rng.randrange(2000) for _ in range(48)], [rng.randrange(2000) for _ in range(40)]]
    prompts = []
    for i in range(8):
        prefix = families[i % 2]
        prompts.append(prefix + [rng.randrange(2000) for _ in range(rng.randint(1, 30))])
    prompts += [families[0] + [rng.randrange(2000) for _ in range(16)], families[0][:32]]
    return prompts


def outputs(llm: LLM, prompts, params=PARAMS, together: bool = False):
    """(token ids, logprobs, prompt logprobs) per prompt, each generated alone (or all at once), and the cached
    prompt tokens of each."""
    results = llm.generate(prompts, params) if together else [llm.generate([p], params)[0] for p in prompts]
    return ([(r.outputs[0].token_ids, r.outputs[0].logprobs, r.prompt_logprobs) for r in results],
            [r.num_cached_tokens for r in results])


def assert_no_leak(llm: LLM) -> None:
    """Every block is free or an unheld cached chunk's; none is private to a request."""
    blocks = llm.engine.block_manager
    cache = blocks.prefix_cache
    assert not blocks.allocated_block_ids
    assert all(chunk.num_holders == 0 for chunk in cache.chunks.values())
    assert blocks.num_free_blocks == blocks.num_usable_blocks
    assert len(blocks.free_block_ids) + cache.num_unheld_blocks == blocks.num_usable_blocks


@pytest.fixture(scope="module")
def cold(tiny_model_dir):
    llm = LLM(tiny_model_dir, enable_prefix_caching=False, **ENGINE)
    assert llm.engine.block_manager.prefix_cache is None
    prompts = shared_prefix_prompts()
    return prompts, outputs(llm, prompts)[0], outputs(llm, prompts, WITH_PROMPT_LOGPROBS)[0]


@pytest.mark.numerics
def test_warm_prompts_after_others_with_their_prefix_are_bitwise_cold(tiny_model_dir, cold):
    prompts, expected, _ = cold
    llm = LLM(tiny_model_dir, **ENGINE)
    cache = llm.engine.block_manager.prefix_cache
    first, cached_first = outputs(llm, prompts)
    again, cached_again = outputs(llm, prompts)
    assert cache.num_hit_tokens == sum(cached_first) + sum(cached_again)
    assert cache.num_queried_tokens == 2 * sum(len(p) for p in prompts)
    together, _ = outputs(llm, prompts, together=True)
    assert first == expected and again == expected and together == expected
    # NOTE: the first pass hits where an earlier prompt shared full chunks; every prompt hits on the second, capped
    # so that its last chunk is prefilled (a 64-token prompt: 48 cached, the 32-token one: 16)
    assert sum(cached_first) > 0 and cached_first[0] == 0
    assert cached_again == [CHUNK * ((len(p) - 1) // CHUNK) for p in prompts]
    assert_no_leak(llm)


@pytest.mark.numerics
def test_prompts_after_eviction_and_after_a_reset_are_bitwise_cold(tiny_model_dir, cold):
    prompts, expected, _ = cold
    # NOTE: 12 blocks: one request (<= 78 + 8 tokens: 6 blocks) and a few cached chunks at a time
    llm = LLM(tiny_model_dir, **{**ENGINE, "num_blocks": 13})
    cache = llm.engine.block_manager.prefix_cache
    for _ in range(2):
        assert outputs(llm, prompts)[0] == expected
    assert cache.num_evicted_chunks > 0 and cache.num_hit_tokens > 0
    assert_no_leak(llm)
    freed = llm.reset_prefix_cache()
    blocks = llm.engine.block_manager
    assert freed > 0 and not cache.chunks and len(blocks.free_block_ids) == blocks.num_usable_blocks
    after_reset, cached = outputs(llm, prompts)
    assert after_reset == expected and cached[0] == 0
    assert_no_leak(llm)


@pytest.mark.numerics
def test_prompt_logprobs_are_served_with_their_chunks_bitwise_cold(tiny_model_dir, cold):
    prompts, _, expected = cold
    llm = LLM(tiny_model_dir, **ENGINE)
    outputs(llm, prompts)  # NOTE: every full chunk cached, without prompt logprobs: none served to those asking them
    first, cached_first = outputs(llm, prompts, WITH_PROMPT_LOGPROBS)
    again, cached_again = outputs(llm, prompts, WITH_PROMPT_LOGPROBS)
    assert first == expected and again == expected
    assert all(lps is not None and len(lps) == len(p) for (_, _, lps), p in zip(again, prompts, strict=True))
    # NOTE: the first pass is served only what an earlier prompt asking the same left (the family's first prompt
    # nothing); on the second every prompt hits as far as its own chunks go
    assert cached_first[:2] == [0, 0] and sum(cached_first) > 0
    assert cached_again == [CHUNK * ((len(p) - 1) // CHUNK) for p in prompts]
    _, cached_other = outputs(llm, prompts[:1], dataclasses.replace(WITH_PROMPT_LOGPROBS, prompt_logprobs=1))
    assert cached_other == [0], "prompt logprobs kept for 2 alternatives were served to a request asking 1"
    assert_no_leak(llm)


@pytest.mark.numerics
def test_a_chunk_s_prompt_logprobs_are_served_only_before_the_same_next_token(tiny_model_dir):
    """The last row of a chunk predicts the prompt token after it: a prompt that differs there is served the chunks
    before only, and gets its own bits (the inverse: the stored entry's target token is another one)."""
    llm = LLM(tiny_model_dir, **ENGINE)
    base = list(range(300, 340))  # NOTE: 2 whole chunks, then 8 tokens
    other = base[:CHUNK * 2] + [7] + base[CHUNK * 2 + 1:]
    [stored] = llm.generate([base], WITH_PROMPT_LOGPROBS)
    [served] = llm.generate([other], WITH_PROMPT_LOGPROBS)
    cold = LLM(tiny_model_dir, enable_prefix_caching=False, **ENGINE)
    [expected] = cold.generate([other], WITH_PROMPT_LOGPROBS)
    assert served.num_cached_tokens == CHUNK and served.prompt_logprobs == expected.prompt_logprobs
    assert stored.prompt_logprobs[CHUNK * 2] != expected.prompt_logprobs[CHUNK * 2]
    assert_no_leak(llm)


def test_a_whole_cached_prompt_prefills_only_its_last_chunk(tiny_model_dir):
    llm = LLM(tiny_model_dir, **ENGINE)
    prompt = list(range(100, 164))  # NOTE: 4 whole chunks
    llm.generate([prompt], PARAMS)
    forwards = llm.engine.stats.num_prefill_forwards
    [warm] = llm.generate([prompt], PARAMS)
    assert warm.num_cached_tokens == 48 and llm.engine.stats.num_prefill_forwards == forwards + 1
    assert len(llm.engine.block_manager.prefix_cache.chunks) == 4  # NOTE: the recomputed last chunk's copy is freed
    assert_no_leak(llm)


def test_aborted_requests_and_n_samples_leak_no_block(tiny_model_dir):
    llm = LLM(tiny_model_dir, **ENGINE)
    engine = llm.engine
    prompt = list(range(300, 370))
    llm.generate([prompt], SamplingParams(n=3, max_tokens=4, seed=1))
    request = engine.add_request("aborted", prompt + [5, 6], PARAMS)
    engine.step()  # NOTE: admitted with 64 cached tokens, its last chunk prefilled
    waiting = engine.add_request("waiting", prompt[:40], PARAMS)
    engine.abort_request(request)
    engine.abort_request(waiting)
    half = engine.add_request("half", list(range(500, 560)), PARAMS)
    engine.step()  # NOTE: one chunk of four, cached as it completes
    engine.abort_request(half)
    assert not engine.has_unfinished() and len(engine.block_manager.prefix_cache.chunks) == 5
    assert_no_leak(llm)


def test_the_cache_is_off_where_mixed_steps_compute_kv(tiny_model_dir):
    llm = LLM(tiny_model_dir, mode="mixed", **ENGINE)
    assert llm.engine.block_manager.prefix_cache is None and not llm.engine.config.cache.enable_prefix_caching


# --- the inverse: a hit from KV computed at another shape changes bits ------------------------------------------
def generated_sequence_kv(llm: LLM, prompt: list[int], max_tokens: int):
    """(prompt + its greedy output, the KV the engine wrote for it: prefill chunks then decode steps) -> the KV of
    every block, [blocks, layers, 2, block, heads, dim]. NOTE: its blocks as they were before it ended: with a swap
    space (CUDA's default) a request gets blocks as its tokens need them, not all at admission."""
    engine = llm.engine
    request = engine.add_request("writer", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    block_ids: list[int] = []
    while engine.has_unfinished():
        engine.step()
        if len(request.block_ids) > len(block_ids):
            block_ids = list(request.block_ids)
    return prompt + request.output_token_ids, engine.runner.kv_cache.data[block_ids].clone()


def cold_prefill_kv(llm: LLM, prompt: list[int]):
    engine = llm.engine
    request = engine.add_request("cold-writer", prompt, SamplingParams(max_tokens=1))
    engine.step()
    block_ids = list(request.block_ids)
    while engine.has_unfinished():
        engine.step()
    return engine.runner.kv_cache.data[block_ids].clone()


def plant_chunks(llm: LLM, prompt: list[int], chunk_kv: torch.Tensor) -> None:
    """Cache chunk_kv (one block per chunk) as the KV of the prompt's first chunks, as if prefilled."""
    blocks = llm.engine.block_manager
    cache = blocks.prefix_cache
    keys = chunk_hash_chain(prompt, cache.chunk_size, cache.salt)
    block_ids = blocks.allocate(len(chunk_kv) * blocks.block_size)
    llm.engine.runner.kv_cache.data[block_ids] = chunk_kv
    for key, block_id in zip(keys, block_ids, strict=False):
        chunk = cache.insert(key, (block_id,))
        blocks.allocated_block_ids.discard(block_id)
        blocks.let_go([chunk])


def served_from(tiny_model_dir, prompt, chunk_kv):
    llm = LLM(tiny_model_dir, **ENGINE)
    plant_chunks(llm, prompt, chunk_kv)
    [result], [cached] = outputs(llm, [prompt])
    assert cached == len(chunk_kv) * CHUNK
    return result


@pytest.fixture(scope="module")
def written_at_other_shapes(tiny_model_dir):
    """A 35-token prompt generated 45 tokens: its 80-token sequence's KV as the engine wrote it (block 2: a partial
    last chunk, 3 rows, then decode steps; block 3: decode steps), the same sequence's KV prefilled cold, and that
    sequence's cold outputs."""
    llm = LLM(tiny_model_dir, enable_prefix_caching=False, **ENGINE)
    rng = random.Random(5)
    sequence, written = generated_sequence_kv(llm, [rng.randrange(2000) for _ in range(35)], 45)
    cold_kv = cold_prefill_kv(llm, sequence)
    [expected], _ = outputs(llm, [sequence])
    return sequence, written, cold_kv, expected


@pytest.mark.numerics
def test_serving_decode_written_kv_as_a_hit_changes_bits(tiny_model_dir, written_at_other_shapes):
    sequence, written, cold_kv, expected = written_at_other_shapes
    # NOTE: the control: chunks planted from a cold prefill give the cold outputs, so planting is exact
    assert served_from(tiny_model_dir, sequence, cold_kv[:4]) == expected
    assert not torch.equal(written[3], cold_kv[3])
    decode_written = torch.cat([cold_kv[:3], written[3:4]])  # NOTE: chunk 3 (positions 48-63) from decode steps
    assert served_from(tiny_model_dir, sequence, decode_written) != expected


@pytest.mark.numerics
@pytest.mark.mkl_default_mode  # NOTE: the engine's strict MKL mode keeps rows from the row count on this CPU
def test_serving_partial_chunk_kv_as_a_hit_changes_bits(tiny_model_dir, written_at_other_shapes):
    """NOTE: measured: an 8-row partial chunk's KV equals the 16-row chunk's under ATen's default kernels with MKL's
    SSE4.2 ones (MKL_CBWR=AUTO) and differs on AVX-512; a 3-row one differs under both, so this one is 3 rows."""
    sequence, written, cold_kv, expected = written_at_other_shapes
    partial = cold_kv[:3].clone()
    partial[2, :, :, :3] = written[2, :, :, :3]  # NOTE: positions 32-34, prefilled as a 3-token last chunk
    assert not torch.equal(partial[2], cold_kv[2])
    assert served_from(tiny_model_dir, sequence, partial) != expected


@pytest.mark.numerics
def test_packed_prefill_serves_hits_bitwise_cold(tiny_model_dir):
    """Packed prefill (the CUDA default): a prompt's chunks after its cached prefix are packed with other prompts'
    chunks, and must give the bits of the same engine with the cache off."""
    prompts = shared_prefix_prompts()
    expected, _ = outputs(packed(tiny_model_dir, False), prompts, together=True)
    llm = packed(tiny_model_dir, True)
    first, _ = outputs(llm, prompts, together=True)
    again, cached_again = outputs(llm, prompts, together=True)
    assert llm.engine.runner.prefill_path.startswith("packed") and llm.engine.stats.max_prefill_batch > 1
    assert first == expected and again == expected
    assert cached_again == [CHUNK * ((len(p) - 1) // CHUNK) for p in prompts]
    assert_no_leak(llm)


@pytest.mark.numerics
def test_prompts_arriving_together_wait_for_a_shared_chunk_in_flight(tiny_model_dir):
    """lm-eval's multiple-choice shape: 4 continuations of one context sent at once. The first computes the
    context's chunks; the others wait for each and are served it from the cache, while a prompt sharing nothing
    is packed beside the first. Outputs stay those of the cache off."""
    context = list(range(400, 450))  # NOTE: 3 whole chunks, then 2 tokens
    prompts = [context + [7 + i, 8 + i] for i in range(4)] + [list(range(600, 620))]
    expected, _ = outputs(packed(tiny_model_dir, False), prompts, together=True)
    llm = packed(tiny_model_dir, True)
    served, cached = outputs(llm, prompts, together=True)
    assert served == expected
    assert cached == [0, 3 * CHUNK, 3 * CHUNK, 3 * CHUNK, 0]
    assert_no_leak(llm)


@pytest.mark.numerics
@pytest.mark.parametrize("params", [PARAMS, WITH_PROMPT_LOGPROBS], ids=["plain", "prompt_logprobs"])
def test_continuations_prefill_in_the_forward_that_completes_their_context(tiny_model_dir, params):
    """The full chunks a forward completes are cached as it is packed, so continuations waiting for their context's
    last chunk are packed into the forward that computes it, reading the K and V it writes: their first tokens come
    a forward earlier, and bit for bit those of the cache off. The inverse of the timing: a continuation asking
    prompt logprobs still waits a forward (they are kept with a chunk once its forward ends), and is then served
    them with the chunk."""
    context = list(range(400, 450))  # NOTE: 3 whole chunks, then 2 tokens
    prompts = [context + [7 + i, 8 + i] for i in range(4)]
    expected, _ = outputs(packed(tiny_model_dir, False), prompts, params, together=True)
    llm = packed(tiny_model_dir, True)
    engine = llm.engine
    first_token_step = {}
    for i, prompt in enumerate(prompts):
        engine.add_request(f"choice-{i}", prompt, params)
    step = 0
    while engine.has_unfinished():
        step += 1
        for item in engine.step():
            first_token_step.setdefault(item.request.request_id, step)
    context_done = engine.stats.num_prefill_forwards - 1  # NOTE: the first choice's last forward is its own tail's
    later = [first_token_step[f"choice-{i}"] for i in range(1, 4)]
    if params.prompt_logprobs is None:
        assert later == [context_done] * 3
    else:
        assert later == [context_done + 1] * 3
    served, cached = outputs(llm, prompts, params, together=True)
    assert served == expected and cached == [3 * CHUNK] * 3 + [3 * CHUNK]
    assert_no_leak(llm)


def packed(model: str, enable_prefix_caching: bool) -> LLM:
    """Packed prefill (the CUDA default): up to 4 prompts' chunks in one 64-row forward."""
    return LLM.from_config(EngineConfig(model=model, num_threads=1, scheduler=SchedulerConfig(
        max_model_len=256, prefill_chunk_size=CHUNK, prefill_pack_tokens=64, prefill_pack_seqs=4),
        cache=CacheConfig(num_blocks=NUM_BLOCKS, enable_prefix_caching=enable_prefix_caching)))
