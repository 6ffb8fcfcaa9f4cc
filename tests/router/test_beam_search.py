"""vLLM's use_beam_search at the router (router/generation/beam_search.py): beams built from max_tokens 1 requests
with 2 * n logprobs each, against fake nodes whose logprobs are known; EOS, length_penalty and ignore_eos on a
scripted model; the fields beam search does not honour are a 400."""

import asyncio

import pytest

import router.generation.beam_search as beam_search_module
from router.generation.beam_search import beam_search_deltas
from router.generation.output import BeamSearch
from tests.router.harness import post
from tests.router.test_errors import assert_error
from wire.outputs import TokenLogprobs
from wire.protocol import PrefillRequest
from wire.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(60)
BEAMS = {"model": "corun-tiny", "prompt": "the cat", "n": 2, "max_tokens": 4, "temperature": 0.0,
         "use_beam_search": True, "return_token_ids": True}


def completions(router, body, request_id: str | None = None):
    return post(router.base_url + "/v1/completions", body, headers={"X-Request-Id": request_id} if request_id else {})


def test_the_beams_are_the_best_by_cumulative_logprob_and_the_same_every_time(router, tokenizer, word_token_ids):
    """The fake nodes' logprobs depend on the position alone: at each step the i-th candidate is
    word_token_ids[(position + i) % len] with logprob -0.5 * (i + 1). The best beam takes every step's first
    candidate; the runner-up ties with many, and stable ranking keeps the first beam's second candidate at the
    last step."""
    reply = completions(router, BEAMS, "beams-1")
    assert reply.status == 200, reply.body
    prompt_len = len(tokenizer.encode("the cat"))
    candidate = [word_token_ids[(prompt_len + step) % len(word_token_ids)] for step in range(5)]
    best, second = reply.body["choices"]
    assert best["token_ids"] == candidate[:4] and second["token_ids"] == candidate[:3] + [candidate[4]]
    assert best["text"] == tokenizer.decode(candidate[:4]) and best["finish_reason"] == "length"
    assert [c["index"] for c in reply.body["choices"]] == [0, 1] and reply.body["usage"]["completion_tokens"] == 8
    again = completions(router, BEAMS).body["choices"]  # NOTE: another request id, so another (unused) seed
    assert [{**c, "seed": None} for c in again] == [{**c, "seed": None} for c in reply.body["choices"]]
    shown = completions(router, {**BEAMS, "logprobs": 1}).body["choices"][1]["logprobs"]
    assert shown["token_logprobs"] == [-0.5, -0.5, -0.5, -1.0] and len(shown["top_logprobs"][0]) == 1
    steps = [r for node in router.prefill_nodes for r in node.request_ids(PrefillRequest) if "beams-1" in r]
    assert len(steps) == 1 + 2 * 3  # NOTE: one beam at the first step, then two, each a max_tokens 1 request


def test_two_copies_of_a_prompt_get_the_same_beams_as_vllm_s_test_asks(router):
    reply = completions(router, {**BEAMS, "prompt": ["the cat", "the cat"]})
    texts = [c["text"] for c in reply.body["choices"]]
    assert len(texts) == 4 and texts[0] != texts[1] and texts[:2] == texts[2:]


@pytest.mark.parametrize("field, value, fragment", [
    ("stream", True, "Streaming is not currently supported with beam search"),
    ("stop", ["x"], "does not honour stop"),
    ("top_p", 0.5, "does not honour top_p"),
    ("n", 11, "max_logprobs"),
])
def test_what_beam_search_does_not_honour_is_a_400(router, field, value, fragment):
    assert_error(completions(router, {**BEAMS, field: value}), 400, fragment)
    assert completions(router, {**BEAMS, field: value, "use_beam_search": False}).status == 200  # NOTE: inverse


class ScriptedModel:
    """next_token_logprobs of a model that answers A (-0.1), EOS (-0.2), B (-3.0), C (-3.1) after the prompt,
    then A (-1.0), B (-1.1), C (-5.0), EOS (-6.0) after anything longer."""

    def __init__(self, prompt: list[int], a: int, b: int, c: int, eos: int):
        self.prompt, self.first = prompt, ((a, -0.1), (eos, -0.2), (b, -3.0), (c, -3.1))
        self.later = ((a, -1.0), (b, -1.1), (c, -5.0), (eos, -6.0))

    async def __call__(self, pool, request_id, token_ids, params, placement, tenant="") -> TokenLogprobs:
        top = self.first if token_ids == self.prompt else self.later
        return TokenLogprobs(top[0][0], top[0][1], top[:params.logprobs])


def scripted_beams(monkeypatch, tokenizer, word_token_ids, **params) -> tuple[list, tuple[int, int]]:
    """(token ids, finish reason) of each of the n = 2 best beams of max_tokens 2 after a 1-token prompt."""
    prompt, (a, b, c) = [word_token_ids[0]], word_token_ids[1:4]
    monkeypatch.setattr(beam_search_module, "next_token_logprobs",
                        ScriptedModel(prompt, a, b, c, tokenizer.eos_token_id))
    beam = BeamSearch(params.pop("length_penalty", 1.0))
    deltas = beam_search_deltas(None, tokenizer, 0, "r", prompt, SamplingParams(n=2, max_tokens=2, **params), beam)
    choices = asyncio.run(collect(deltas))
    return [(choice.token_ids, choice.finish_reason) for choice in choices], (a, b)


async def collect(deltas) -> list:
    return [delta async for delta in deltas]


def test_a_beam_ended_by_eos_competes_by_its_length_penalised_score(monkeypatch, tokenizer, word_token_ids):
    # NOTE: lengths count the prompt (1 token), not a final EOS: "EOS at once" scores -0.2 / 1, "A A" -1.1 / 3
    choices, (a, b) = scripted_beams(monkeypatch, tokenizer, word_token_ids)
    assert choices == [((), "stop"), ((a, a), "length")]
    # NOTE: the inverse: a length penalty of 3 favours the long beams (-1.1 / 27 beats -0.2 / 1)
    choices, _ = scripted_beams(monkeypatch, tokenizer, word_token_ids, length_penalty=3.0)
    assert choices == [((a, a), "length"), ((a, b), "length")]
    choices, _ = scripted_beams(monkeypatch, tokenizer, word_token_ids, ignore_eos=True)
    assert all(reason == "length" for _, reason in choices) and choices[0] == ((a, a), "length")
