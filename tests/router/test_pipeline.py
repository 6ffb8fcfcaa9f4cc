"""The direct path (no HTTP): generate() over a NodePool, instance choice and reply demultiplexing."""

import asyncio

import pytest
import zmq.asyncio

from router.generation.pipeline import GenerationError, generate
from router.nodes.choice import least_loaded
from router.nodes.pool import NodePool
from tests.router.fake_nodes import FakeBehaviour, FakeDecode, FakePrefill, expected_token_ids
from wire.config import RouterConfig
from wire.protocol import DecodeRequest, ModelFacts, PrefillRequest
from wire.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(30)
FACTS = ModelFacts(max_model_len=1024, vocab_size=4096, max_logprobs=20)


async def with_cluster(candidate_ids, body, *, num_prefill=2, num_decode=2, decode=FakeBehaviour(),
                       prefill=FakeBehaviour(), timeout_s=5.0):
    """Start fake nodes and a NodePool, run body(pool, prefills, decodes), close everything."""
    context = zmq.asyncio.Context()
    prefills = [FakePrefill("prefill", f"p{i}", candidate_ids, prefill, FACTS) for i in range(num_prefill)]
    decodes = [FakeDecode("decode", f"d{i}", candidate_ids, decode, FACTS) for i in range(num_decode)]
    addresses = [await node.start(context) for node in (*prefills, *decodes)]
    config = RouterConfig(model="unused", prefill_addresses=tuple(addresses[:num_prefill]),
                          decode_addresses=tuple(addresses[num_prefill:]), request_timeout_s=timeout_s)
    pool = NodePool(config)
    await pool.start()
    try:
        return await asyncio.wait_for(body(pool, prefills, decodes), 10)
    finally:
        await pool.close()
        await asyncio.gather(*(node.close() for node in (*prefills, *decodes)))
        context.term()


async def collect(pool, request_id, prompt, params, seed) -> tuple[list[int], str]:
    token_ids, finish_reason = [], None
    async for event in generate(pool, request_id, prompt, params, seed):
        token_ids += event.token_ids
        finish_reason = event.finish_reason
    return token_ids, finish_reason


def test_generate_streams_prefill_then_decode_tokens(word_token_ids):
    params = SamplingParams(max_tokens=9, logprobs=1)

    async def body(pool, prefills, decodes):
        return await collect(pool, "direct", [5, 6, 7], params, 99)

    token_ids, finish_reason = asyncio.run(with_cluster(word_token_ids, body))
    assert token_ids == expected_token_ids(word_token_ids, [5, 6, 7], 99, params)
    assert finish_reason == "length"


def test_concurrent_requests_are_demultiplexed_and_spread(word_token_ids):
    params = SamplingParams(max_tokens=12)
    prompts = [[i, i + 1] for i in range(1, 9)]

    async def body(pool, prefills, decodes):
        await pool.wait_until_healthy(5.0)  # NOTE: healthy nodes are preferred; before all answered, not spread
        outputs = await asyncio.gather(*(collect(pool, f"r{i}", p, params, i) for i, p in enumerate(prompts)))
        loads = [len(node.request_ids(PrefillRequest)) for node in prefills]
        return outputs, loads, [len(node.request_ids(DecodeRequest)) for node in decodes]

    outputs, prefill_loads, decode_loads = asyncio.run(with_cluster(word_token_ids, body,
                                                                     decode=FakeBehaviour(event_delay_s=0.01)))
    for i, (prompt, (token_ids, _)) in enumerate(zip(prompts, outputs, strict=True)):
        assert token_ids == expected_token_ids(word_token_ids, prompt, i, params)
    assert prefill_loads == [4, 4] and decode_loads == [4, 4]


def test_an_error_reply_becomes_a_generation_error_with_its_status(word_token_ids):
    async def body(pool, prefills, decodes):
        with pytest.raises(GenerationError) as caught:
            await collect(pool, "fails", [1, 2], SamplingParams(max_tokens=3), 1)
        return caught.value

    error = asyncio.run(with_cluster(word_token_ids, body, prefill=FakeBehaviour(error=(400, "prompt too long"))))
    assert error.status == 400 and "prompt too long" in error.message


def test_the_node_choice_is_given_the_prompt_its_samples_and_its_id(word_token_ids):
    """What a policy routing on the prompt would need: generate() hands each choice the request's id, prompt token
    ids and n."""
    from tests.router.test_choose_path import RecordingPolicy

    params = SamplingParams(max_tokens=3, n=2)

    async def body(pool, prefills, decodes):
        pool.policy = RecordingPolicy()
        async for _ in generate(pool, "seen", [5, 6, 7], params, 1):
            pass
        return pool.policy.asked

    asked = asyncio.run(with_cluster(word_token_ids, body))
    assert [role for role, _ in asked] == ["colocated", "prefill", "decode"]
    assert {(request.request_id, tuple(request.prompt_token_ids), request.n) for _, request in asked} == {
        ("seen", (5, 6, 7), 2)}


def test_least_loaded_prefers_less_work_then_the_lowest_index():
    async def body():
        pool = NodePool(RouterConfig(model="unused", prefill_addresses=("tcp://127.0.0.1:9",) * 3,
                                     decode_addresses=("tcp://127.0.0.1:9",)))
        nodes = pool.prefill_nodes
        picks = [least_loaded(nodes).index]
        with nodes[0].open_request("a", work=100):
            picks.append(least_loaded(nodes).index)
            with nodes[1].open_request("b", work=30), nodes[2].open_request("c", work=20):
                picks.append(least_loaded(nodes).index)
        picks.append(least_loaded(nodes).index)
        await pool.close()
        return picks

    assert asyncio.run(body()) == [0, 1, 2, 0]


def test_a_samples_queued_events_merge_into_one_and_nothing_else_does():
    """When the consumer fell behind, a sample's TokenEvents queued behind the first become one (one delta, one
    chunk); another sample's event, a finished sample and a logprobs mismatch stop the merge."""
    from router.generation.pipeline import take_queued_tokens
    from router.nodes.client import ReplyQueue
    from wire.outputs import TokenLogprobs
    from wire.protocol import TokenEvent

    def logprobs(token_id):
        return [TokenLogprobs(token_id, -0.5)]

    async def scenario():
        queue = ReplyQueue()
        for event in (TokenEvent("r", [2], logprobs(2)), TokenEvent("r", [3], logprobs(3), "length"),
                      TokenEvent("r", [4], logprobs(4))):
            queue.put_nowait(event)
        merged = take_queued_tokens(TokenEvent("r", [1], logprobs(1)), queue)
        assert merged.token_ids == [1, 2, 3] and [lp.token_id for lp in merged.logprobs] == [1, 2, 3]
        assert merged.finish_reason == "length" and queue.qsize() == 1  # NOTE: nothing merges past a finish
        queue = ReplyQueue()
        for event in (TokenEvent("r", [2], None, index=1), TokenEvent("r", [3], None)):
            queue.put_nowait(event)
        assert take_queued_tokens(TokenEvent("r", [1], None), queue).token_ids == [1]  # NOTE: sample 1 is next
        queue = ReplyQueue()
        queue.put_nowait(TokenEvent("r", [2], None))
        assert take_queued_tokens(TokenEvent("r", [1], logprobs(1)), queue).token_ids == [1]
        assert take_queued_tokens(TokenEvent("r", [1], None), ReplyQueue()).token_ids == [1]

    asyncio.run(scenario())


def test_a_wait_ends_with_silent_at_its_deadline_or_on_an_unhealthy_node_and_a_stale_silent_is_skipped():
    """The node's watchdog (one per node, not a timer per wait) ends a wait past its timeout, or one on a node
    that stopped answering, with SILENT; a SILENT that queued behind the reply that ended its wait is dropped.
    Inverse: a healthy node's wait inside its timeout is left alone."""
    from router.nodes.client import SILENT, UNHEALTHY_WAIT_S, ReplyQueue
    from wire.protocol import TokenEvent

    async def scenario():
        loop = asyncio.get_running_loop()
        queue = ReplyQueue()
        waiting = asyncio.ensure_future(queue.next_within(timeout_s=10.0))
        await asyncio.sleep(0)
        queue.end_wait_if_silent(loop.time() + 1.0, node_healthy=True)
        await asyncio.sleep(0)
        assert not waiting.done()  # NOTE: inverse: healthy, inside the timeout
        queue.end_wait_if_silent(loop.time() + UNHEALTHY_WAIT_S, node_healthy=False)
        assert await waiting is SILENT
        waiting = asyncio.ensure_future(queue.next_within(timeout_s=2.0))
        await asyncio.sleep(0)
        queue.end_wait_if_silent(loop.time() + 2.0, node_healthy=True)
        assert await waiting is SILENT
        # NOTE: a reply and the watchdog in the same turn: the reply ends the wait, its SILENT is stale
        waiting = asyncio.ensure_future(queue.next_within(timeout_s=2.0))
        await asyncio.sleep(0)
        queue.put_nowait(TokenEvent("r", [1], None))
        queue.end_wait_if_silent(loop.time() + 2.0, node_healthy=True)
        assert (await waiting).token_ids == [1]
        queue.put_nowait(TokenEvent("r", [2], None))
        assert (await queue.next_within(timeout_s=2.0)).token_ids == [2]
        assert queue.empty()

    asyncio.run(scenario())


def test_a_silent_node_fails_the_request_within_a_watch_interval_of_its_timeout():
    """A decode node that never answers: a 504 (it still answers pings) at the request timeout, not before and not
    much later."""
    import time

    from router.nodes.client import WATCH_INTERVAL_S

    async def body(pool, prefills, decodes):
        await pool.wait_until_healthy(5)
        start = time.monotonic()
        with pytest.raises(GenerationError) as error:
            await collect(pool, "silent", [1, 2, 3], SamplingParams(max_tokens=4), seed=0)
        return error.value.status, time.monotonic() - start

    status, seconds = asyncio.run(with_cluster([5, 6, 7], body, num_prefill=1, num_decode=1,
                                               decode=FakeBehaviour(silent=True), timeout_s=1.0))
    assert status == 504 and 1.0 <= seconds <= 1.0 + WATCH_INTERVAL_S + 1.0
