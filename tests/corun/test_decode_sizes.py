"""Decode steps at verified smaller row counts (decode_step_sizes) on CPU float32.

On this CPU a float32 GEMM row has one set of bits for 1 row, another for 2-3 rows and a third for every count
>= 4 (measured; tests/corun/test_padded_prefill.py relies on the same fact), so the probe must keep 4, 8, 12 of
N = 16 and drop 1-3; steps at the kept sizes leave every request's tokens and logprobs bitwise as at N, and the
inverse, a step allowed to run at an unverified size, changes them.
"""

import pytest

from corun import LLM, SamplingParams
from corun.config import CacheConfig, EngineConfig, SchedulerConfig
from corun.decode_sizes import matches_full_step
from tests.conftest import varied_prompts
from tests.corun.test_determinism import completions, first_difference

N = 16
PARAMS = SamplingParams(temperature=0.7, top_p=0.9, seed=5, max_tokens=12, logprobs=3, ignore_eos=True)


def make_llm(model: str, sizes: tuple[int, ...]) -> LLM:
    return LLM.from_config(EngineConfig(model=model, num_threads=1, scheduler=SchedulerConfig(
        max_num_seqs=N, max_model_len=256, prefill_chunk_size=64, decode_step_sizes=sizes),
        cache=CacheConfig(num_blocks=400)))


@pytest.fixture(scope="module")
def laddered(tiny_model_dir):
    return make_llm(tiny_model_dir, (1, 2, 3, 4, 8, 12))


def test_probe_keeps_only_sizes_with_the_full_steps_bits(laddered):
    runner = laddered.engine.runner
    assert runner.decode_sizes == [4, 8, 12, N]
    assert not matches_full_step(runner, 2) and matches_full_step(runner, 8)


def test_steps_at_verified_sizes_keep_every_output_bitwise(tiny_model_dir, laddered):
    prompts = varied_prompts(14, seed=11, max_words=50)
    fixed = completions(make_llm(tiny_model_dir, ()).generate(prompts, PARAMS))
    alone = [completions(laddered.generate([p], PARAMS))[0] for p in prompts[:4]]
    together = completions(laddered.generate(prompts, PARAMS))
    assert first_difference(fixed, together) is None
    assert first_difference(fixed[:4], alone) is None
    histogram = laddered.engine.runner.decode_rows_histogram
    assert histogram.get(4, 0) > 0 and histogram.get(N, 0) > 0  # NOTE: steps really ran at several sizes


def test_inverse_an_unverified_size_changes_the_bits(tiny_model_dir):
    """Proves the comparison above can fail here: a lone request stepped at 2 rows instead of 16 differs."""
    llm = make_llm(tiny_model_dir, ())
    prompt = varied_prompts(1, seed=12)
    fixed = completions(llm.generate(prompt, PARAMS))
    llm.engine.runner.decode_sizes = [2, N]
    assert first_difference(fixed, completions(llm.generate(prompt, PARAMS))) is not None


def test_decode_step_sizes_are_validated():
    with pytest.raises(ValueError, match="decode_step_sizes"):
        SchedulerConfig(max_num_seqs=16, decode_step_sizes=(8, 4))
    with pytest.raises(ValueError, match="decode_step_sizes"):
        SchedulerConfig(max_num_seqs=16, decode_step_sizes=(16,))
