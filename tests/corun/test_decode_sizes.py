"""Decode steps at verified smaller row counts (decode_step_sizes) on CPU float32.

Which row counts give a GEMM row the bits of the N-row step is a fact of the CPU and its kernels (one AVX-512
host keeps 4, 8 and 12 of N = 16, an AMX host keeps none), so these tests assert the property wherever it runs:
every size the probe kept leaves every request's tokens and logprobs bitwise as at N, alone and batched, and the
steps really ran at those sizes; the inverse, a step forced to a size the probe rejects on this machine, changes
them. Where this machine gives no kept or no rejected size, that half is skipped, saying why.
"""

import dataclasses

import pytest

from corun import LLM, SamplingParams
from corun.decode_sizes import matches_full_step
from tests.conftest import varied_prompts
from tests.corun.test_determinism import completions, first_difference
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

pytestmark = pytest.mark.numerics

N = 16
CANDIDATES = (1, 2, 3, 4, 8, 12)
PARAMS = SamplingParams(temperature=0.7, top_p=0.9, seed=5, max_tokens=12, logprobs=3, ignore_eos=True)


def make_llm(model: str, sizes: tuple[int, ...]) -> LLM:
    return LLM.from_config(EngineConfig(model=model, num_threads=1, scheduler=SchedulerConfig(
        max_num_seqs=N, max_model_len=256, prefill_chunk_size=64, decode_step_sizes=sizes),
        cache=CacheConfig(num_blocks=400)))


def staggered_params(num: int) -> list[SamplingParams]:
    """Requests that finish one step apart, so a batch shrinks through every row count from num down to 1."""
    return [dataclasses.replace(PARAMS, max_tokens=2 + i) for i in range(num)]


@pytest.fixture(scope="module")
def laddered(tiny_model_dir):
    return make_llm(tiny_model_dir, CANDIDATES)


def test_the_probe_keeps_exactly_the_candidates_that_match_the_full_step(laddered):
    runner = laddered.engine.runner
    assert runner.decode_sizes[-1] == N
    assert runner.decode_sizes[:-1] == [size for size in CANDIDATES if matches_full_step(runner, size)]


def test_steps_at_kept_sizes_keep_every_output_bitwise(tiny_model_dir, laddered):
    kept_below_n = laddered.engine.runner.decode_sizes[:-1]
    if not kept_below_n:
        pytest.skip(f"no candidate {CANDIDATES} matched the N-row step on this CPU: every step runs at N rows")
    prompts = varied_prompts(14, seed=11, max_words=50)
    params = staggered_params(len(prompts))
    fixed = completions(make_llm(tiny_model_dir, ()).generate(prompts, params))
    alone = [completions(laddered.generate([p], [q]))[0] for p, q in zip(prompts[:4], params[:4], strict=True)]
    together = completions(laddered.generate(prompts, params))
    assert first_difference(fixed, together) is None
    assert first_difference(fixed[:4], alone) is None
    # NOTE: without this the comparisons could pass with every step at N rows
    rows_run = laddered.engine.runner.decode_rows_histogram
    assert all(rows_run.get(size, 0) > 0 for size in kept_below_n), rows_run


def test_inverse_a_size_the_probe_rejects_changes_the_bits(tiny_model_dir):
    """Proves the comparison above can fail here: requests stepped at a rejected size instead of N differ."""
    llm = make_llm(tiny_model_dir, ())
    runner = llm.engine.runner
    rejected = [size for size in CANDIDATES if not matches_full_step(runner, size)]
    if not rejected:
        pytest.skip("every candidate matched the N-row step on this CPU: no unverified size to force")
    size = rejected[0]
    # NOTE: the probe rejects a size if either a full step or one request among padding differs: try both
    batches = [varied_prompts(size, seed=12), varied_prompts(1, seed=13)]
    fixed = [completions(llm.generate(prompts, PARAMS)) for prompts in batches]
    runner.decode_sizes = [size, N]
    forced = [completions(llm.generate(prompts, PARAMS)) for prompts in batches]
    assert runner.decode_rows_histogram.get(size, 0) > 0
    assert any(first_difference(a, b) is not None for a, b in zip(fixed, forced, strict=True)), \
        f"steps at the rejected size {size} gave the N-row step's bits"


def test_decode_step_sizes_are_validated():
    with pytest.raises(ValueError, match="decode_step_sizes"):
        SchedulerConfig(max_num_seqs=16, decode_step_sizes=(8, 4))
    with pytest.raises(ValueError, match="decode_step_sizes"):
        SchedulerConfig(max_num_seqs=16, decode_step_sizes=(16,))
