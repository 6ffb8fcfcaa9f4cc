"""The prefix cache on a GPU with the CUDA defaults a user gets (packed prefill at verified pack sizes, CUDA
graphs, verified decode step sizes): prompts served warm, batched, after eviction and after a reset give the bits
of the same engine with the cache off; the inverse: a hit served from decode-written KV changes bits."""

import random

import pytest
import torch

from corun import LLM
from tests.corun.test_prefix_cache import (
    CHUNK,
    WITH_PROMPT_LOGPROBS,
    assert_no_leak,
    generated_sequence_kv,
    outputs,
    plant_chunks,
    shared_prefix_prompts,
)

pytestmark = pytest.mark.gpu

GPU_ENGINE = dict(device="cuda", dtype="float32", prefill_chunk_size=CHUNK, max_model_len=256)


@pytest.fixture(scope="module")
def gpu_cold(tiny_model_dir):
    llm = LLM(tiny_model_dir, enable_prefix_caching=False, **GPU_ENGINE)
    prompts = shared_prefix_prompts()
    expected = outputs(llm, prompts)[0], outputs(llm, prompts, WITH_PROMPT_LOGPROBS)[0]
    together = outputs(llm, prompts, together=True)[0]
    return prompts, expected, together


def test_the_cuda_defaults_keep_the_cache_and_pack(tiny_model_dir):
    llm = LLM(tiny_model_dir, **GPU_ENGINE)
    assert llm.engine.block_manager.prefix_cache is not None
    assert llm.engine.runner.prefill_path.startswith("packed") and llm.engine.runner.decode_graph is not None


def test_warm_and_batched_prompts_are_bitwise_cold_on_the_gpu(tiny_model_dir, gpu_cold):
    prompts, (expected, expected_prompt_logprobs), expected_together = gpu_cold
    assert expected_together == expected, "cache off: alone vs batched already differ"
    llm = LLM(tiny_model_dir, **GPU_ENGINE)
    first, cached_first = outputs(llm, prompts)
    again, cached_again = outputs(llm, prompts)
    together, cached_together = outputs(llm, prompts, together=True)
    assert first == expected and again == expected and together == expected
    assert sum(cached_first) > 0 and cached_again == [CHUNK * ((len(p) - 1) // CHUNK) for p in prompts]
    outputs(llm, prompts, WITH_PROMPT_LOGPROBS)
    assert outputs(llm, prompts, WITH_PROMPT_LOGPROBS)[0] == expected_prompt_logprobs
    assert_no_leak(llm)


def test_after_eviction_and_a_reset_prompts_are_bitwise_cold_on_the_gpu(tiny_model_dir, gpu_cold):
    prompts, (expected, _), _ = gpu_cold
    llm = LLM(tiny_model_dir, num_blocks=13, **GPU_ENGINE)
    cache = llm.engine.block_manager.prefix_cache
    for _ in range(2):
        assert outputs(llm, prompts)[0] == expected
    assert cache.num_evicted_chunks > 0 and cache.num_hit_tokens > 0
    assert llm.reset_prefix_cache() > 0
    assert outputs(llm, prompts)[0] == expected
    assert_no_leak(llm)


def test_a_hit_from_decode_written_kv_changes_bits_on_the_gpu(tiny_model_dir):
    """Control: chunks planted from a cold prefill give the cold outputs; inverse: one chunk from decode steps."""
    llm = LLM(tiny_model_dir, enable_prefix_caching=False, **GPU_ENGINE)
    rng = random.Random(5)
    sequence, written = generated_sequence_kv(llm, [rng.randrange(2000) for _ in range(35)], 45)
    [expected], _ = outputs(llm, [sequence])
    writer = LLM(tiny_model_dir, **GPU_ENGINE)
    outputs(writer, [sequence])
    cold_kv = writer.engine.runner.kv_cache.data[planted_block_ids(writer, 4)].clone()

    def served_from(chunk_kv: torch.Tensor):
        reader = LLM(tiny_model_dir, **GPU_ENGINE)
        plant_chunks(reader, sequence, chunk_kv)
        [result], [cached] = outputs(reader, [sequence])
        assert cached == len(chunk_kv) * CHUNK
        return result

    assert served_from(cold_kv) == expected
    assert not torch.equal(written[3], cold_kv[3])
    assert served_from(torch.cat([cold_kv[:3], written[3:4]])) != expected


def planted_block_ids(llm: LLM, num_chunks: int) -> list[int]:
    """The KV blocks of the cache's first num_chunks chunks (one block per chunk at CHUNK = block size), in prompt
    order: the cache was filled by one prompt, so insertion order is prompt order."""
    chunks = list(llm.engine.block_manager.prefix_cache.chunks.values())[:num_chunks]
    return [block_id for chunk in chunks for block_id in chunk.block_ids]


