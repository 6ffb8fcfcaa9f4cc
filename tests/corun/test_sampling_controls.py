"""Sampling controls (logit_bias, penalties, min_p, min_tokens) and n samples: semantics and the contract.

A control must keep a row a function of its own request: the same bits in any batch and slot, whether or not a
co-row uses a control; each check keeps an inverse that shows the comparison can fail.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from corun import LLM, SamplingParams
from corun.sampler import Sampler, SamplerOutput, SamplingBatch, min_p_mask
from wire.seeding import SEED_BOUND, sample_seed

pytestmark = pytest.mark.numerics

VOCAB = 1009


def history(prompt=(), output=(), stops=()):
    return SimpleNamespace(prompt_token_ids=list(prompt), output_token_ids=list(output),
                           stop_token_ids=frozenset(stops))


def sample(logits, params, histories, seeds=None, positions=None, num_rows=None) -> SamplerOutput:
    seeds = seeds or [7] * len(params)
    positions = positions or [len(h.prompt_token_ids) + len(h.output_token_ids) for h in histories]
    batch = SamplingBatch.build(params, seeds, positions, num_rows or len(params), logits.device, histories)
    return Sampler()(logits, batch, 3)


def rows_equal(a: SamplerOutput, b: SamplerOutput, row_a: int, row_b: int) -> bool:
    return all(torch.equal(getattr(a, n)[row_a], getattr(b, n)[row_b]) for n in SamplerOutput.__dataclass_fields__)


def test_logit_bias_forces_and_forbids_tokens():
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(1))
    forced = sample(logits, [SamplingParams(temperature=0.0, logit_bias={17: 100.0})], [history([1])])
    assert forced.token_ids.item() == 17
    top = int(logits.argmax())
    banned = sample(logits, [SamplingParams(temperature=0.0, logit_bias={top: -100.0})], [history([1])])
    assert banned.token_ids.item() != top
    # NOTE: logprobs stay those of the raw logits (vLLM's default), whatever the bias did to sampling
    assert forced.logprobs.item() == pytest.approx(torch.log_softmax(logits, -1)[0, 17].item())


def test_penalties_follow_vllm_formulas():
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(1, VOCAB, generator=generator) * 3
    prompt, output = [5, 9], [9, 11, 11, 11]
    params = SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.5)
    batch = SamplingBatch.build([params], [0], [6], 1, "cpu", [history(prompt, output)])
    adjusted = batch.adjustments.apply(logits)[0]
    expected = logits[0].clone()
    for token in {5, 9, 11}:  # NOTE: repetition over prompt and output
        x = expected[token]
        expected[token] = x / 1.5 if x > 0 else x * 1.5
    for token, count in {9: 1, 11: 3}.items():  # NOTE: presence and frequency over the output only
        expected[token] -= 0.25 * count + 0.5
    assert torch.allclose(adjusted, expected)
    untouched = [t for t in range(VOCAB) if t not in (5, 9, 11)]
    assert torch.equal(adjusted[untouched], logits[0, untouched])


def test_min_tokens_bans_stop_tokens_until_reached():
    logits = torch.zeros(1, VOCAB)
    logits[0, 3] = 10.0  # NOTE: the stop token is the greedy choice
    params = SamplingParams(temperature=0.0, min_tokens=2, max_tokens=8)
    assert sample(logits, [params], [history([1], [4], stops=[3])]).token_ids.item() != 3
    assert sample(logits, [params], [history([1], [4, 4], stops=[3])]).token_ids.item() == 3


def test_min_p_keeps_tokens_near_the_most_likely():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    keep = min_p_mask(logits, torch.tensor([0.25]))
    assert keep.tolist() == [[True, True, True, False]]  # 0.05 < 0.25 * 0.5
    assert min_p_mask(logits, torch.tensor([0.0])).all()
    draws = {sample(logits, [SamplingParams(temperature=1.0, min_p=0.7)], [history([1])], seeds=[s]).token_ids.item()
             for s in range(64)}
    assert draws == {0}  # NOTE: 0.3 / 0.5 = 0.6 < 0.7: only token 0 is left
    wider = {sample(logits, [SamplingParams(temperature=1.0, min_p=0.5)], [history([1])], seeds=[s]).token_ids.item()
             for s in range(64)}
    assert wider == {0, 1}


CONTROLS = [
    SamplingParams(temperature=0.9, presence_penalty=1.0, frequency_penalty=-0.5),
    SamplingParams(temperature=0.0, repetition_penalty=1.3),
    SamplingParams(temperature=1.1, min_p=0.05, top_k=40),
    SamplingParams(temperature=0.7, logit_bias={3: 5.0, 8: -3.0}, min_tokens=4, max_tokens=8),
]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("params", CONTROLS)
def test_controlled_row_is_the_same_in_any_batch_and_slot(params, device):
    """On CUDA this runs the fused Gumbel-max kernel after the adjustments."""
    generator = torch.Generator().manual_seed(3)
    row_logits = torch.randn(VOCAB, generator=generator).to(device) * 3
    row_history = history([1, 2, 3, 8], [3, 3, 5], stops=[8])
    alone = sample(row_logits[None], [params], [row_history], seeds=[42])
    plain = SamplingParams(temperature=0.8)
    for num_rows, at_row, co_params in [(4, 2, plain), (8, 7, CONTROLS[0]), (8, 0, CONTROLS[3])]:
        logits = torch.randn(num_rows, VOCAB, generator=generator).to(device) * 3
        logits[at_row] = row_logits
        params_list = [co_params] * num_rows
        params_list[at_row] = params
        histories = [history([9, 9], [9] * i, stops=[4]) for i in range(num_rows)]
        histories[at_row] = row_history
        seeds = [at_row + i for i in range(num_rows)]
        seeds[at_row] = 42
        batched = sample(logits, params_list, histories, seeds=seeds)
        assert rows_equal(batched, alone, at_row, 0)
    # NOTE: the inverse: the same row with other seeds does differ
    others = [sample(row_logits[None], [params], [row_history], seeds=[s]) for s in range(43, 59)]
    assert params.is_greedy or not all(rows_equal(other, alone, 0, 0) for other in others)
    assert control_acts(params, row_logits[None], row_history)


def control_acts(params, logits, row_history) -> bool:
    """The control changes what this row can sample (so a test of it tests something)."""
    batch = SamplingBatch.build([params], [42], [7], 1, logits.device, [row_history])
    if batch.adjustments is not None:
        return not torch.equal(batch.adjustments.apply(logits), logits)
    return not bool(min_p_mask(logits / params.temperature, batch.min_ps).all())


def test_a_plain_row_is_unchanged_by_a_co_row_that_uses_controls():
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(2, VOCAB, generator=generator) * 3
    plain = SamplingParams(temperature=0.8, top_p=0.9)
    histories = [history([1, 2]), history([4, 4], [4, 4, 4], stops=[2])]
    without = sample(logits, [plain, plain], histories)
    with_controls = sample(logits, [plain, dataclasses.replace(CONTROLS[0], min_p=0.1)], histories)
    assert rows_equal(with_controls, without, 0, 0)
    assert control_acts(CONTROLS[0], logits[1:], histories[1])


def test_controls_need_token_histories():
    with pytest.raises(ValueError, match="history"):
        SamplingBatch.build([SamplingParams(presence_penalty=1.0)], [1], [0], 1, "cpu")


@pytest.mark.parametrize("bad", [
    {"presence_penalty": 2.5}, {"frequency_penalty": -3}, {"repetition_penalty": 0.0}, {"min_p": 1.5},
    {"min_tokens": 20, "max_tokens": 10}, {"logit_bias": {-1: 1.0}}, {"logit_bias": {3: 101.0}}, {"n": 0},
])
def test_out_of_range_controls_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_logit_bias_normalises_to_sorted_pairs():
    assert SamplingParams(logit_bias={"9": 1, 2: -1.5}).logit_bias == ((2, -1.5), (9, 1.0))
    assert SamplingParams(logit_bias=[[9, 1], [2, -1.5]]) == SamplingParams(logit_bias={9: 1.0, 2: -1.5})


def test_sample_seeds_are_pinned_and_distinct():
    assert sample_seed(42, 0) == 42
    seeds = [sample_seed(42, i) for i in range(64)]
    assert len(set(seeds)) == 64 and all(0 <= s < SEED_BOUND for s in seeds)
    assert sample_seed(43, 1) != sample_seed(42, 1)


# ---- through the engine ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir, mode="fixed_shape", max_num_seqs=8, max_model_len=256)


ENGINE_CONTROLS = [
    SamplingParams(temperature=0.9, seed=5, max_tokens=12, logprobs=2, presence_penalty=1.5, frequency_penalty=0.5),
    SamplingParams(temperature=0.0, seed=5, max_tokens=12, logprobs=2, repetition_penalty=1.8),
    SamplingParams(temperature=1.0, seed=5, max_tokens=12, logprobs=2, min_p=0.2, logit_bias={7: 3.0}),
    SamplingParams(temperature=0.8, seed=5, max_tokens=12, logprobs=2, min_tokens=6),
]


def outputs_of(result):
    return [(o.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in o.logprobs]) for o in result.outputs]


def test_engine_controls_are_the_same_alone_and_batched(llm):
    prompts = ["The river", "Seven numbers and a name", "A", "Counting sheep at night"]
    alone = [llm.generate(p, c)[0] for p, c in zip(prompts, ENGINE_CONTROLS, strict=True)]
    together = llm.generate(prompts * 2, ENGINE_CONTROLS * 2)
    for i, result in enumerate(together):
        assert outputs_of(result) == outputs_of(alone[i % 4])
    # NOTE: the inverse: the controls change the tokens of the same prompt and seed
    plain = [llm.generate(p, dataclasses.replace(c, presence_penalty=0.0, frequency_penalty=0.0,
                                                 repetition_penalty=1.0, logit_bias=(), min_p=0.0))[0]
             for p, c in zip(prompts[:3], ENGINE_CONTROLS[:3], strict=True)]
    assert all(outputs_of(p)[0][0] != outputs_of(a)[0][0] for p, a in zip(plain, alone, strict=False))


def test_n_samples_equal_single_requests_with_derived_seeds(llm):
    params = SamplingParams(temperature=1.0, seed=11, max_tokens=10, logprobs=1, n=4)
    result = llm.generate("The river", params)[0]
    assert result.seed == 11 and [o.index for o in result.outputs] == [0, 1, 2, 3]
    for output in result.outputs:
        assert output.seed == sample_seed(11, output.index)
        single = llm.generate("The river", dataclasses.replace(params, n=1, seed=output.seed))[0]
        assert outputs_of(single) == [(output.token_ids, [(lp.token_id, lp.logprob, lp.top)
                                                          for lp in output.logprobs])]
    assert len({tuple(o.token_ids) for o in result.outputs}) > 1  # NOTE: the inverse: the samples differ


def test_finite_logprobs_under_a_strong_bias(llm):
    result = llm.generate("The river", SamplingParams(temperature=0.0, max_tokens=4, logprobs=1,
                                                        logit_bias={11: 100.0}))[0]
    assert result.outputs[0].token_ids == [11] * 4
    assert all(math.isfinite(lp.logprob) for lp in result.outputs[0].logprobs)
