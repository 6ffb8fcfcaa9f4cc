"""The CoRun determinism contract on CPU float32, and its inverse: mixed dynamic batching diverges.

bs1 vs bsN and needle follow vLLM's tests/v1/determinism/test_batch_invariance.py: identical token ids and
bitwise-equal logprobs (sampled token and top-k alternatives) at every step.
"""

import random

import pytest

from corun import LLM, SamplingParams
from tests.conftest import varied_prompts

pytestmark = pytest.mark.numerics

N = 32
ENGINE = dict(max_num_seqs=N, max_model_len=512, prefill_chunk_size=64)
# NOTE: ignore_eos, because the random-weight tiny model often predicts <|endoftext|>; every step is compared.
PARAMS = SamplingParams(temperature=0.6, seed=42, max_tokens=16, logprobs=5, ignore_eos=True)


def completions(outputs):
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outputs]


def first_difference(alone, together):
    """None when bitwise identical, else a description of the first differing prompt and step."""
    for i, ((ids_a, lps_a), (ids_b, lps_b)) in enumerate(zip(alone, together, strict=True)):
        for step, (a, b) in enumerate(zip(lps_a, lps_b, strict=True)):
            if a != b:
                return f"prompt {i} step {step}: alone {a} vs batched {b}"
        if ids_a != ids_b:
            return f"prompt {i}: token ids {ids_a} vs {ids_b}"
    return None


def bs1_vs_bsn(llm: LLM, num_prompts: int = N):
    """None when every prompt alone gives what it gives in the batch, else the first difference (the prompts alone
    run one by one after the batch and stop at the first that differs: an inverse check needs one)."""
    prompts = varied_prompts(num_prompts, seed=0)
    together = completions(llm.generate(prompts, PARAMS))
    for i, prompt in enumerate(prompts):
        alone = completions(llm.generate([prompt], PARAMS))
        assert len(alone[0][0]) == PARAMS.max_tokens
        difference = first_difference(alone, [together[i]])
        if difference is not None:
            return f"prompt {i}: {difference}"
    return None


def needle(llm: LLM, num_trials: int = 4, until_a_difference: bool = False):
    """One prompt alone, then at a random position of a random-size batch of random co-runners. until_a_difference:
    no trial after the first that differs (an inverse check needs one)."""
    rng = random.Random(7)
    target = varied_prompts(1, seed=99, min_words=40, max_words=80)[0]
    reference = completions(llm.generate([target], PARAMS))
    differences = []
    for trial in range(num_trials):
        size = rng.randint(2, N)
        others = varied_prompts(size - 1, seed=1000 + trial)
        position = rng.randrange(size)
        prompts = others[:position] + [target] + others[position:]
        # co-runners with other seeds, temperatures and lengths, so rows finish (and move) at random times
        params = [SamplingParams(temperature=rng.choice([0.0, 0.6, 1.0]), seed=rng.randrange(2**31),
                                 max_tokens=rng.randint(1, 24), logprobs=2) for _ in prompts]
        params[position] = PARAMS
        out = completions(llm.generate(prompts, params))
        differences.append(first_difference(reference, [out[position]]))
        if until_a_difference and differences[-1] is not None:
            break
    return differences


@pytest.fixture(scope="module")
def fixed_shape_llm(tiny_model_dir):
    return LLM(tiny_model_dir, mode="fixed_shape", **ENGINE)


@pytest.fixture(scope="module")
def mixed_llm(tiny_model_dir):
    return LLM(tiny_model_dir, mode="mixed", max_num_batched_tokens=4096, **ENGINE)


def test_bs1_vs_bsn_bitwise_identical(fixed_shape_llm):
    assert bs1_vs_bsn(fixed_shape_llm) is None
    assert fixed_shape_llm.engine.stats.max_prefill_batch == 1


def test_needle_bitwise_identical(fixed_shape_llm):
    assert needle(fixed_shape_llm) == [None] * 4


@pytest.mark.mkl_default_mode
def test_inverse_mixed_batching_diverges_bs1_vs_bsn(mixed_llm):
    """Proves the comparisons above can fail on this machine: dynamic batch shapes change the bits."""
    assert bs1_vs_bsn(mixed_llm) is not None
    assert mixed_llm.engine.stats.max_prefill_batch > 1


@pytest.mark.mkl_default_mode
def test_inverse_mixed_batching_diverges_needle(mixed_llm):
    assert any(d is not None for d in needle(mixed_llm, until_a_difference=True))


@pytest.mark.parametrize("mode", ["fixed_shape", "mixed"])
def test_batched_decode_path_on_cpu(tiny_model_dir, mode):
    """The CUDA path's step building (batched decode rows + prompt segments), run on CPU with the torch kernel:
    corun stays bitwise identical bs1 vs bsN through it, and it agrees with the per-request path's tokens."""
    # NOTE: rows for the 8 prompts, not N: each batched decode step attends over every row's whole window, the
    # padding rows' too, and a prompt alone decodes at the engine's one size
    llm = LLM(tiny_model_dir, mode=mode, max_num_batched_tokens=4096, **{**ENGINE, "max_num_seqs": 8})
    reference = completions(llm.generate(varied_prompts(8, seed=3), PARAMS))
    llm.engine.runner.batched_decode_rows = True
    batched = completions(llm.generate(varied_prompts(8, seed=3), PARAMS))
    assert [ids for ids, _ in batched] == [ids for ids, _ in reference]
    if mode == "fixed_shape":
        assert bs1_vs_bsn(llm, num_prompts=8) is None  # NOTE: 8 of N: the step building is what is new here


def test_prefill_token_budget_changes_timing_not_outputs(tiny_model_dir, fixed_shape_llm):
    """The bounded prefill policy interleaves decode steps with prefills (the requests really decode while
    others prefill) and every output stays bitwise what Algorithm 1 gives."""
    import dataclasses

    def with_budget(budget: int) -> LLM:
        config = fixed_shape_llm.config
        return LLM.from_config(dataclasses.replace(config, scheduler=dataclasses.replace(
            config.scheduler, prefill_token_budget=budget)))

    algorithm_1, bounded = with_budget(0), with_budget(64)
    prompts = varied_prompts(N, seed=4)
    reference = completions(algorithm_1.generate(prompts, PARAMS))
    unbounded_steps = algorithm_1.engine.stats.num_decode_steps
    outputs = completions(bounded.generate(prompts, PARAMS))
    assert first_difference(reference, outputs) is None
    # NOTE: Algorithm 1 decodes all N together after the prefills; the budget adds steps of fewer rows earlier
    assert unbounded_steps == PARAMS.max_tokens - 1
    assert bounded.engine.stats.num_decode_steps > unbounded_steps


def test_inverse_a_token_budget_changes_mixed_outputs(tiny_model_dir, mixed_llm):
    """The same comparison fails where the budget shapes the batches: mixed mode's token budget."""
    small_budget = LLM(tiny_model_dir, mode="mixed", max_num_batched_tokens=48, **ENGINE)
    prompts = varied_prompts(N, seed=4)
    assert first_difference(completions(mixed_llm.generate(prompts, PARAMS)),
                            completions(small_budget.generate(prompts, PARAMS))) is not None
