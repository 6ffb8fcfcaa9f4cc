"""A full (not streamed) response's body (router/api/responses.py response_body): the JSON of its choices, each
encoded as soon as it is built and its logprobs let go, so that the router never holds every choice's formatted
logprobs at once (measured through `corun serve`: n = 32, 1,012 positions of 20 logprobs each, a 40 MB body: the
router's peak 257 MB against 361 MB before)."""

import json
import random

import pytest

from router.api.responses import (
    JSON_ENCODER,
    ChoiceTotal,
    ResponseContext,
    choice_body,
    prompt_keys,
    response_body,
    usage,
)
from router.generation.output import ChoiceDelta
from wire.outputs import TokenLogprobs

NUM_CHOICES, NUM_TOKENS, NUM_TOP = 12, 150, 20


def totals(rng: random.Random) -> list[ChoiceTotal]:
    choices = []
    for index in range(NUM_CHOICES):
        total = ChoiceTotal(index)
        for _ in range(NUM_TOKENS):
            token = rng.randrange(200)
            top = tuple((rng.randrange(200), -rng.random() * 5) for _ in range(NUM_TOP))
            total.add(ChoiceDelta(index, f" t{token}", (token,), (TokenLogprobs(token, -rng.random(), top),), None))
        total.finish_reason = "length"
        choices.append(total)
    return choices


def all_at_once(ctx: ResponseContext, choices: list[ChoiceTotal]) -> bytes:
    """The body as it was built before: every choice's dict first, then one encoding."""
    bodies = [choice_body(ctx, t.index, t.text, t.token_ids, t.logprobs, t.finish_reason) for t in choices]
    top_keys = prompt_keys(ctx, 0, choices[0].prompt_logprobs) if ctx.kind == "chat" else {}
    return JSON_ENCODER.encode({**ctx.envelope(streaming=False), "choices": bodies,
                                "usage": usage(5, NUM_CHOICES * NUM_TOKENS, None), **top_keys})


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_the_body_is_the_whole_encoding_and_each_choice_s_logprobs_are_let_go(tokenizer, kind):
    ctx = ResponseContext(kind, "r", 1700000000, "m", "fp", 7, NUM_TOP, tokenizer, prompts=((1, 2),) * NUM_CHOICES,
                          n=NUM_CHOICES)
    expected = all_at_once(ctx, totals(random.Random(0)))
    choices = totals(random.Random(0))
    body = response_body(ctx, choices, 5)
    assert body == expected
    assert all(choice.logprobs is None for choice in choices)
    # NOTE: inverse: other logprobs give another body
    assert response_body(ctx, totals(random.Random(1)), 5) != expected
    assert json.loads(body)["choices"][3]["index"] == 3
