"""The colocated engine through `corun.LLM`: stop conditions, greedy consistency, rejection, seeds."""

import pytest

from corun import LLM, SamplingParams
from corun.scheduler import RequestRejected
from tests.conftest import varied_prompts
from wire.seeding import seed_from_request_id

ENGINE = dict(max_num_seqs=8, max_model_len=256, prefill_chunk_size=64, num_blocks=64)
PROMPT = "the people of the city walk by the river in the morning"


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir, **ENGINE)


def greedy(max_tokens, **kwargs):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kwargs)


def only(outputs):
    (output,) = outputs
    return output.outputs[0]


def first_with_fresh_third_token(llm):
    """A prompt whose greedy run's 3rd token does not occur among its first two (random weights repeat a lot)."""
    for prompt in [PROMPT] + varied_prompts(20, seed=5, max_words=30):
        ids = only(llm.generate(prompt, greedy(8, ignore_eos=True))).token_ids
        if ids[2] not in ids[:2]:
            return prompt, ids
    raise AssertionError("no greedy run with a fresh 3rd token among 21 prompts")


# --------------------------------------------------------------------------------------------- stopping


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 20])
def test_max_tokens_finishes_with_length(llm, max_tokens):
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    completion = only(llm.generate(PROMPT, params))
    assert completion.finish_reason == "length"
    assert len(completion.token_ids) == len(completion.logprobs) == max_tokens


def test_stop_token_id_stops_right_after_it_and_is_kept(llm):
    prompt, ids = first_with_fresh_third_token(llm)
    stop = ids[2]
    completion = only(llm.generate(prompt, greedy(8, ignore_eos=True, stop_token_ids=(stop,))))
    assert completion.token_ids == ids[:3]
    assert completion.finish_reason == "stop"


def test_stop_token_as_the_first_token(llm):
    ids = only(llm.generate(PROMPT, greedy(4, ignore_eos=True))).token_ids
    completion = only(llm.generate(PROMPT, greedy(4, stop_token_ids=(ids[0], 5))))
    assert completion.token_ids == ids[:1] and completion.finish_reason == "stop"


def test_stop_token_on_the_last_allowed_token_reports_stop(llm):
    prompt, ids = first_with_fresh_third_token(llm)
    completion = only(llm.generate(prompt, greedy(3, ignore_eos=True, stop_token_ids=(ids[2],))))
    assert completion.token_ids == ids[:3] and completion.finish_reason == "stop"


def test_engine_eos_is_the_checkpoint_eos(llm):
    im_end, endoftext = llm.tokenizer.encode("<|im_end|>"), llm.tokenizer.encode("<|endoftext|>")
    assert len(im_end) == len(endoftext) == 1
    # config.json's eos (<|im_end|>) plus generation_config.json's list (<|im_end|>, <|endoftext|>)
    assert llm.engine.eos_token_ids == frozenset(im_end + endoftext)


def test_eos_stops_unless_ignore_eos(llm, monkeypatch):
    """Random weights never emit <|im_end|>, so make the greedy run's 3rd token the engine's EOS."""
    prompt, ids = first_with_fresh_third_token(llm)
    monkeypatch.setattr(llm.engine, "eos_token_ids", frozenset({ids[2]}))
    stopped = only(llm.generate(prompt, greedy(8)))
    assert stopped.token_ids == ids[:3] and stopped.finish_reason == "stop"
    ignored = only(llm.generate(prompt, greedy(8, ignore_eos=True)))
    assert ignored.token_ids == ids and ignored.finish_reason == "length"
    # an explicit stop token still stops with ignore_eos
    explicit = only(llm.generate(prompt, greedy(8, ignore_eos=True, stop_token_ids=(ids[2],))))
    assert explicit.token_ids == ids[:3] and explicit.finish_reason == "stop"


def test_generation_config_eos_ids_are_stops(llm):
    assert set(llm.tokenizer.stop_token_ids) <= llm.engine.eos_token_ids


# ----------------------------------------------------------------------------------- greedy consistency


@pytest.mark.numerics
def test_greedy_equals_argmax_of_isolated_prefill_of_prompt_plus_prefix(llm):
    """Decode vs prefill: each greedy token is the argmax of a fresh isolated prefill of prompt + prefix.

    Observed on CPU float32: the token ids are equal; the logprob of token 1 is bitwise equal (it *is* an
    isolated prefill of the same prompt), later tokens' logprobs are only close (|diff| ~1e-6): a prefill of
    L + k tokens and a one-row decode step in an N-row batch are different shapes, so their float reductions
    differ. The determinism contract does not claim decode == prefill bitwise, only run-to-run equality.
    """
    prompt, _ = first_with_fresh_third_token(llm)
    completion = only(llm.generate(prompt, greedy(12, ignore_eos=True, logprobs=3)))
    prompt_ids = llm.tokenizer.encode(prompt)
    max_diff = 0.0
    for k, (token, lp) in enumerate(zip(completion.token_ids, completion.logprobs, strict=True)):
        assert lp.token_id == token == lp.top[0][0]  # greedy: the sampled token is the most likely one
        fresh = only(llm.generate([prompt_ids + completion.token_ids[:k]], greedy(1, ignore_eos=True, logprobs=3)))
        assert fresh.token_ids == [token], f"step {k}: prefill argmax {fresh.token_ids} vs decode {token}"
        if k == 0:
            assert fresh.logprobs[0] == lp  # bitwise, alternatives included
        assert fresh.logprobs[0].logprob == pytest.approx(lp.logprob, abs=1e-4)
        max_diff = max(max_diff, abs(fresh.logprobs[0].logprob - lp.logprob))
    assert max_diff < 1e-4


# ------------------------------------------------------------------------------------------- rejection


def test_too_long_is_rejected_with_a_clear_message_and_the_engine_keeps_serving(llm):
    reference = only(llm.generate(PROMPT, greedy(5, ignore_eos=True))).token_ids
    long_prompt = list(range(10, 250))  # 240 tokens + 20 > max_model_len 256
    with pytest.raises(RequestRejected) as info:
        llm.generate([long_prompt], greedy(20))
    message = str(info.value)
    assert "request" in message and "240" in message and "20" in message and "260" in message
    assert "256" in message and "max_model_len" in message
    assert not llm.engine.has_unfinished()
    assert only(llm.generate(PROMPT, greedy(5, ignore_eos=True))).token_ids == reference
    # exactly max_model_len is accepted
    assert len(only(llm.generate([long_prompt], greedy(16, ignore_eos=True))).token_ids) == 16


def test_more_blocks_than_the_cache_is_rejected(tiny_model_dir):
    small = LLM(tiny_model_dir, max_num_seqs=4, max_model_len=256, num_blocks=8)  # 7 usable blocks of 16
    with pytest.raises(RequestRejected, match=r"needs 8 KV blocks, the cache has 7"):
        small.generate([list(range(1, 101))], greedy(20))  # 120 tokens = 8 blocks
    assert len(only(small.generate([list(range(1, 101))], greedy(12, ignore_eos=True))).token_ids) == 12


def test_empty_prompt_is_rejected(llm):
    with pytest.raises(RequestRejected, match="empty"):
        llm.generate("", greedy(4))
    assert not llm.engine.has_unfinished()


@pytest.mark.parametrize("bad", [-1, 2048, 10**6])
def test_out_of_vocab_token_ids_are_rejected(llm, bad):
    vocab = llm.engine.runner.model.cfg.vocab_size
    assert vocab == 2048
    with pytest.raises(RequestRejected, match=rf"\[0, {vocab}\)"):
        llm.generate([[5, bad, 7]], greedy(4))
    assert not llm.engine.has_unfinished()
    assert len(only(llm.generate([[5, vocab - 1, 7]], greedy(2, ignore_eos=True))).token_ids) == 2


def test_a_rejected_batch_leaves_no_request_behind(llm):
    try:
        with pytest.raises(RequestRejected, match="empty"):
            llm.generate([PROMPT, ""], greedy(4))  # PROMPT is accepted and queued, then "" is rejected
        assert not llm.engine.has_unfinished(), f"left behind: {[r.request_id for r in llm.engine.scheduler.waiting]}"
    finally:
        while llm.engine.has_unfinished():  # keep the module's engine clean for the tests after this one
            llm.engine.step()


# ----------------------------------------------------------------------------------------------- seeds


def test_no_seed_derives_it_from_the_request_id(llm):
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    outputs = llm.generate([PROMPT, PROMPT, PROMPT], params)
    seeds = [o.seed for o in outputs]
    assert seeds == [seed_from_request_id(o.request_id, llm.config.seed) for o in outputs]
    assert len(set(seeds)) == 3 and len({o.request_id for o in outputs}) == 3
    # different derived seeds sample different continuations of the same prompt
    assert len({tuple(o.outputs[0].token_ids) for o in outputs}) > 1


def test_base_seed_changes_derived_seeds(tiny_model_dir, llm):
    other = LLM(tiny_model_dir, seed=7, **ENGINE)
    params = SamplingParams(temperature=1.0, max_tokens=4)
    (a,) = llm.generate(PROMPT, params)
    (b,) = other.generate(PROMPT, params)
    assert b.seed == seed_from_request_id(b.request_id, 7)
    assert seed_from_request_id(a.request_id, 0) != seed_from_request_id(a.request_id, 7)


def test_explicit_seed_is_reported_and_reproducible(llm):
    params = SamplingParams(temperature=1.0, seed=42, max_tokens=16, ignore_eos=True, logprobs=2)
    first, second = llm.generate([PROMPT, PROMPT], params)
    third = only(llm.generate(PROMPT, params))
    assert first.seed == second.seed == 42
    assert first.outputs[0].token_ids == second.outputs[0].token_ids == third.token_ids
    assert first.outputs[0].logprobs == third.logprobs
    zero = only(llm.generate(PROMPT, SamplingParams(temperature=1.0, seed=0, max_tokens=16, ignore_eos=True)))
    assert llm.generate(PROMPT, SamplingParams(temperature=1.0, seed=0, max_tokens=1))[0].seed == 0
    assert zero.token_ids != third.token_ids


def test_different_seeds_give_different_outputs_at_temperature_one(llm):
    outputs = [only(llm.generate(PROMPT, SamplingParams(temperature=1.0, seed=s, max_tokens=16, ignore_eos=True)))
               for s in (1, 2, 3)]
    ids = [tuple(o.token_ids) for o in outputs]
    assert len(set(ids)) == 3


def test_seed_does_not_matter_at_temperature_zero(llm):
    a = only(llm.generate(PROMPT, greedy(10, seed=1, ignore_eos=True)))
    b = only(llm.generate(PROMPT, greedy(10, seed=2, ignore_eos=True)))
    assert a.token_ids == b.token_ids


def test_batch_invariant_mode_runs_prompts_through_the_packed_kernel(two_layer_tiny_model_dir):
    """batch_invariant mode on CPU (its Triton kernels in the interpreter): mixed steps with several prompt chunks
    go through one packed prefill launch and give the tokens fixed_shape mode gives (float32: same argmax here)."""
    from corun import LLM, SamplingParams

    prompts = [[5, 6, 7, 8, 9], list(range(20, 61)), [3]]
    # NOTE: two tokens take three steps (each seconds in Triton's interpreter): the first prompt's second token is
    # decoded in the step that holds the long prompt's later chunk and the last prompt, then a step of decodes
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    invariant = LLM(two_layer_tiny_model_dir, mode="batch_invariant", max_num_seqs=4, max_model_len=128,
                    prefill_chunk_size=16, max_num_batched_tokens=32)
    reference = LLM(two_layer_tiny_model_dir, mode="fixed_shape", max_num_seqs=4, max_model_len=128)
    ours = [o.outputs[0].token_ids for o in invariant.generate(prompts, params)]
    assert invariant.engine.stats.max_prefill_batch > 1
    assert ours == [o.outputs[0].token_ids for o in reference.generate(prompts, params)]
