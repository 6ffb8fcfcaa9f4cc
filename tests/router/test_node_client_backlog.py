"""A router behind its offered load: what it reads late must not make a healthy node look gone, and one node's
backlog must not hold the event loop (found on the H200 host: 2048 streams into one router, 260 requests failed)."""

import asyncio
import contextlib
import time

import pytest
import zmq
import zmq.asyncio

from router.generation.pipeline import silence_error
from router.nodes import client as node_client
from router.nodes.client import NodeClient
from wire.protocol import ModelFacts, Ping, Pong, StepTokens, TokenEvent, encode

pytestmark = pytest.mark.timeout(30)
FACTS = ModelFacts(max_model_len=1024, vocab_size=4096, max_logprobs=20)


async def connected_pair(context: zmq.asyncio.Context) -> tuple[NodeClient, zmq.asyncio.Socket, bytes]:
    """A NodeClient and the node's ROUTER socket (played by the test), after one Ping and its Pong."""
    node = context.socket(zmq.ROUTER)
    node.setsockopt(zmq.LINGER, 0)
    address = f"tcp://127.0.0.1:{node.bind_to_random_port('tcp://127.0.0.1')}"
    client = NodeClient(context, "decode", 0, address)
    client.start()
    identity = None
    for _ in range(50):  # NOTE: a Ping posted before the connection is up is dropped (zmq IMMEDIATE): post again
        client.post(Ping(1))
        with contextlib.suppress(asyncio.TimeoutError):
            identity, _ = await asyncio.wait_for(node.recv_multipart(), 0.1)
            break
    assert identity is not None, "the node never heard the client's Ping"
    await node.send_multipart([identity, encode(Pong(1, "d0", "decode", "fp", FACTS))])
    deadline = time.monotonic() + 5
    while not client.healthy:
        assert time.monotonic() < deadline, "the client never became healthy"
        await asyncio.sleep(0.01)
    return client, node, identity


def step(request_id: str = "nobody") -> bytes:
    return encode(StepTokens([TokenEvent(request_id, [7], None)]))


def test_a_node_heard_from_stays_healthy_without_pongs_and_a_silent_one_does_not(monkeypatch):
    """Messages of any kind show the node alive: a Pong read late, behind its StepTokens, is no silence. Inverse:
    once nothing is heard for HEALTHY_WITHIN_S, the node is unhealthy."""
    window_s = 1.0
    monkeypatch.setattr(node_client, "HEALTHY_WITHIN_S", window_s)

    async def scenario():
        context = zmq.asyncio.Context()
        client, node, identity = await connected_pair(context)
        try:
            start = time.monotonic()
            while time.monotonic() - start < 2.5 * window_s:  # NOTE: StepTokens only, no Pong
                await node.send_multipart([identity, step()])
                await asyncio.sleep(0.1)
                assert client.healthy
            await asyncio.sleep(1.3 * window_s)
            assert not client.healthy
            await node.send_multipart([identity, step()])
            deadline = time.monotonic() + 5
            while not client.healthy:
                assert time.monotonic() < deadline, "heard again, yet still unhealthy"
                await asyncio.sleep(0.01)
        finally:
            await client.close()
            node.close()
            context.destroy(linger=0)

    asyncio.run(scenario())


@pytest.mark.parametrize("turn_s, bounded", [(node_client.RECEIVE_TURN_S, True), (60.0, False)])
def test_a_backlog_of_slow_messages_leaves_the_event_loop_to_other_tasks(monkeypatch, turn_s, bounded):
    """40 queued messages of 30 ms each: the receive loop yields after RECEIVE_TURN_S, so a ticker waits about one
    message at a time. Inverse (no time bound, as before): it waits for the whole run of messages."""
    monkeypatch.setattr(node_client, "RECEIVE_TURN_S", turn_s)
    per_message_s, num_messages = 0.03, 40

    def slow_dispatch(message):
        end = time.perf_counter() + per_message_s
        while time.perf_counter() < end:
            pass

    async def scenario():
        context = zmq.asyncio.Context()
        client, node, identity = await connected_pair(context)
        client._dispatch = slow_dispatch
        try:
            for _ in range(num_messages):
                await node.send_multipart([identity, step()])
            ticks, start = [], time.perf_counter()
            while time.perf_counter() - start < per_message_s * num_messages + 0.3:
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.001)
            return max(b - a for a, b in zip(ticks, ticks[1:]))
        finally:
            await client.close()
            node.close()
            context.destroy(linger=0)

    longest_gap = asyncio.run(scenario())
    whole_run = per_message_s * num_messages
    if bounded:
        assert longest_gap < whole_run / 2, f"the loop was held {longest_gap * 1e3:.0f} ms"
    else:
        assert longest_gap >= whole_run * 0.75, f"the loop was held only {longest_gap * 1e3:.0f} ms"


def test_a_wait_ended_by_the_node_s_silence_is_a_503_even_once_it_is_heard_again():
    """The watchdog ended the wait because the node stopped answering; by the time the error is built the node may
    answer again: still a 503 "stopped answering", never a 504 claiming the whole timeout passed. Inverse: a wait
    that reached its deadline on a healthy node is a 504."""

    class Healthy:
        healthy, name, address = True, "decode node d0", "tcp://127.0.0.1:1"

    stopped = silence_error(Healthy(), 600.0, stopped_answering=True)
    timed_out = silence_error(Healthy(), 600.0, stopped_answering=False)
    assert (stopped.status, timed_out.status) == (503, 504)
    assert "stopped answering" in str(stopped) and "600 s" in str(timed_out)
