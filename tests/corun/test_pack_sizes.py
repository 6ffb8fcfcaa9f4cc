"""Packed prefill at verified smaller row counts (prefill_pack_sizes) on CPU float32.

Which row counts give a prompt the bits of the T-row forward is a fact of the CPU and its kernels (on the CPU hosts
seen so far a float32 GEMM row keeps its bits from 4 rows up, but not below), so these tests assert the property
wherever they run: every size the probe kept leaves every request's tokens and logprobs bitwise as with every pack
at T, alone and batched, and the forwards really ran at those sizes; the inverse, packs forced to a size the probe
rejects on this machine, change them. Where this machine gives no kept or no rejected size, that half is skipped,
saying why.
"""

import dataclasses

import pytest

from corun import LLM, SamplingParams
from corun.pack_sizes import matches_full_pack
from tests.conftest import varied_prompts
from tests.corun.test_determinism import completions, first_difference
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

pytestmark = pytest.mark.numerics

T = 96
CANDIDATES = (2, 3, 8, 16, 32, 64)
PARAMS = SamplingParams(temperature=0.7, top_p=0.9, seed=5, max_tokens=6, logprobs=3, ignore_eos=True)


def make_llm(model: str, sizes: tuple[int, ...]) -> LLM:
    return LLM.from_config(EngineConfig(model=model, num_threads=1, scheduler=SchedulerConfig(
        max_num_seqs=16, max_model_len=256, prefill_chunk_size=32, prefill_pack_tokens=T, prefill_pack_seqs=6,
        prefill_pack_sizes=sizes), cache=CacheConfig(num_blocks=600)))


def short_prompts() -> list[list[int] | str]:
    """1-3 token prompts (where a CPU GEMM's bits depend on the row count) among longer ones."""
    return [[7], [11, 12], [3, 4, 5]] + varied_prompts(9, seed=21, max_words=30)


@pytest.fixture(scope="module")
def laddered(tiny_model_dir):
    return make_llm(tiny_model_dir, CANDIDATES)


def test_the_probe_keeps_exactly_the_candidates_that_match_the_full_pack(laddered):
    runner = laddered.engine.runner
    assert runner.pack_sizes[-1] == T
    assert runner.pack_sizes[:-1] == [size for size in CANDIDATES if matches_full_pack(runner, size)]


def test_packs_at_kept_sizes_keep_every_output_bitwise(tiny_model_dir, laddered):
    kept_below_t = laddered.engine.runner.pack_sizes[:-1]
    if not kept_below_t:
        pytest.skip(f"no candidate {CANDIDATES} matched the T-row forward on this CPU: every pack runs at T rows")
    prompts = short_prompts()
    fixed = completions(make_llm(tiny_model_dir, ()).generate(prompts, PARAMS))
    alone = [completions(laddered.generate([p], PARAMS))[0] for p in prompts[:5]]
    together = completions(laddered.generate(prompts, PARAMS))
    assert first_difference(fixed, together) is None
    assert first_difference(fixed[:5], alone) is None
    # NOTE: without this the comparisons could pass with every pack at T rows
    rows_run = laddered.engine.runner.prefill_rows_histogram
    assert any(rows_run.get(size, 0) > 0 for size in kept_below_t), rows_run


def test_inverse_a_size_the_probe_rejects_changes_the_bits(tiny_model_dir):
    """Proves the comparison above can fail here: prompts prefilled at a rejected size instead of T differ."""
    llm = make_llm(tiny_model_dir, ())
    runner = llm.engine.runner
    rejected = [size for size in CANDIDATES if not matches_full_pack(runner, size)]
    if not rejected:
        pytest.skip("every candidate matched the T-row forward on this CPU: no unverified size to force")
    size = rejected[0]
    prompts = [[7], [11, 12], [3, 4, 5]][:size]  # NOTE: each alone fits the rejected size
    fixed = [completions(llm.generate([p], PARAMS))[0] for p in prompts]
    runner.pack_sizes = [size, T]
    forced = [completions(llm.generate([p], PARAMS))[0] for p in prompts]
    assert runner.prefill_rows_histogram.get(size, 0) > 0
    assert first_difference(fixed, forced) is not None, f"packs at the rejected size {size} gave T's bits"


def test_pack_sizes_are_in_the_fingerprint_and_checked(tiny_model_dir):
    from node_core.serving import engine_fingerprint

    base = make_llm(tiny_model_dir, ()).config
    other = dataclasses.replace(base, scheduler=dataclasses.replace(base.scheduler, prefill_pack_sizes=(64,)))
    assert engine_fingerprint(base, "digest") != engine_fingerprint(other, "digest")
    for bad in ((96,), (64, 32), (0, 8)):
        with pytest.raises(ValueError, match="prefill_pack_sizes"):
            SchedulerConfig(prefill_pack_tokens=96, prefill_chunk_size=32, prefill_pack_sizes=bad)
    with pytest.raises(ValueError, match="prefill_pack_sizes"):
        SchedulerConfig(prefill_pack_tokens=0, prefill_pack_sizes=(64,))  # NOTE: sizes without packed prefill


def test_the_probe_keeps_its_prompts_within_max_model_len(tiny_model_dir):
    """The CUDA defaults give T = max_num_batched_tokens with a chunk longer than a short max_model_len: the probe's
    prompts must stay inside the context (a position past it has no RoPE row: an index error on start-up)."""
    from corun.model_runner import ModelRunner

    runner = ModelRunner(EngineConfig(model=tiny_model_dir, num_threads=1, scheduler=SchedulerConfig(
        max_num_seqs=4, max_model_len=64, prefill_chunk_size=512, prefill_pack_tokens=512, prefill_pack_sizes=(192,)),
        cache=CacheConfig(num_blocks=40)))
    assert runner.pack_sizes[-1] == 512
