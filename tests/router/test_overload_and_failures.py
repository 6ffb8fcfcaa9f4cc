"""429 on overload, node errors passed through, silent nodes timed out: the router answers and keeps serving."""

import asyncio

import aiohttp
import pytest

from tests.router.fake_nodes import FakeBehaviour, expected_token_ids
from tests.router.harness import NO_CLIENT_TIMEOUT, RouterHarness, get, post, sse_events, wait_for
from wire.protocol import Abort, DecodeRequest, PrefillRequest
from wire.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(30)
BODY = {"prompt": "slow river", "max_tokens": 4, "seed": 2, "return_token_ids": True}


def test_requests_beyond_max_pending_get_429_with_retry_after(tiny_model_dir, word_token_ids):
    slow = FakeBehaviour(event_delay_s=0.1)
    with RouterHarness(tiny_model_dir, word_token_ids, decode=slow, max_pending_requests=1) as router:
        statuses, retry_after = asyncio.run(one_slow_then_one_more(router.base_url))
        assert statuses == [200, 429] and retry_after == "1"
        assert post(router.base_url + "/v1/completions", BODY).status == 200
        too_many = post(router.base_url + "/v1/completions", {**BODY, "prompt": ["a", "b"]})
        assert too_many.status == 400 and "at most 1 prompts" in too_many.body["error"]["message"]


async def one_slow_then_one_more(base_url: str) -> tuple[list[int], str | None]:
    async with aiohttp.ClientSession(timeout=NO_CLIENT_TIMEOUT) as session:
        async with session.post(base_url + "/v1/completions", json={**BODY, "stream": True}) as slow:
            await slow.content.readline()
            async with session.post(base_url + "/v1/completions", json=BODY) as refused:
                body = await refused.json()
                assert body["error"]["code"] == 429
                retry_after = refused.headers.get("Retry-After")
                statuses = [slow.status, refused.status]
            await slow.read()
    return statuses, retry_after


@pytest.mark.parametrize(("role", "status"), [("prefill", 400), ("decode", 400), ("prefill", 503), ("decode", 503)])
def test_a_node_error_reply_passes_its_status_through(tiny_model_dir, word_token_ids, role, status):
    failing = FakeBehaviour(error=(status, "request refused"))
    with RouterHarness(tiny_model_dir, word_token_ids, **{role: failing}) as router:
        for stream in (False, True):
            reply = post(router.base_url + "/v1/completions", {**BODY, "stream": stream})
            assert reply.status == status and "request refused" in reply.body["error"]["message"]
        assert router.state.admission.in_flight == 0
        num_attempts = sum(len(node.request_ids(PrefillRequest)) for node in router.prefill_nodes)
        assert num_attempts == (2 if status == 400 else 6)


def test_a_silent_decode_node_times_out_with_504_and_is_aborted(tiny_model_dir, word_token_ids):
    with RouterHarness(tiny_model_dir, word_token_ids, num_decode=1, decode=FakeBehaviour(silent=True),
                       request_timeout_s=0.3) as router:
        router.wait_until_healthy()
        reply = post(router.base_url + "/v1/completions", BODY, headers={"X-Request-Id": "quiet"})
        assert reply.status == 504 and "sent nothing" in reply.body["error"]["message"]
        wait_for(lambda: "quiet-0" in router.decode_nodes[0].request_ids(Abort))


def test_a_missing_node_makes_health_503_and_requests_503(tiny_model_dir, word_token_ids, monkeypatch):
    monkeypatch.setattr("router.nodes.pool.PING_INTERVAL_S", 0.1)
    monkeypatch.setattr("router.nodes.client.HEALTHY_WITHIN_S", 0.5)
    with RouterHarness(tiny_model_dir, word_token_ids, request_timeout_s=0.3) as router:
        router.wait_until_healthy()
        router.call(router.decode_nodes[0].close)
        router.call(router.decode_nodes[1].close)
        router.call(lambda: asyncio.sleep(0.6))
        health = get(router.base_url + "/health")
        assert health.status == 503 and health.body["status"] == "unavailable"
        assert [n["healthy"] for n in health.body["nodes"]] == [True, True, False, False]
        assert post(router.base_url + "/v1/completions", BODY).status == 503


@pytest.mark.parametrize("stream", [False, True])
def test_a_decode_failure_is_retried_and_continues_exactly(tiny_model_dir, word_token_ids, tokenizer, stream):
    flaky = FakeBehaviour(fail_after_tokens=5)
    body = {**BODY, "max_tokens": 12, "logprobs": 1, "stream": stream}
    with RouterHarness(tiny_model_dir, word_token_ids, num_decode=1, decode=flaky) as router:
        reply = post(router.base_url + "/v1/completions", body, headers={"X-Request-Id": "flaky"})
        assert reply.status == 200
        token_ids, logprob_tokens = completion_tokens(reply.body, stream)
        prompt_ids = tokenizer.encode(BODY["prompt"])
        assert token_ids == expected_token_ids(word_token_ids, prompt_ids, 2, SamplingParams(max_tokens=12))
        assert logprob_tokens == [tokenizer.decode([t]) for t in token_ids]
        assert router.decode_nodes[0].request_ids(DecodeRequest) == ["flaky-0", "flaky-0:retry1"]


def completion_tokens(body, stream: bool) -> tuple[list[int], list[str]]:
    choices = [event["choices"][0] for event in sse_events(body)[:-1]] if stream else body["choices"]
    return ([t for c in choices for t in c["token_ids"]], [t for c in choices for t in c["logprobs"]["tokens"]])


def test_a_failure_that_persists_gives_up_after_three_attempts(tiny_model_dir, word_token_ids):
    broken = FakeBehaviour(fail_after_tokens=2, num_failures=10)
    with RouterHarness(tiny_model_dir, word_token_ids, num_decode=1, decode=broken) as router:
        reply = post(router.base_url + "/v1/completions", {**BODY, "max_tokens": 8}, headers={"X-Request-Id": "x"})
        assert reply.status == 503 and "KV read failed" in reply.body["error"]["message"]
        streamed = post(router.base_url + "/v1/completions", {**BODY, "max_tokens": 8, "stream": True})
        events = sse_events(streamed.body)
        assert streamed.status == 200 and events[-1] == "[DONE]" and events[-2]["error"]["code"] == 503
        assert sum(len(e["choices"][0]["token_ids"]) for e in events[:-2]) == 2
        assert len(router.decode_nodes[0].request_ids(DecodeRequest)) == 6


def test_a_stopping_router_ends_a_failed_request_at_once_without_retrying(tiny_model_dir, word_token_ids):
    """Once the router stops (NodePool.begin_closing), a failure ends its request: its launcher stopped the nodes
    first, and two more attempts would each wait for nodes that are not coming back. The inverse is the test above:
    the same failures, the router not stopping, take three attempts."""
    broken = FakeBehaviour(fail_after_tokens=2, num_failures=10)
    with RouterHarness(tiny_model_dir, word_token_ids, num_decode=1, decode=broken) as router:
        router.call(begin_closing(router))
        streamed = post(router.base_url + "/v1/completions", {**BODY, "max_tokens": 8, "stream": True})
        events = sse_events(streamed.body)
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 503
        assert len(router.decode_nodes[0].request_ids(DecodeRequest)) == 1


def begin_closing(router: RouterHarness):
    async def run() -> None:
        router.state.pool.begin_closing()
    return run


def test_the_router_s_stop_begins_closing_before_it_waits_for_open_streams(tiny_model_dir, word_token_ids):
    """aiohttp's cleanup (what SIGTERM runs) closes the pool for retries before it waits for the open requests: a
    stream whose node fails during the stop ends there (NOTE: the node fails 1 s of token delays after the first
    token, long after the stop began)."""
    failing = FakeBehaviour(event_delay_s=0.25, fail_after_tokens=5, num_failures=10)
    with RouterHarness(tiny_model_dir, word_token_ids, num_decode=1, decode=failing) as router:
        events = router.call(lambda: stream_through_the_stop(router), timeout_s=20)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 503
    assert len(router.decode_nodes[0].request_ids(DecodeRequest)) == 1


async def stream_through_the_stop(router: RouterHarness) -> list:
    async with aiohttp.ClientSession(timeout=NO_CLIENT_TIMEOUT) as session:
        body = {**BODY, "max_tokens": 20, "stream": True}
        async with session.post(router.base_url + "/v1/completions", json=body) as reply:
            first = await reply.content.readline()
            stopping = asyncio.create_task(router.stop())
            rest = await reply.read()
            await stopping
    return sse_events((first + rest).decode())


@pytest.mark.parametrize("params", [{"max_tokens": 1}, {"max_tokens": 5, "stop_token_ids": "FIRST"}])
def test_a_request_finished_by_its_first_token_skips_decode(tiny_model_dir, word_token_ids, tokenizer, params):
    prompt_ids = tokenizer.encode(BODY["prompt"])
    first = expected_token_ids(word_token_ids, prompt_ids, 2, SamplingParams(max_tokens=1))[0]
    params = {key: [first] if value == "FIRST" else value for key, value in params.items()}
    with RouterHarness(tiny_model_dir, word_token_ids) as router:
        reply = post(router.base_url + "/v1/completions", {**BODY, **params})
        choice = reply.body["choices"][0]
        assert choice["token_ids"] == [first] and choice["text"] == tokenizer.decode([first])
        assert choice["finish_reason"] == ("length" if params["max_tokens"] == 1 else "stop")
        assert all(not node.request_ids(DecodeRequest) for node in router.decode_nodes)


def test_at_the_defaults_a_burst_beyond_one_decode_pool_s_rows_is_queued_not_refused(tiny_model_dir, word_token_ids):
    """600 requests at once, each in flight for a while (a slow decode node): with the default limit every one is
    served, as vLLM's server queues them (its benchmark sends 1000 at once by default). Inverse: at the former
    default, 256, the rest got 429."""
    slow = FakeBehaviour(event_delay_s=0.05)

    async def burst(base_url: str, num_requests: int) -> list[int]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=NO_CLIENT_TIMEOUT, connector=connector) as session:
            async def one() -> int:
                async with session.post(base_url + "/v1/completions", json=BODY) as reply:
                    await reply.read()
                    return reply.status
            return await asyncio.gather(*(one() for _ in range(num_requests)))

    with RouterHarness(tiny_model_dir, word_token_ids, decode=slow) as router:
        router.wait_until_healthy()
        assert set(asyncio.run(burst(router.base_url, 600))) == {200}
    with RouterHarness(tiny_model_dir, word_token_ids, decode=slow, max_pending_requests=256) as router:
        router.wait_until_healthy()
        assert 429 in set(asyncio.run(burst(router.base_url, 600)))
