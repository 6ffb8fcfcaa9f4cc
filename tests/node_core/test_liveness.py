"""Issue 23, finding 6: a node whose forward lasts longer than the router's liveness timeout is busy, not dead: its
pings are answered meanwhile (node_core/liveness.py), and what else arrives meanwhile is served after the forward."""

import threading
import time

import pytest
import zmq

from colocated_node.server import ColocatedServer
from launch.local import free_port
from node_core.liveness import BUSY_FORWARD_S
from prefill_node.server import PrefillServer
from router.nodes.client import HEALTHY_WITHIN_S
from wire import protocol
from wire.config import CacheConfig, EngineConfig, NodeConfig, SchedulerConfig
from wire.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(120)
FORWARD_S = HEALTHY_WITHIN_S + 2
"""The slow forward: longer than a Pong may be old before the router counts the node as gone."""


def node_with_slow_forwards(model_dir: str, forward_s: float, node_id: str,
                            server_class=PrefillServer, role: str = "prefill") -> PrefillServer:
    """A prefill (or role's) node whose prefill forwards each take forward_s (a long prompt on a loaded host), its
    loop in a thread (stop_node ends both)."""
    engine = EngineConfig(model=model_dir, num_threads=1, cache=CacheConfig(num_blocks=64),
                          scheduler=SchedulerConfig(max_num_seqs=8, max_model_len=256, prefill_chunk_size=64))
    node = server_class(NodeConfig(role, node_id, engine, port=free_port("127.0.0.1")))
    forward = node.runner.run_prefill

    def slow_forward(chunks):
        time.sleep(forward_s)  # NOTE: releases the GIL, as torch's forwards do
        return forward(chunks)

    node.runner.run_prefill = slow_forward
    node.stopping = threading.Event()
    node.loop = threading.Thread(target=lambda: [node.step() for _ in iter(node.stopping.is_set, True)], daemon=True)
    node.loop.start()
    return node


def stop_node(node: PrefillServer) -> None:
    node.stopping.set()
    node.loop.join(30)
    node.close()


@pytest.fixture
def slow_node(tiny_model_dir):
    """Forwards longer than a Pong may be old before the router counts the node as gone."""
    node = node_with_slow_forwards(tiny_model_dir, FORWARD_S, "prefill-busy")
    yield node
    stop_node(node)


def prefill(request_id: str) -> protocol.PrefillRequest:
    params = SamplingParams(temperature=0.6, seed=3, max_tokens=8, ignore_eos=True)
    return protocol.PrefillRequest(request_id, list(range(10, 50)), params)


def test_a_node_in_a_forward_longer_than_the_liveness_timeout_keeps_answering_pings(slow_node):
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(slow_node.config.address)
    socket.send(protocol.encode(prefill("long")))
    pong_times, results, nonce, forward_seconds = [time.monotonic()], [], 0, []
    deadline = time.monotonic() + 4 * FORWARD_S + 30
    while len(results) < 2 and time.monotonic() < deadline:
        nonce += 1
        socket.send(protocol.encode(protocol.Ping(nonce)))
        if nonce == 3:  # NOTE: arrives mid-forward: the loop serves it once the forward ends
            socket.send(protocol.encode(prefill("second")))
        while socket.poll(200):
            reply = protocol.decode(socket.recv_multipart()[-1])
            if isinstance(reply, protocol.Pong):
                pong_times.append(time.monotonic())
                forward_seconds.append(reply.stats["forward_running_seconds"])
            else:
                results.append(reply)
    socket.close()
    assert [type(r).__name__ for r in results] == ["PrefillResult", "PrefillResult"]
    assert [r.request_id for r in results] == ["long", "second"]
    gaps = [later - earlier for earlier, later in zip(pong_times, pong_times[1:])]
    assert max(gaps) < HEALTHY_WITHIN_S, f"a {max(gaps):.1f} s silence: the router would count the node as gone"
    assert slow_node.pings_while_busy.num_answered > 0
    assert max(forward_seconds) > BUSY_FORWARD_S  # NOTE: what an operator sees of a loop stuck in a forward


CLAIM_FORWARD_S = 1.5


def claim_wait(node: PrefillServer) -> float:
    """Seconds a decode node's ClaimKV, sent while the node runs another prompt's forward, waits for its reply."""
    router, decode = (zmq.Context.instance().socket(zmq.DEALER) for _ in range(2))
    try:
        for socket in (router, decode):
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(node.config.address)
        router.send(protocol.encode(prefill("leased")))
        assert router.poll(30_000) and isinstance(protocol.decode(router.recv_multipart()[-1]),
                                                  protocol.PrefillResult)
        router.send(protocol.encode(prefill("running")))
        deadline = time.monotonic() + 10
        while node.forward_started is None:  # NOTE: the second prompt's forward has begun
            assert time.monotonic() < deadline
            time.sleep(0.005)
        sent = time.monotonic()
        decode.send(protocol.encode(protocol.ClaimKV("leased", "decode-0", "a" * 32)))
        assert decode.poll(30_000)
        reply = protocol.decode(decode.recv_multipart()[-1])
        assert isinstance(reply, protocol.ClaimReply) and reply.ok, reply
        return time.monotonic() - sent
    finally:
        router.close()
        decode.close()
        stop_node(node)


class PrefillServerClaimingBetweenForwards(PrefillServer):
    handled_during_forward = frozenset()


def test_a_claim_is_answered_while_a_prefill_forward_runs(tiny_model_dir):
    """A decode node's claim does not wait out the prefill node's forward (node_core/liveness.py). Inverse: a node
    that handles claims only between forwards answers after the forward."""
    node = node_with_slow_forwards(tiny_model_dir, CLAIM_FORWARD_S, "prefill-claims")
    waited = claim_wait(node)
    assert waited < CLAIM_FORWARD_S / 3, f"the claim waited {waited:.2f} s, as long as the forward"
    assert node.pings_while_busy.num_handled == 1
    waited = claim_wait(node_with_slow_forwards(tiny_model_dir, CLAIM_FORWARD_S, "prefill-claims",
                                                PrefillServerClaimingBetweenForwards))
    assert waited > CLAIM_FORWARD_S / 2, "inverse: the claim was answered during the forward without the rule"


INTAKE_FORWARD_S = 1.5


def taken_in_during_forward(node, first, second, queued) -> bool:
    """Whether the second request, sent while the first one's forward runs, is queued on the node (queued(node))
    before that forward ends."""
    router = zmq.Context.instance().socket(zmq.DEALER)
    try:
        router.setsockopt(zmq.LINGER, 0)
        router.connect(node.config.address)
        router.send(protocol.encode(first))
        deadline = time.monotonic() + 10
        while node.forward_started is None:
            assert time.monotonic() < deadline, "the first request's forward did not start"
            time.sleep(0.005)
        started = node.forward_started
        router.send(protocol.encode(second))
        while node.forward_started == started and not queued(node):
            time.sleep(0.005)
        return node.forward_started == started and queued(node)
    finally:
        router.close()
        stop_node(node)


class PrefillServerTakingPromptsBetweenForwards(PrefillServer):
    handled_during_forward = frozenset({protocol.ClaimKV})


class ColocatedServerTakingRequestsBetweenForwards(ColocatedServer):
    handled_during_forward = frozenset()


def generate(request_id: str) -> protocol.GenerateRequest:
    params = SamplingParams(temperature=0.6, seed=3, max_tokens=8, ignore_eos=True)
    return protocol.GenerateRequest(request_id, list(range(10, 50)), params)


def test_a_prompt_is_taken_in_while_a_prefill_forward_runs(tiny_model_dir):
    """A burst's prompts are queued while the forward before them runs, not between forwards with the GPU idle.
    Inverse: a node that takes them in only between forwards queues the prompt after the forward."""
    def queued(node):
        return any(pending.request.request_id == "second" for pending in list(node.waiting))

    node = node_with_slow_forwards(tiny_model_dir, INTAKE_FORWARD_S, "prefill-intake")
    assert taken_in_during_forward(node, prefill("first"), prefill("second"), queued)
    node = node_with_slow_forwards(tiny_model_dir, INTAKE_FORWARD_S, "prefill-intake",
                                   PrefillServerTakingPromptsBetweenForwards)
    assert not taken_in_during_forward(node, prefill("first"), prefill("second"), queued)


def test_a_request_is_taken_in_while_a_colocated_forward_runs(tiny_model_dir):
    """The colocated node's requests too. Inverse: taken in only between forwards, after the forward."""
    def queued(node):
        return any(sample.request_id == "second" for sample in list(node.samples.values()))

    node = node_with_slow_forwards(tiny_model_dir, INTAKE_FORWARD_S, "colocated-intake", ColocatedServer,
                                   role="colocated")
    assert taken_in_during_forward(node, generate("first"), generate("second"), queued)
    node = node_with_slow_forwards(tiny_model_dir, INTAKE_FORWARD_S, "colocated-intake",
                                   ColocatedServerTakingRequestsBetweenForwards, role="colocated")
    assert not taken_in_during_forward(node, generate("first"), generate("second"), queued)
