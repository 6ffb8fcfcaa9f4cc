"""Stop strings end the output on the router and abort the decode; so does a client that hangs up."""

import asyncio

import aiohttp
import pytest

from tests.router.fake_nodes import FakeBehaviour
from tests.router.harness import NO_CLIENT_TIMEOUT, RouterHarness, post, sse_events, wait_for
from wire.protocol import Abort, DecodeRequest

pytestmark = pytest.mark.timeout(30)
BODY = {"prompt": "the green city", "max_tokens": 24, "seed": 21, "return_token_ids": True}


def completions(router, body, request_id: str):
    return post(router.base_url + "/v1/completions", body, headers={"X-Request-Id": request_id})


def aborted_ids(router) -> set[str]:
    return {rid for node in router.decode_nodes for rid in node.request_ids(Abort)}


def stream_text(events) -> tuple[str, list[int], str | None]:
    choices = [event["choices"][0] for event in events[:-1] if event["choices"]]
    token_ids = [t for c in choices for t in c["token_ids"]]
    return "".join(c["text"] for c in choices), token_ids, choices[-1]["finish_reason"]


@pytest.fixture
def paced_router(tiny_model_dir, word_token_ids):
    """Decode nodes that send a token every 50 ms: the decode is still running when the stop string matches.
    NOTE: with instant fake nodes, a router behind on a loaded host takes every queued token at once, the last
    one finishing the sample, and then there is nothing left to abort."""
    with RouterHarness(tiny_model_dir, word_token_ids, decode=FakeBehaviour(event_delay_s=0.05)) as harness:
        harness.wait_until_healthy()
        yield harness


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_truncates_the_text_and_aborts_the_decode(paced_router, stream):
    router = paced_router
    reference = completions(router, BODY, f"ref-{stream}").body["choices"][0]
    stop = reference["text"][10:14]
    expected_text = reference["text"][:reference["text"].index(stop)]
    reply = completions(router, {**BODY, "stop": ["zzzz", stop], "stream": stream}, f"stop-{stream}")
    if stream:
        text, token_ids, finish_reason = stream_text(sse_events(reply.body))
    else:
        choice = reply.body["choices"][0]
        text, token_ids, finish_reason = choice["text"], choice["token_ids"], choice["finish_reason"]
    assert (text, finish_reason) == (expected_text, "stop")
    # NOTE: the tokens end with the one that completed the stop string.
    assert token_ids == reference["token_ids"][:len(token_ids)]
    assert stop in router.state.tokenizer.decode(token_ids)
    assert stop not in router.state.tokenizer.decode(token_ids[:-1])
    wait_for(lambda: f"stop-{stream}-0" in aborted_ids(router))
    assert f"ref-{stream}-0" not in aborted_ids(router)


def test_a_client_hanging_up_aborts_its_decode(tiny_model_dir, word_token_ids):
    slow = FakeBehaviour(event_delay_s=0.1)
    with RouterHarness(tiny_model_dir, word_token_ids, num_decode=1, decode=slow) as router:
        asyncio.run(read_first_event_then_hang_up(router.base_url))
        wait_for(lambda: "gone-0" in aborted_ids(router))
        wait_for(lambda: router.state.admission.in_flight == 0)


async def read_first_event_then_hang_up(base_url: str) -> None:
    body = {**BODY, "max_tokens": 200, "stream": True}
    async with aiohttp.ClientSession(timeout=NO_CLIENT_TIMEOUT) as session:
        async with session.post(base_url + "/v1/completions", json=body, headers={"X-Request-Id": "gone"}) as reply:
            assert reply.status == 200
            assert (await reply.content.readline()).startswith(b"data: ")


def test_requests_spread_over_the_least_loaded_decode_nodes(tiny_model_dir, word_token_ids):
    slow = FakeBehaviour(event_delay_s=0.05)
    with RouterHarness(tiny_model_dir, word_token_ids, num_decode=2, decode=slow) as router:
        # NOTE: healthy nodes are preferred: before both answered a ping, every request went to the one that had
        # (the test's old flakiness)
        router.wait_until_healthy()
        asyncio.run(concurrent_completions(router.base_url, 4))
        counts = [len(node.request_ids(DecodeRequest)) for node in router.decode_nodes]
        assert counts == [2, 2]


async def concurrent_completions(base_url: str, num: int) -> None:
    async with aiohttp.ClientSession(timeout=NO_CLIENT_TIMEOUT) as session:
        async def one(i: int) -> None:
            async with session.post(base_url + "/v1/completions", json={**BODY, "max_tokens": 6}) as reply:
                assert reply.status == 200, await reply.text()
        await asyncio.gather(*(one(i) for i in range(num)))
