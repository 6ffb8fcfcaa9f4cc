"""allowed_token_ids, bad_words and int64 seeds (issue 24): vLLM's semantics, and the contract (a row is a function
of its own request, in any batch and slot), each with an inverse that shows the comparison can fail."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from corun import LLM, SamplingParams
from corun.sampler import Sampler, SamplingBatch
from tests.corun.test_sampling_controls import VOCAB, control_acts, history, rows_equal, sample

pytestmark = pytest.mark.numerics


def test_allowed_token_ids_are_the_only_tokens_sampled():
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    allowed = (5, 77, 300)
    greedy = sample(logits, [SamplingParams(temperature=0.0, allowed_token_ids=allowed)], [history([1])])
    assert greedy.token_ids.item() == max(allowed, key=lambda t: logits[0, t].item())
    sampled = {sample(logits, [SamplingParams(temperature=2.0, allowed_token_ids=allowed)], [history([1])],
                      seeds=[s]).token_ids.item() for s in range(40)}
    assert sampled <= set(allowed) and len(sampled) > 1
    # NOTE: logprobs stay those of the raw logits (vLLM's default)
    assert greedy.logprobs.item() == pytest.approx(torch.log_softmax(logits, -1)[0, greedy.token_ids].item())


def test_a_bad_word_s_last_token_is_banned_only_after_the_rest_of_it():
    logits = torch.zeros(1, VOCAB)
    logits[0, 9] = 10.0  # NOTE: greedy picks 9 unless it is banned, then 8
    logits[0, 8] = 5.0
    params = SamplingParams(temperature=0.0, bad_words_token_ids=((3, 4, 9),))

    def pick(output, prompt=(1,)):
        return sample(logits, [params], [history(prompt, output)]).token_ids.item()

    assert pick([7, 3, 4]) == 8  # the output ends with the word's prefix: its last token is banned
    assert pick([3, 4, 7]) == 9 and pick([4]) == 9 and pick([]) == 9  # the inverse: no match, no ban
    assert pick([], prompt=(3, 4)) == 9  # NOTE: vLLM's rule: over the output only, not the prompt
    single = SamplingParams(temperature=0.0, bad_words_token_ids=((9,),))
    assert sample(logits, [single], [history([1], [])]).token_ids.item() == 8  # a one-token word: never


TOKEN_CONTROLS = [
    SamplingParams(temperature=0.9, allowed_token_ids=tuple(range(0, VOCAB, 7))),
    SamplingParams(temperature=0.0, bad_words_token_ids=((3, 5), (11,), (5, 2, 1))),
    SamplingParams(temperature=1.2, top_k=50, allowed_token_ids=tuple(range(100)), bad_words_token_ids=((5, 4),)),
]


@pytest.mark.parametrize("params", TOKEN_CONTROLS)
def test_a_token_controlled_row_is_the_same_in_any_batch_and_slot(params):
    generator = torch.Generator().manual_seed(3)
    row_logits = torch.randn(VOCAB, generator=generator) * 3
    row_logits[[11, 4, 5]] += 20.0  # NOTE: make the bad words' tokens the likely ones, so the ban acts
    row_history = history([1, 2, 3], [3, 3, 5])
    alone = sample(row_logits[None], [params], [row_history], seeds=[42])
    for num_rows, at_row, co_params in [(4, 2, SamplingParams(temperature=0.8)), (8, 7, TOKEN_CONTROLS[0]),
                                        (8, 0, TOKEN_CONTROLS[1])]:
        logits = torch.randn(num_rows, VOCAB, generator=generator) * 3
        logits[at_row] = row_logits
        params_list = [co_params] * num_rows
        params_list[at_row] = params
        histories = [history([9], [5] * i) for i in range(num_rows)]
        histories[at_row] = row_history
        batched = sample(logits, params_list, histories, seeds=[42 if r == at_row else r for r in range(num_rows)])
        assert rows_equal(batched, alone, at_row, 0)
    assert control_acts(params, row_logits[None], row_history)  # NOTE: the inverse: the control changes the row


def test_a_plain_row_is_unchanged_by_a_co_row_with_token_controls():
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(4)) * 3
    plain = SamplingParams(temperature=0.8)
    histories = [history([1, 2]), history([4], [3])]
    without = sample(logits, [plain, plain], histories)
    with_controls = sample(logits, [plain, TOKEN_CONTROLS[2]], histories)
    assert rows_equal(with_controls, without, 0, 0)
    assert not rows_equal(with_controls, without, 1, 1)  # NOTE: the inverse: the controlled row did change


@pytest.mark.parametrize("bad", [
    {"allowed_token_ids": ()}, {"allowed_token_ids": (-1,)}, {"bad_words_token_ids": ((),)},
    {"bad_words_token_ids": ((1,),) * 129}, {"seed": 2**63}, {"seed": -2**63 - 1},
])
def test_out_of_range_token_controls_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_negative_seeds_key_their_own_noise():
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(5))
    params = [SamplingParams(temperature=1.5)]
    draws = {seed: tuple(sample(logits, params, [history([1], [0] * i)], seeds=[seed]).token_ids.item()
                         for i in range(12)) for seed in (-5, 5, 2**63 - 5, -2**63)}
    assert len(set(draws.values())) == 4  # NOTE: no negative seed aliases a positive one


def test_logprob_token_ids_report_the_named_tokens_raw_logprobs_in_their_order():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(6)) * 3
    chosen = SamplingParams(temperature=0.0, logprobs=3, logprob_token_ids=(900, 2, 451))
    plain = SamplingParams(temperature=0.0, logprobs=3)
    histories = [history([1])] * 3

    def run(params, rows):
        batch = SamplingBatch.build(params, [1] * len(params), [1] * len(params), len(params), "cpu", histories)
        return Sampler()(logits[rows], batch, 5)

    alone = run([chosen], [1])
    raw = torch.log_softmax(logits[1], -1)
    assert alone.topk_ids[0, :3].tolist() == [900, 2, 451]
    assert torch.equal(alone.topk_logprobs[0, :3], raw[[900, 2, 451]])
    batched = run([plain, chosen, plain], [0, 1, 2])
    assert rows_equal(batched, alone, 1, 0)
    without = run([plain, plain, plain], [0, 1, 2])
    assert rows_equal(batched, without, 0, 0) and rows_equal(batched, without, 2, 2)
    assert not rows_equal(batched, without, 1, 1)  # NOTE: the inverse: the named row did change
    with pytest.raises(ValueError):
        SamplingParams(logprobs=2, logprob_token_ids=(1, 2, 3))


# ---- through the engine ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir, mode="fixed_shape", max_num_seqs=8, max_model_len=256)


ENGINE_CONTROLS = [
    SamplingParams(temperature=0.9, seed=-7, max_tokens=10, logprobs=2, allowed_token_ids=tuple(range(200, 400))),
    SamplingParams(temperature=0.0, seed=5, max_tokens=10, logprobs=2),
    SamplingParams(temperature=1.0, seed=-2**63, max_tokens=10, logprobs=2),
]


def outputs_of(result):
    return [(o.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in o.logprobs]) for o in result.outputs]


def test_engine_token_controls_are_the_same_alone_and_batched(llm):
    prompts = ["The river", "Seven numbers and a name", "Counting sheep at night"]
    greedy = llm.generate(prompts[1], ENGINE_CONTROLS[1])[0].outputs[0].token_ids
    # NOTE: ban the greedy output's first two tokens as a word, and its third token alone
    controls = [ENGINE_CONTROLS[0],
                dataclasses.replace(ENGINE_CONTROLS[1], bad_words_token_ids=(tuple(greedy[1:3]), (greedy[3],))),
                ENGINE_CONTROLS[2]]
    alone = [llm.generate(p, c)[0] for p, c in zip(prompts, controls, strict=True)]
    together = llm.generate(prompts * 2, controls * 2)
    for i, result in enumerate(together):
        assert outputs_of(result) == outputs_of(alone[i % 3])
    assert all(200 <= t < 400 for t in alone[0].outputs[0].token_ids)
    banned = alone[1].outputs[0].token_ids
    assert banned[:2] == greedy[:2] and banned[2] != greedy[2] and greedy[3] not in banned
    # NOTE: the inverse: without the controls (the seed kept) the tokens differ
    unrestricted = llm.generate(prompts[0], dataclasses.replace(controls[0], allowed_token_ids=None))[0]
    assert outputs_of(unrestricted)[0][0] != outputs_of(alone[0])[0][0]
