"""429 on overload, node errors passed through, silent nodes timed out: the router answers and keeps serving."""

import asyncio

import aiohttp
import pytest

from corun.protocol import Abort
from tests.router.fake_nodes import FakeBehaviour
from tests.router.harness import RouterHarness, get, post, wait_for

pytestmark = pytest.mark.timeout(30)
BODY = {"prompt": "slow river", "max_tokens": 4, "seed": 2}


def test_requests_beyond_max_pending_get_429_with_retry_after(tiny_model_dir, word_token_ids):
    slow = FakeBehaviour(event_delay_s=0.1)
    with RouterHarness(tiny_model_dir, word_token_ids, decode=slow, max_pending_requests=1) as router:
        statuses, retry_after = asyncio.run(one_slow_then_one_more(router.base_url))
        assert statuses == [200, 429] and retry_after == "1"
        assert post(router.base_url + "/v1/completions", BODY).status == 200
        too_many = post(router.base_url + "/v1/completions", {**BODY, "prompt": ["a", "b"]})
        assert too_many.status == 400 and "at most 1 prompts" in too_many.body["error"]["message"]


async def one_slow_then_one_more(base_url: str) -> tuple[list[int], str | None]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        async with session.post(base_url + "/v1/completions", json={**BODY, "stream": True}) as slow:
            await slow.content.readline()
            async with session.post(base_url + "/v1/completions", json=BODY) as refused:
                body = await refused.json()
                assert body["error"]["code"] == 429
                retry_after = refused.headers.get("Retry-After")
                statuses = [slow.status, refused.status]
            await slow.read()
    return statuses, retry_after


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_node_error_reply_passes_its_status_through(tiny_model_dir, word_token_ids, role):
    failing = FakeBehaviour(error=(503, "no free KV blocks"))
    with RouterHarness(tiny_model_dir, word_token_ids, **{role: failing}) as router:
        for stream in (False, True):
            reply = post(router.base_url + "/v1/completions", {**BODY, "stream": stream})
            assert reply.status == 503 and "no free KV blocks" in reply.body["error"]["message"]
        assert router.state.admission.in_flight == 0


def test_a_silent_decode_node_times_out_with_504_and_is_aborted(tiny_model_dir, word_token_ids):
    with RouterHarness(tiny_model_dir, word_token_ids, num_decode=1, decode=FakeBehaviour(silent=True),
                       request_timeout_s=0.3) as router:
        router.wait_until_healthy()
        reply = post(router.base_url + "/v1/completions", BODY, headers={"X-Request-Id": "quiet"})
        assert reply.status == 504 and "sent nothing" in reply.body["error"]["message"]
        wait_for(lambda: "quiet-0" in router.decode_nodes[0].request_ids(Abort))


def test_a_missing_node_makes_health_503_and_requests_503(tiny_model_dir, word_token_ids, monkeypatch):
    monkeypatch.setattr("router.nodes.PING_INTERVAL_S", 0.1)
    monkeypatch.setattr("router.nodes.HEALTHY_WITHIN_S", 0.5)
    with RouterHarness(tiny_model_dir, word_token_ids, request_timeout_s=0.3) as router:
        router.wait_until_healthy()
        router.call(router.decode_nodes[0].close)
        router.call(router.decode_nodes[1].close)
        router.call(lambda: asyncio.sleep(0.6))
        health = get(router.base_url + "/health")
        assert health.status == 503 and health.body["status"] == "unavailable"
        assert [n["healthy"] for n in health.body["nodes"]] == [True, True, False, False]
        assert post(router.base_url + "/v1/completions", BODY).status == 503
