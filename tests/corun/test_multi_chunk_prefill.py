"""A prompt that runs several of its chunks in one packed forward (SchedulerConfig.multi_chunk_prefill) on CPU
float32.

The runner allows it only through the packed prefill kernel (CUDA's path; here in Triton's interpreter), whose order
for a token is set by its position, and where its start-up probe agrees. On that kernel every request's tokens,
logprobs and prompt logprobs are bitwise those of one chunk per forward, alone, batched and served from the prefix
cache, and long prompts really take fewer forwards. The inverse shows why the rule names the kernel: forced on the
per-chunk SDPA path (CPU's), a prompt's chunks in one forward change some prompt's bits on this machine.

NOTE: on the tiny model's two-layer variant: every prompt forward here runs in Triton's interpreter, seconds a layer.
"""

import pytest

from corun import LLM, SamplingParams
from corun.chunk_invariance import several_chunks_match
from corun.joined_steps import verified_joined_shapes
from tests.corun.test_determinism import completions, first_difference
from tests.corun.test_prefix_cache import shared_prefix_prompts
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

CHUNK, T = 16, 96
PARAMS = SamplingParams(temperature=0.8, seed=7, max_tokens=6, logprobs=3, ignore_eos=True)
WITH_PROMPT_LOGPROBS = SamplingParams(temperature=0.8, seed=7, max_tokens=4, logprobs=3, ignore_eos=True,
                                      prompt_logprobs=2)


def make_llm(model: str, multi_chunk: bool, caching: bool = False) -> LLM:
    return LLM.from_config(EngineConfig(model=model, num_threads=1, scheduler=SchedulerConfig(
        max_num_seqs=8, max_model_len=256, prefill_chunk_size=CHUNK, prefill_pack_tokens=T, prefill_pack_seqs=4,
        multi_chunk_prefill=multi_chunk), cache=CacheConfig(num_blocks=600, enable_prefix_caching=caching)))


def on_the_kernel(llm: LLM, multi_chunk: bool, probed: LLM | None = None) -> LLM:
    """Prompt attention through the packed Triton kernel (as on CUDA), then the start-up rule applied again.
    probed: an engine of the same model and scheduler already on the kernel, whose probes' answers are taken."""
    runner = llm.engine.runner
    runner.packed_prefill_kernel = True
    if probed is None:
        runner.multi_chunk_prefill = multi_chunk and several_chunks_match(runner)
        runner.joined_shapes = verified_joined_shapes(runner)  # NOTE: prefill forwards carry decode steps here too
    else:
        # NOTE: the probes run forwards of the model at the runner's pack and decode sizes, which the prefix cache
        # leaves as they are; in Triton's interpreter they cost seconds
        runner.multi_chunk_prefill = multi_chunk and probed.engine.runner.multi_chunk_prefill
        runner.joined_shapes = set(probed.engine.runner.joined_shapes)
    llm.engine.scheduler.multi_chunk_prefill = runner.multi_chunk_prefill
    llm.engine.scheduler.decode_rides_prefill = runner.decode_rides_prefill
    return llm


@pytest.fixture(scope="module")
def multi(two_layer_tiny_model_dir):
    return on_the_kernel(make_llm(two_layer_tiny_model_dir, multi_chunk=True), multi_chunk=True)


@pytest.fixture(scope="module")
def one_chunk(two_layer_tiny_model_dir):
    return on_the_kernel(make_llm(two_layer_tiny_model_dir, multi_chunk=False), multi_chunk=False)


@pytest.fixture(scope="module")
def one_chunk_reference(one_chunk):
    """-> (prompts, their completions at one chunk per forward, the prefill forwards that took). NOTE: one run
    shared by the tests that compare against it: at one chunk per forward in Triton's interpreter, it costs seconds."""
    prompts = shared_prefix_prompts(seed=3)  # NOTE: 32-78 tokens: 2-5 chunks each
    forwards_before = one_chunk.engine.stats.num_prefill_forwards
    expected = completions(one_chunk.generate(prompts, PARAMS))
    return prompts, expected, one_chunk.engine.stats.num_prefill_forwards - forwards_before


def test_only_the_packed_kernel_with_the_probe_agreeing_runs_several_chunks(two_layer_tiny_model_dir, multi, one_chunk):
    sdpa = make_llm(two_layer_tiny_model_dir, multi_chunk=True)
    assert not sdpa.engine.runner.multi_chunk_prefill and not sdpa.engine.scheduler.multi_chunk_prefill
    assert multi.engine.runner.multi_chunk_prefill == several_chunks_match(multi.engine.runner)
    assert multi.engine.scheduler.multi_chunk_prefill == multi.engine.runner.multi_chunk_prefill
    assert not one_chunk.engine.scheduler.multi_chunk_prefill


def test_several_chunks_in_one_forward_keep_every_output_bitwise(multi, one_chunk_reference):
    if not multi.engine.runner.multi_chunk_prefill:
        pytest.skip("the probe found other bits in one forward on this CPU: every forward runs one chunk per prompt")
    prompts, expected, one_chunk_forwards = one_chunk_reference
    forwards_before = multi.engine.stats.num_prefill_forwards
    together = completions(multi.generate(prompts, PARAMS))
    forwards = (multi.engine.stats.num_prefill_forwards - forwards_before, one_chunk_forwards)
    alone = [completions(multi.generate([p], PARAMS))[0] for p in prompts[:3]]
    assert first_difference(expected, together) is None
    assert first_difference(expected[:3], alone) is None
    assert forwards[0] < forwards[1], f"prefill forwards {forwards}: the chunks did not share forwards"


def test_prompt_logprobs_and_prefix_cache_hits_keep_their_bits(two_layer_tiny_model_dir, multi, one_chunk,
                                                                one_chunk_reference):
    if not multi.engine.runner.multi_chunk_prefill:
        pytest.skip("the probe found other bits in one forward on this CPU: every forward runs one chunk per prompt")
    prompts = shared_prefix_prompts(seed=4)
    expected = [(o.outputs[0].token_ids, o.outputs[0].logprobs, o.prompt_logprobs)
                for o in one_chunk.generate(prompts, WITH_PROMPT_LOGPROBS)]
    got = [(o.outputs[0].token_ids, o.outputs[0].logprobs, o.prompt_logprobs)
           for o in multi.generate(prompts, WITH_PROMPT_LOGPROBS)]
    assert got == expected
    cached = on_the_kernel(make_llm(two_layer_tiny_model_dir, multi_chunk=True, caching=True), multi_chunk=True,
                           probed=multi)
    cache_prompts, cold, _ = one_chunk_reference
    warm = [cached.generate([p], PARAMS)[0] for p in cache_prompts]  # NOTE: later prompts hit their family's chunks
    assert first_difference(cold, completions(warm)) is None
    assert sum(o.num_cached_tokens for o in warm) > 0


@pytest.mark.numerics  # NOTE: the kernel tests above run in Triton's interpreter (numpy's rounding): not marked
def test_inverse_several_chunks_on_the_per_chunk_sdpa_path_change_the_bits(two_layer_tiny_model_dir):
    """Proves the comparison can fail here, and why the rule names the kernel: on CPU's per-chunk SDPA path (the
    kernel chosen by the query count and the mask), a prompt's chunks in one forward change some prompt's bits."""
    prompts = shared_prefix_prompts(seed=3)
    expected = completions(make_llm(two_layer_tiny_model_dir, multi_chunk=False).generate(prompts, PARAMS))
    forced = make_llm(two_layer_tiny_model_dir, multi_chunk=False)
    forced.engine.runner.multi_chunk_prefill = forced.engine.scheduler.multi_chunk_prefill = True
    got = completions(forced.generate(prompts, PARAMS))
    if first_difference(expected, got) is None:
        pytest.skip("per-chunk SDPA gave the same bits in one forward on this CPU: nothing to show")
    assert first_difference(expected, got) is not None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_the_gpu_several_chunks_per_forward_keep_every_output_bitwise(dtype):
    """The CUDA defaults (packed prefill through the kernel, in graphs): prompts of several chunks, with and without
    the prefix cache and with prompt logprobs, against one chunk per forward."""
    import torch

    def make(multi_chunk: bool, caching: bool = False) -> LLM:
        sched = SchedulerConfig(max_num_seqs=16, max_model_len=1024, prefill_chunk_size=64, max_num_batched_tokens=512,
                                prefill_pack_seqs=4, multi_chunk_prefill=multi_chunk)
        return LLM.from_config(EngineConfig(model="random:qwen3-tiny", dtype=dtype, device="cuda", scheduler=sched,
                                            cache=CacheConfig(num_blocks=2048, enable_prefix_caching=caching)))

    gen = torch.Generator().manual_seed(5)
    shared = torch.randint(0, 2000, (200,), generator=gen).tolist()
    batch = [torch.randint(0, 2000, (n,), generator=gen).tolist() for n in (3, 65, 130, 300, 700)]
    batch += [shared + torch.randint(0, 2000, (n,), generator=gen).tolist() for n in (10, 70, 150)]
    multi = make(multi_chunk=True)
    if not multi.engine.runner.multi_chunk_prefill:
        pytest.skip(f"the chunk-invariance probe found other bits in one forward on this GPU in {dtype}")
    one = make(multi_chunk=False)
    before = (multi.engine.stats.num_prefill_forwards, one.engine.stats.num_prefill_forwards)
    expected = completions(one.generate(batch, PARAMS))
    together = completions(multi.generate(batch, PARAMS))
    forwards = (multi.engine.stats.num_prefill_forwards - before[0], one.engine.stats.num_prefill_forwards - before[1])
    assert first_difference(expected, together) is None
    assert first_difference(expected[-3:], [completions(multi.generate([p], PARAMS))[0] for p in batch[-3:]]) is None
    with_prompt_logprobs = [[(o.outputs[0].token_ids, o.outputs[0].logprobs, o.prompt_logprobs)
                             for o in llm.generate(batch, WITH_PROMPT_LOGPROBS)] for llm in (one, multi)]
    assert with_prompt_logprobs[1] == with_prompt_logprobs[0]  # NOTE: computed chunk by chunk in either case
    cached = make(multi_chunk=True, caching=True)
    warm = [cached.generate([p], PARAMS)[0] for p in batch]
    assert first_difference(expected, completions(warm)) is None
    assert sum(o.num_cached_tokens for o in warm) > 0
    assert forwards[0] < forwards[1], f"prefill forwards {forwards}: the chunks did not share forwards"
