"""A node that dies or restarts in place: the requests open on it fail over at once, never hang."""

import concurrent.futures
import os
import subprocess
import sys
import time

import pytest
import zmq.asyncio

from router.nodes.client import NodeClient
from tests.router.fake_nodes import FakeBehaviour, FakeDecode, expected_token_ids
from tests.router.harness import RouterHarness, model_facts, post, wait_for
from wire.protocol import DecodeRequest, InstanceGone, Pong
from wire.sampling_params import SamplingParams

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.timeout(120)  # NOTE: a hang guard with room for a loaded host
BODY = {"prompt": "slow river", "max_tokens": 4, "seed": 2, "return_token_ids": True}


def test_a_pong_from_another_instance_fails_the_open_requests_over(tiny_model_dir, word_token_ids):
    """The node restarted so fast that no ping was missed: only its instance id tells."""
    with RouterHarness(tiny_model_dir, word_token_ids, num_decode=1, decode=FakeBehaviour(silent=True),
                       request_timeout_s=20) as router:
        router.wait_until_healthy()
        [decode] = router.decode_nodes
        pool = concurrent.futures.ThreadPoolExecutor(1)
        pending = pool.submit(post, router.base_url + "/v1/completions", BODY)
        wait_for(lambda: decode.request_ids(DecodeRequest), timeout_s=5)
        start = time.monotonic()
        decode.behaviour = FakeBehaviour()  # NOTE: the new process serves; the old one's requests are gone
        decode.instance_id = "instance-2"
        reply = pending.result()  # NOTE: the request timeout (20 s) ends it if the failover does not
        assert reply.status == 200 and len(reply.body["choices"][0]["token_ids"]) == 4
        # NOTE: a ping or two (~1 s); the bound only has to tell that from the 20 s request timeout, on any load
        assert time.monotonic() - start < 10
        assert router.state.pool.decode_nodes[0].num_lost == 1


def test_a_restarted_node_fails_over_only_the_requests_sent_to_its_previous_instance(tiny_model_dir, word_token_ids,
                                                                                   tokenizer):
    """Issue 23: the new instance's first Pong failed every open request, the retries just sent to it included. The
    connection's close failed the old instance's requests over; what was sent since went to the new one."""
    with RouterHarness(tiny_model_dir, word_token_ids, num_decode=1, decode=FakeBehaviour(silent=True),
                       request_timeout_s=60) as router:
        router.wait_until_healthy()
        [old] = router.decode_nodes
        pool = concurrent.futures.ThreadPoolExecutor(1)
        body = {**BODY, "max_tokens": 12}
        pending = pool.submit(post, router.base_url + "/v1/completions", body, headers={"X-Request-Id": "r"})
        wait_for(lambda: old.request_ids(DecodeRequest), timeout_s=5)
        # NOTE: the restart: the old process is gone (its connection closes), a new one serves on its address,
        # slowly enough that the router's next ping reaches it while the retry streams
        new = FakeDecode("decode", old.node_id, word_token_ids, FakeBehaviour(event_delay_s=0.3), old.model_facts)
        new.instance_id = "instance-2"
        router.call(old.close)
        router.decode_nodes[0] = new
        router.call(lambda: new.start(router._context, old.address))
        reply = pending.result()
        prompt = tokenizer.encode(body["prompt"])
        expected = expected_token_ids(word_token_ids, prompt, body["seed"], SamplingParams(max_tokens=12))
        assert reply.status == 200 and reply.body["choices"][0]["token_ids"] == expected
        assert old.request_ids(DecodeRequest) == ["r-0"] and new.request_ids(DecodeRequest) == ["r-0:retry1"]
        assert router.state.pool.decode_nodes[0].num_lost == 1  # NOTE: its connection's close, and only that


def test_without_an_instance_change_the_silent_request_waits(tiny_model_dir, word_token_ids):
    """The inverse: the same silent node, same instance: nothing fails the request over (it times out)."""
    with RouterHarness(tiny_model_dir, word_token_ids, num_decode=1, decode=FakeBehaviour(silent=True),
                       request_timeout_s=1.5) as router:
        router.wait_until_healthy()
        start = time.monotonic()
        reply = post(router.base_url + "/v1/completions", BODY)
        assert reply.status == 504 and time.monotonic() - start >= 1.4
        assert router.state.pool.decode_nodes[0].num_lost == 0


def test_a_request_for_a_role_whose_every_node_is_down_ends_with_a_503_not_silence(tiny_model_dir, word_token_ids,
                                                                                  monkeypatch):
    monkeypatch.setattr("router.generation.pipeline.UNREACHABLE_AFTER_S", 1.0)
    with RouterHarness(tiny_model_dir, word_token_ids, num_decode=1, request_timeout_s=120) as router:
        router.wait_until_healthy()
        router.call(router.decode_nodes[0].close)  # NOTE: the only decode node is gone (and not coming back)
        wait_for(lambda: not router.state.pool.decode_nodes[0].healthy, timeout_s=5)
        start = time.monotonic()
        reply = post(router.base_url + "/v1/completions", BODY)
        elapsed = time.monotonic() - start
        assert reply.status == 503 and "unreachable" in reply.body["error"]["message"]
        assert 2.5 < elapsed < 60  # NOTE: three attempts of ~1 s each, far below the 120 s request timeout


def instance_gone_notices(router) -> list[list[InstanceGone]]:
    """What each fake prefill node was told of gone decode processes."""
    return [[m for m in prefill.received if isinstance(m, InstanceGone)] for prefill in router.prefill_nodes]


def test_a_decode_node_restarted_in_place_has_every_prefill_node_told_its_previous_process_is_gone(tiny_model_dir,
                                                                                                word_token_ids):
    """Issue 23: a killed decode process's claimed leases held prefill KV until their deadline. Its connection
    closing and its silence prove nothing (a stopped process does both, then resumes and reads): no notice. Another
    instance answering on its address does (it bound the address only once the old process let it go): every prefill
    node is told which process is gone, once. A prefill node restarting tells nobody (only decode nodes claim)."""
    with RouterHarness(tiny_model_dir, word_token_ids, num_prefill=2, num_decode=1) as router:
        router.wait_until_healthy()
        [old] = router.decode_nodes
        router.call(old.close)
        wait_for(lambda: not router.state.pool.decode_nodes[0].healthy, timeout_s=10)
        time.sleep(1.5)  # NOTE: a ping interval and more
        assert instance_gone_notices(router) == [[], []]
        new = FakeDecode("decode", old.node_id, word_token_ids, FakeBehaviour(), old.model_facts)
        new.instance_id = "instance-2"
        router.decode_nodes[0] = new
        router.call(lambda: new.start(router._context, old.address))
        wait_for(lambda: all(instance_gone_notices(router)), timeout_s=10)
        router.prefill_nodes[0].instance_id = "instance-2"  # NOTE: a prefill node restarted unseen
        wait_for(lambda: router.state.pool.prefill_nodes[0].status().pong.instance_id == "instance-2", timeout_s=10)
        time.sleep(1.5)
        assert instance_gone_notices(router) == [[InstanceGone("fake-decode-0", "instance-1")]] * 2


def test_a_late_pong_of_a_replaced_process_is_not_taken_for_the_live_one_being_gone(tiny_model_dir):
    """A Pong answering an older ping than the latest one taken is stale: taken, the replaced process' late Pong
    would read as a restart, and the live process would be declared gone (its leases freed while it reads them)."""
    gone = []
    node = NodeClient(zmq.asyncio.Context(), "decode", 0, "tcp://127.0.0.1:1",
                      instance_gone=lambda client, pong: gone.append(pong.instance_id))
    facts = model_facts(tiny_model_dir)

    def pong(nonce: int, instance_id: str) -> Pong:
        return Pong(nonce, "decode-0", "decode", "fingerprint", facts, instance_id=instance_id)

    for nonce, instance_id in ((4, "instance-1"), (5, "instance-1"), (7, "instance-2"), (6, "instance-1"),
                               (8, "instance-2")):
        node._take_pong(pong(nonce, instance_id))
    assert gone == ["instance-1"] and node.status().pong == pong(8, "instance-2") and node.num_lost == 1


CLOSE_LOOP = """
import asyncio, sys, zmq, zmq.asyncio
from router.nodes.client import NodeClient

async def main(cycles):
    context = zmq.asyncio.Context()
    node = context.socket(zmq.ROUTER)
    port = node.bind_to_random_port("tcp://127.0.0.1")
    for cycle in range(cycles):
        client = NodeClient(context, "decode", 0, f"tcp://127.0.0.1:{port}")
        client.start()
        await asyncio.sleep(0.002 if cycle % 2 else 0)  # NOTE: closed before and after its connection is up
        await client.close()
    print("closed", cycles)

asyncio.run(main(int(sys.argv[1])))
"""


def test_a_node_client_always_closes():
    """A node removed (`corun scale`) or a router stopping closes its NodeClients. Stopping the socket's monitor after
    the monitor's own socket had closed could hang for good, inside libzmq and holding the GIL: the whole process
    froze (a suite run's worker did; with the receive loop draining queued replies, 300 start/close cycles hung every
    time). In a child process, so that a hang fails the test instead of freezing this one."""
    result = subprocess.run([sys.executable, "-c", CLOSE_LOOP, "300"], capture_output=True, text=True, timeout=60,
                            cwd=REPO)
    assert result.returncode == 0 and result.stdout.strip() == "closed 300", result.stderr
