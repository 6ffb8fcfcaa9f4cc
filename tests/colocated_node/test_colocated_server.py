"""The colocated server in-process: its waiting prompts start tenant by tenant (each tenant's in arrival order, those
the prefix cache serves first)."""

import subprocess
import sys
import time

import pytest

from colocated_node.server import ColocatedServer
from corun.shared_weights import SharedWeightsError, WeightsWatch
from launch.local import free_port
from tests.node_sockets import router_socket, small_engine
from wire import protocol
from wire.config import NodeConfig
from wire.cuda_ipc import process_state
from wire.sampling_params import SamplingParams


@pytest.fixture
def server(tiny_model_dir):
    node = ColocatedServer(NodeConfig("colocated", "colocated-t", small_engine(tiny_model_dir),
                                      port=free_port("127.0.0.1")))
    yield node
    node.close()


@pytest.fixture
def router(server):
    with router_socket(server.config.address) as socket:
        yield socket


def generate(request_id: str, tenant: str) -> protocol.GenerateRequest:
    """A one-chunk prompt (one prefill forward each: first tokens come back in admission order)."""
    params = SamplingParams(temperature=0.6, seed=3, max_tokens=2, ignore_eos=True)
    return protocol.GenerateRequest(request_id, list(range(10, 22)), params, tenant=tenant)


def first_tokens_in_order(server, router, requests: list[protocol.GenerateRequest]) -> list[protocol.TokenEvent]:
    """Every request waiting on the node before its first forward (as a burst finds it), then each one's first
    TokenEvent in the order they came back."""
    for request in requests:
        router.send(protocol.encode(request))
    deadline = time.monotonic() + 10
    while len(server.scheduler.waiting) < len(requests):
        server.receive(timeout_ms=10)
        assert time.monotonic() < deadline, f"{len(server.scheduler.waiting)} of {len(requests)} arrived"
    wanted = {request.request_id for request in requests}
    firsts: dict[str, protocol.TokenEvent] = {}
    while len(firsts) < len(requests) or server.busy():
        server.step()
        while router.poll(0):
            for event in protocol.decode(router.recv_multipart()[-1]).events:
                if event.request_id in wanted:  # NOTE: an earlier call's last steps may still be on their way
                    firsts.setdefault(event.request_id, event)
        assert time.monotonic() < deadline, f"first tokens of {sorted(firsts)} only"
    return list(firsts.values())


def ids(events: list[protocol.TokenEvent]) -> list[str]:
    return [event.request_id for event in events]


def test_a_second_tenants_prompt_is_not_queued_behind_a_first_tenants_burst(server, router):
    """Issue 23, on a colocated node: client a's four prompts arrive, then client b's one; b's starts right after
    the a prompt admitted first (first come, first served put it fifth). Its first token is the one it gets alone."""
    [alone] = first_tokens_in_order(server, router, [generate("b-alone", "client-b")])
    burst = [generate(f"a{i}", "client-a") for i in range(1, 5)] + [generate("b1", "client-b")]
    events = first_tokens_in_order(server, router, burst)
    assert ids(events) == ["a1", "b1", "a2", "a3", "a4"]
    assert (events[1].token_ids, events[1].logprobs) == (alone.token_ids, alone.logprobs)


def test_one_tenant_stays_first_come_first_served_and_two_take_turns(server, router):
    """Control: one tenant's prompts keep their arrival order; two tenants' bursts take turns."""
    one = [generate(f"d{i}", "default") for i in range(1, 5)]
    assert ids(first_tokens_in_order(server, router, one)) == ["d1", "d2", "d3", "d4"]
    two = [generate(f"a{i}", "client-a") for i in range(1, 4)] + [generate(f"b{i}", "client-b") for i in range(1, 4)]
    assert ids(first_tokens_in_order(server, router, two)) == ["a1", "b1", "a2", "b2", "a3", "b3"]


def test_a_prompt_the_prefix_cache_serves_passes_a_tenants_earlier_prompts_it_does_not(server, router):
    """corun/waiting_order.py on a colocated node: a prompt whose 32 of 41 tokens are cached starts before the same
    tenant's two cold prompts that arrived before it, with the first token it got cold; two tenants still take
    turns, each one's cached prompt first. Inverse: one tenant's cold prompts keep their arrival order."""
    def prompt(request_id: str, start: int, tenant: str = "default") -> protocol.GenerateRequest:
        return protocol.GenerateRequest(request_id, list(range(start, start + 41)), generate("", tenant).params,
                                        tenant=tenant)

    [cold] = first_tokens_in_order(server, router, [prompt("warm", 10)])
    events = first_tokens_in_order(server, router, [prompt("cold1", 100), prompt("cold2", 200),
                                                    prompt("warm-again", 10)])
    assert ids(events) == ["warm-again", "cold1", "cold2"]
    assert (events[0].token_ids, events[0].logprobs) == (cold.token_ids, cold.logprobs)
    two = [prompt("a-cold", 300, "client-a"), prompt("b-cold", 400, "client-b"), prompt("a-warm", 10, "client-a"),
           prompt("b-warm", 10, "client-b")]
    assert ids(first_tokens_in_order(server, router, two)) == ["a-warm", "b-warm", "a-cold", "b-cold"]


def test_a_node_whose_weights_holder_ended_stops_before_sending_what_its_forward_made(server, router):
    """A node mapping another's weights (corun/shared_weights.py; on CUDA: a watch) stops at the first forward after
    that node ends, and nothing that forward computed reaches the router. Inverse: with the holder alive, the same
    request streams its first token."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        server.runner.weights_watch = WeightsWatch(holder.pid, process_state(holder.pid).start_ticks)
        [event] = first_tokens_in_order(server, router, [generate("alive", "default")])
        assert event.request_id == "alive"
    finally:
        holder.kill()
        holder.wait()
    router.send(protocol.encode(generate("after", "default")))
    deadline = time.monotonic() + 10
    with pytest.raises(SharedWeightsError, match=f"pid {holder.pid}"):
        while time.monotonic() < deadline:
            server.step()
    arrived = []
    while router.poll(200):  # NOTE: the alive request's last step may still be on its way
        arrived += [event.request_id for event in protocol.decode(router.recv_multipart()[-1]).events]
    assert "after" not in arrived, "a token of the forward that ran after the holder ended left the node"


def test_with_a_swap_space_paused_samples_stream_what_each_request_gives_alone(tiny_model_dir):
    """A colocated node whose cache holds two of these sequences whole (17 blocks) and a swap space: four requests
    run with pauses (corun/swap_preemption.py), and each streams the tokens and logprobs the engine gives it alone."""
    import dataclasses

    from corun import LLM
    from wire.config import MIB, CacheConfig

    params = SamplingParams(temperature=0.8, seed=5, max_tokens=100, logprobs=1, ignore_eos=True)
    prompts = {f"r{i}": list(range(30 + 7 * i, 50 + 7 * i)) for i in range(4)}
    engine = small_engine(tiny_model_dir)
    alone_llm = LLM.from_config(dataclasses.replace(engine, cache=CacheConfig(num_blocks=256)))
    alone = {rid: [(t, lp) for t, lp in zip(out.token_ids, out.logprobs, strict=True)]
             for rid, out in ((rid, alone_llm.generate([p], params)[0].outputs[0]) for rid, p in prompts.items())}
    del alone_llm
    node = ColocatedServer(NodeConfig("colocated", "colocated-swap", dataclasses.replace(
        engine, cache=CacheConfig(num_blocks=17, swap_space_bytes=64 * MIB)), port=free_port("127.0.0.1")))
    try:
        with router_socket(node.config.address) as router:
            for rid, prompt in prompts.items():
                router.send(protocol.encode(protocol.GenerateRequest(rid, prompt, params)))
            streamed = {rid: [] for rid in prompts}
            finished: set[str] = set()
            deadline = time.monotonic() + 120
            while len(finished) < len(prompts) or node.busy():
                node.receive(timeout_ms=1)
                node.step()
                while router.poll(0):
                    for event in protocol.decode(router.recv_multipart()[-1]).events:
                        streamed[event.request_id] += zip(event.token_ids, event.logprobs, strict=True)
                        if event.finish_reason:
                            finished.add(event.request_id)
                assert time.monotonic() < deadline, f"finished {sorted(finished)} only"
        assert node.scheduler.num_preemptions > 0 and node.role_stats()["num_preemptions"] > 0
        assert node.scheduler.swap.used_blocks == 0 and not node.block_manager.allocated_block_ids
        assert streamed == alone
    finally:
        node.close()


def test_each_forward_counts_one_iteration_of_the_tokens_it_computed(server, router):
    """vllm:iteration_tokens_total: a 10-token request alone is 10 iterations (its prefill's, with token 1; 9 decode
    steps of one row) of prompt + 10 tokens, however far its decode steps run ahead of the host."""
    params = SamplingParams(temperature=0.6, seed=3, max_tokens=10, ignore_eos=True)
    router.send(protocol.encode(protocol.GenerateRequest("counted", list(range(10, 22)), params)))
    deadline, finished = time.monotonic() + 30, False
    while not finished or server.busy():
        server.step()
        while router.poll(0):
            finished |= any(e.finish_reason for e in protocol.decode(router.recv_multipart()[-1]).events)
        assert time.monotonic() < deadline, "the request did not finish"
    assert (sum(server.iteration_tokens.bucket_counts), server.iteration_tokens.sum) == (10, 12 + 10)
