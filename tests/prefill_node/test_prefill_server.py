"""The prefill server in-process: isolated prefill (tenants in turn, each one FIFO), KV leases (claim, expiry), refusal
of bad peers."""

import contextlib
import dataclasses
import time

import msgspec
import pytest

from launch.local import free_port
from node_core.server import STALLED_RECEIVE_MS
from prefill_node.server import PrefillServer
from tests.node_sockets import deliver, router_socket, small_engine
from wire import protocol
from wire.config import NodeConfig
from wire.sampling_params import SamplingParams


@pytest.fixture
def server(tiny_model_dir, request):
    """kv_lease_seconds 0.3 (leases expire within a test), or the test's indirect parameter."""
    node = PrefillServer(NodeConfig("prefill", "prefill-t", small_engine(tiny_model_dir), port=free_port("127.0.0.1"),
                                    kv_lease_seconds=getattr(request, "param", 0.3)))
    yield node
    node.close()


@pytest.fixture
def router(server):
    with router_socket(server.config.address) as socket:
        yield socket


def exchange(server, socket, message, num_replies: int = 1, timeout_s: float = 10.0) -> list:
    socket.send(protocol.encode(message))
    replies, deadline = [], time.monotonic() + timeout_s
    while len(replies) < num_replies and time.monotonic() < deadline:
        server.step()
        while socket.poll(0):
            replies.append(protocol.decode(socket.recv_multipart()[-1]))
    assert len(replies) == num_replies, f"got {replies}"
    return replies


def prefill(request_id: str, num_tokens: int, max_tokens: int = 8, first_token_id: int = 10) -> protocol.PrefillRequest:
    params = SamplingParams(temperature=0.6, seed=3, max_tokens=max_tokens, ignore_eos=True)
    return protocol.PrefillRequest(request_id, list(range(first_token_id, first_token_id + num_tokens)), params)


def claim_kv(request_id: str, node_id: str = "decode-t", instance_id: str = "decode-t-1") -> protocol.ClaimKV:
    """A decode node's claim (node_id's process instance_id)."""
    return protocol.ClaimKV(request_id, node_id, instance_id)


def test_prefill_leases_kv_then_frees_it_when_the_lease_expires(server, router):
    free_before = server.block_manager.num_free_blocks
    [result] = exchange(server, router, prefill("a", 40))  # 40 tokens: three chunks of 16, 16, 8, alone
    assert isinstance(result, protocol.PrefillResult) and result.kv.num_tokens == 40
    assert len(result.kv.block_ids) == 3 and server.runner.num_prefill_forwards == 3
    assert server.block_manager.num_free_blocks == free_before - 3
    time.sleep(0.35)
    server.step()
    assert server.transport.counters.lease_expiries == 1 and server.block_manager.num_free_blocks == free_before
    [claim] = exchange(server, router, claim_kv("a"))
    assert not claim.ok and "expired" in claim.reason


def test_a_claimed_lease_is_not_aborted_but_expires_a_lease_after_its_claim(server, router):
    free_before = server.block_manager.num_free_blocks
    [result] = exchange(server, router, prefill("b", 20))
    time.sleep(0.2)  # NOTE: most of the unclaimed lease's life: the claim must give it a new one
    [claim] = exchange(server, router, claim_kv("b"))
    assert claim.ok and claim.block_ids == result.kv.block_ids
    [again] = exchange(server, router, claim_kv("b"))
    assert not again.ok and "already claimed" in again.reason
    time.sleep(0.2)
    deliver(server, router, protocol.Abort("b"))
    for _ in range(5):
        server.step()
    # NOTE: it may be being read
    assert server.transport.counters.lease_expiries == 0 and "b" in server.transport.leases
    time.sleep(0.2)  # NOTE: past the claimed lease's life: its claimer is dead or lost
    server.step()
    assert server.transport.counters.lease_expiries == 1 and server.block_manager.num_free_blocks == free_before


def test_a_request_id_the_node_still_holds_is_refused_and_nothing_leaks(server, router):
    """A second PrefillRequest of an id the node still holds (waiting, prefilling, or leased: a router's request can
    end while its lease lives on) is a 409; before, its lease replaced the first one, whose blocks never came back."""
    free_before = server.block_manager.num_free_blocks
    exchange(server, router, prefill("dup", 40))
    [refused] = exchange(server, router, prefill("dup", 20))
    assert isinstance(refused, protocol.ErrorReply) and refused.status == 409 and "already" in refused.message
    deliver(server, router, prefill("queued", 20))
    server.step()  # NOTE: it holds the first now (waiting, prefilling or leased)
    # NOTE: delivered only now, so that no step sees the two in one go or the second before the first (a loaded host
    # delays loopback TCP): the step that receives it does so before its timers could end the first's lease
    deliver(server, router, prefill("queued", 20))
    replies, deadline = drain_replies(router), time.monotonic() + 10
    while len(replies) < 2 and time.monotonic() < deadline:
        server.step()
        replies += drain_replies(router)
    assert sorted(type(r).__name__ for r in replies) == ["ErrorReply", "PrefillResult"]
    time.sleep(0.35)  # NOTE: past both leases
    server.step()
    assert not server.transport.leases and server.block_manager.num_free_blocks == free_before
    [again] = exchange(server, router, prefill("dup", 20))  # NOTE: its lease ended: the id is free again
    assert isinstance(again, protocol.PrefillResult)


def drain_replies(socket) -> list:
    replies = []
    while socket.poll(0):
        replies.append(protocol.decode(socket.recv_multipart()[-1]))
    return replies


def test_a_released_claim_frees_the_lease_at_once(server, router):
    free_before = server.block_manager.num_free_blocks
    exchange(server, router, prefill("r", 20))
    [claim] = exchange(server, router, claim_kv("r"))
    assert claim.ok
    deliver(server, router, protocol.ReleaseKV("r", "the READ failed"))
    server.step()
    assert "r" not in server.transport.leases and server.block_manager.num_free_blocks == free_before
    assert server.stats()["num_released_unread"] == 1 and server.transport.counters.lease_expiries == 0


@pytest.mark.parametrize("server", [60.0], indirect=True)  # NOTE: the default lease: none may end by its deadline
def test_the_leases_a_gone_decode_process_claimed_end_at_once_and_no_other(server, router):
    """Issue 23: a decode node killed in the hand-off held the KV it had claimed until the claimed lease's deadline
    (kv_lease_seconds, 60 s by default). Once the router knows that process is gone (InstanceGone), its leases end at
    once, released unread; a lease another decode node claimed, or its restarted instance, stays (it may be being
    read), so does an unclaimed one; a notice naming an older or unknown instance, or another node, frees nothing."""
    free_before = server.block_manager.num_free_blocks
    # NOTE: prompts apart (no shared cached chunk): each lease holds blocks of its own
    prompts = {"gone-1": 20, "gone-2": 40, "other-node": 20, "restarted": 20, "unclaimed": 20}
    for i, (request_id, num_tokens) in enumerate(prompts.items()):
        exchange(server, router, prefill(request_id, num_tokens, first_token_id=10 + 50 * i))
    blocks = {request_id: len(lease.block_ids) for request_id, lease in server.transport.leases.items()}
    for request_id, node_id, instance_id in (("gone-1", "decode-0", "decode-0-a"), ("gone-2", "decode-0", "decode-0-a"),
                                             ("other-node", "decode-1", "decode-0-a"),
                                             ("restarted", "decode-0", "decode-0-b")):
        [reply] = exchange(server, router, claim_kv(request_id, node_id, instance_id))
        assert reply.ok
    for node_id, instance_id in (("decode-0", "decode-0-older"), ("decode-0", "unknown"), ("decode-2", "decode-0-a")):
        deliver(server, router, protocol.InstanceGone(node_id, instance_id))
        server.step()
    assert server.transport.leases.keys() == prompts.keys() and server.stats()["num_released_unread"] == 0
    deliver(server, router, protocol.InstanceGone("decode-0", "decode-0-a"))
    server.step()
    assert server.transport.leases.keys() == {"other-node", "restarted", "unclaimed"}
    assert server.block_manager.num_free_blocks == free_before - sum(blocks[r] for r in server.transport.leases)
    stats = server.stats()
    assert stats["num_released_unread"] == 2 and stats["num_claimed"] == 2 and stats["num_leased"] == 3
    assert server.transport.counters.lease_expiries == 0 and server.transport.counters.kv_released == 0
    [late] = exchange(server, router, claim_kv("gone-1", "decode-1", "decode-1-a"))
    assert not late.ok  # NOTE: its KV is gone: the router prefills it again
    [fresh] = exchange(server, router, claim_kv("unclaimed", "decode-0", "decode-0-b"))
    assert fresh.ok


def test_an_abort_during_prefill_frees_the_blocks_when_it_ends(server, router):
    free_before = server.block_manager.num_free_blocks
    deliver(server, router, prefill("long", 40))  # NOTE: three chunks: the abort lands between them
    server.step()
    assert server.prefilling
    deliver(server, router, protocol.Abort("long"))
    for _ in range(4):
        server.step()
    assert not server.transport.leases and not server.prefilling and server.block_manager.num_free_blocks == free_before
    assert not router.poll(100)  # NOTE: the router gave up on it: no result is sent


def test_an_id_aborted_mid_prefill_may_be_sent_again_at_once(server, router):
    """A client that gave up retries with the same X-Request-Id: the aborted prefill no longer holds its id."""
    free_before = server.block_manager.num_free_blocks
    deliver(server, router, prefill("retried", 40))
    server.step()
    deliver(server, router, protocol.Abort("retried"))
    [result] = exchange(server, router, prefill("retried", 40))
    assert isinstance(result, protocol.PrefillResult) and len(server.transport.leases["retried"].block_ids) == 3
    time.sleep(0.35)
    server.step()
    assert not server.transport.leases and server.block_manager.num_free_blocks == free_before


def test_first_token_that_ends_the_request_returns_no_kv(server, router):
    free_before = server.block_manager.num_free_blocks
    [result] = exchange(server, router, prefill("c", 12, max_tokens=1))
    assert result.kv is None and [first.finish_reason for first in result.first_tokens] == ["length"]
    assert server.block_manager.num_free_blocks == free_before and not server.transport.leases


def test_bad_requests_and_incompatible_peers_get_clear_errors(server, router):
    [too_long] = exchange(server, router, prefill("d", 250, max_tokens=10))
    assert too_long.status == 400 and "max_model_len" in too_long.message
    [refused] = exchange(server, router, protocol.HandshakeRequest("decode-x", {**server.compat, "block_size": 32}))
    assert isinstance(refused, protocol.HandshakeRefused) and "block_size 16 != 32" in refused.reason
    assert refused.node_id == "prefill-t"
    [accepted] = exchange(server, router, protocol.HandshakeRequest("decode-y", dict(server.compat)))
    assert isinstance(accepted, protocol.HandshakeReply) and accepted.compat_hash == server.compat_hash


def packed_server(model_dir: str) -> PrefillServer:
    engine = small_engine(model_dir)
    engine = dataclasses.replace(engine, scheduler=dataclasses.replace(engine.scheduler, prefill_pack_tokens=48,
                                                                       prefill_pack_seqs=4))
    return PrefillServer(NodeConfig("prefill", "prefill-p", engine, port=free_port("127.0.0.1")))


@pytest.mark.mkl_default_mode  # NOTE: its inverse needs a row count that changes bits (tests/conftest.py)
def test_packed_prefill_shares_forwards_and_keeps_every_prompts_bits(tiny_model_dir, server, router):
    """With prefill_pack_tokens the node prefills several prompts per forward; each prompt's token 1 and logprob
    are bitwise what it gets prefilled alone on the same node. Inverse: the 2-token prompt at its natural 2 rows
    (the isolated node) gets other bits, so the comparison can fail here."""
    packed = packed_server(tiny_model_dir)
    with contextlib.closing(packed), router_socket(packed.config.address) as socket:
        requests = [prefill(name, size) for name, size in (("p1", 5), ("p2", 30), ("p3", 2), ("p4", 16))]
        requests = [msgspec.structs.replace(r, params=dataclasses.replace(r.params, logprobs=3)) for r in requests]
        alone = {r.request_id: exchange(packed, socket, r)[0] for r in requests}
        forwards_alone = packed.runner.num_prefill_forwards
        for r in requests:
            socket.send(protocol.encode(msgspec.structs.replace(r, request_id=r.request_id + "-again")))
        together = {m.request_id.removesuffix("-again"): m for m in exchange(packed, socket, protocol.Ping(1), 5)
                    if isinstance(m, protocol.PrefillResult)}
        assert packed.runner.num_prefill_forwards - forwards_alone < forwards_alone  # NOTE: forwards were shared
        assert {k: v.first_tokens for k, v in together.items()} == {k: v.first_tokens for k, v in alone.items()}
        assert all(v.first_tokens[0].logprobs is not None for v in alone.values())
        [natural] = exchange(server, router, requests[2])
        assert natural.first_tokens[0].logprobs != alone["p3"].first_tokens[0].logprobs


def tenant_prefill(request_id: str, tenant: str) -> protocol.PrefillRequest:
    """A one-chunk prompt (one forward each on the isolated node: results come back in admission order)."""
    return msgspec.structs.replace(prefill(request_id, 12), tenant=tenant)


def results_in_order(server, router, requests: list[protocol.PrefillRequest]) -> list[protocol.PrefillResult]:
    """Every request waiting on the node before its first forward (as a burst finds it), then their PrefillResults
    in the order they came back."""
    for request in requests:
        router.send(protocol.encode(request))
    deadline = time.monotonic() + 10
    while len(server.waiting) < len(requests):
        server.receive(timeout_ms=10)
        assert time.monotonic() < deadline, f"{len(server.waiting)} of {len(requests)} arrived"
    return [reply for reply in exchange(server, router, protocol.Ping(1), len(requests) + 1)
            if isinstance(reply, protocol.PrefillResult)]


def ids(results: list[protocol.PrefillResult]) -> list[str]:
    return [result.request_id for result in results]


def test_a_second_tenants_prompt_is_not_queued_behind_a_first_tenants_burst(server, router):
    """Issue 23: client a's four prompts arrive, then client b's one; b's starts right after the a prompt admitted
    first, not after all four (first come, first served put it fifth). Its token 1 is the one it gets alone."""
    [alone] = exchange(server, router, tenant_prefill("b-alone", "client-b"))
    burst = [tenant_prefill(f"a{i}", "client-a") for i in range(1, 5)] + [tenant_prefill("b1", "client-b")]
    results = results_in_order(server, router, burst)
    assert ids(results) == ["a1", "b1", "a2", "a3", "a4"]
    assert results[1].first_tokens == alone.first_tokens


def test_tenants_bursts_interleave_and_one_tenant_stays_first_come_first_served(server, router):
    """Control: the prompts of one tenant (a router without client keys sends every prompt as one) keep their
    arrival order; two tenants' bursts take turns, the tenant admitted longest ago first."""
    one = [tenant_prefill(f"d{i}", "default") for i in range(1, 5)]
    assert ids(results_in_order(server, router, one)) == ["d1", "d2", "d3", "d4"]
    two = [tenant_prefill(f"a{i}", "client-a") for i in range(1, 4)] + [tenant_prefill(f"b{i}", "client-b")
                                                                         for i in range(1, 4)]
    assert ids(results_in_order(server, router, two)) == ["a1", "b1", "a2", "b2", "a3", "b3"]
    server.step()
    assert not server.turns.last_admitted  # NOTE: tenants with nothing left on the node are forgotten


def test_a_prompt_the_prefix_cache_serves_passes_a_tenants_earlier_prompts_it_does_not(server, router):
    """corun/waiting_order.py on a prefill node: a prompt whose 32 of 41 tokens are cached starts before the same
    tenant's two cold prompts that arrived before it; two tenants still take turns, each one's cached prompt first.
    Its token 1 is the one it got cold. Inverse: a prompt the cache serves 16 of 41 tokens of keeps its place."""
    [cold] = exchange(server, router, prefill("warm", 41))
    burst = [prefill("cold1", 41, first_token_id=100), prefill("cold2", 41, first_token_id=200),
             prefill("warm-again", 41)]
    results = results_in_order(server, router, burst)
    assert ids(results) == ["warm-again", "cold1", "cold2"]
    assert results[0].first_tokens == cold.first_tokens
    quarter = msgspec.structs.replace(prefill("quarter", 41, first_token_id=300),
                                      prompt_token_ids=list(range(10, 26)) + list(range(300, 325)))
    assert ids(results_in_order(server, router, [prefill("cold3", 41, first_token_id=400), quarter])) == \
        ["cold3", "quarter"]
    two = [msgspec.structs.replace(prefill(request_id, 41, first_token_id=start), tenant=tenant)
           for request_id, start, tenant in (("a-cold", 500, "client-a"), ("b-cold", 600, "client-b"),
                                             ("a-warm", 10, "client-a"), ("b-warm", 10, "client-b"))]
    assert ids(results_in_order(server, router, two)) == ["a-warm", "b-warm", "a-cold", "b-cold"]


@pytest.mark.parametrize("server", [60.0], indirect=True)  # NOTE: no lease ends by its deadline within the test
def test_prompts_waiting_for_leased_blocks_wait_for_a_message_and_start_once_one_frees_them(server, router):
    """A prefill node whose waiting prompts find every block leased waits STALLED_RECEIVE_MS per turn for what frees
    one (it spun a core at ~58k turns a second before); a lease released by message lets the next prompt start."""
    params = SamplingParams(temperature=0.6, seed=3, max_tokens=8, ignore_eos=True)
    for i in range(30):  # NOTE: distinct prompts of 5 blocks each: the 64-block pool leases about 12 of them
        router.send(protocol.encode(protocol.PrefillRequest(f"w{i}", list(range(10 + i, 90 + i)), params)))
    deadline = time.monotonic() + 30
    while not server.stalled and time.monotonic() < deadline:
        server.step()
    assert server.stalled and server.waiting and not server.prefilling
    assert server.receive_timeout_ms() == STALLED_RECEIVE_MS > 0
    window_s, start, turns = 0.3, time.monotonic(), 0
    while time.monotonic() - start < window_s:
        server.step()
        turns += 1
    # NOTE: an upper bound: a loaded host makes turns fewer, never more
    assert turns <= window_s / (STALLED_RECEIVE_MS / 1000) + 10, turns
    while router.poll(0):  # NOTE: the results of the prompts that ran, each with its KV handle
        router.recv_multipart()
    leased = next(iter(server.transport.leases))
    waiting_before = len(server.waiting)
    deliver(server, router, protocol.ReleaseKV(leased, "the READ failed"))
    server.step()
    assert len(server.waiting) < waiting_before and not server.stalled
    assert server.receive_timeout_ms() == 0 or not server.busy()
