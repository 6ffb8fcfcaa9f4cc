"""The decode server's state machine in-process, on the fake KV transport, with a real prefill server beside it.

Each test drives one path of the lifecycle in decode_node/server.py: the normal path (claim, read, stream, the
prefill node frees its copy), a refused claim and an expired lease, a failed READ and the handshake again with
the restarted peer, aborts while claiming, transferring and running, and a refusing peer. Every path must end
with the decode node's blocks and slots free and the router told (an ErrorReply or the last token), never
silence.
"""

import dataclasses
import time

import msgpack
import pytest
import zmq

from decode_node.server import DecodeServer
from launch.local import free_port
from prefill_node.server import PrefillServer
from tests.node_sockets import deliver
from tests.transfer.copy_transport import CopyReceiver, CopySender
from transfer.fake import FakeKVTransferAgent
from wire import protocol
from wire.config import KV_TRANSPORTS, CacheConfig, EngineConfig, NodeConfig, SchedulerConfig, TransferConfig
from wire.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.6, seed=5, max_tokens=6, logprobs=2, ignore_eos=True)
FAKE = TransferConfig(transport="fake")


def node_config(model_dir: str, role: str, node_id: str, cache: CacheConfig = CacheConfig(num_blocks=64),
                **node) -> NodeConfig:
    engine = EngineConfig(model=model_dir, num_threads=1, cache=cache,
                          scheduler=SchedulerConfig(max_num_seqs=4, max_model_len=128, prefill_chunk_size=32))
    return NodeConfig(role, node_id, engine, **{"port": free_port("127.0.0.1"), "transfer": FAKE, **node})


class Bench:
    """A prefill and a decode server, both in this process on the fake transport (or the one `transfer` names),
    and the router's two sockets."""

    def __init__(self, model_dir: str, prefill_id: str = "prefill-a", lease_s: float = 30.0,
                 transfer: TransferConfig = FAKE, decode_cache: CacheConfig = CacheConfig(num_blocks=64)):
        self.model_dir = model_dir
        self.prefill = PrefillServer(node_config(model_dir, "prefill", prefill_id, kv_lease_seconds=lease_s,
                                                 transfer=transfer))
        self.decode = DecodeServer(node_config(model_dir, "decode", "decode-a", decode_cache, transfer=transfer))
        self.to_prefill, self.to_decode = self.socket(self.prefill), self.socket(self.decode)
        self.step_messages: list[int] = []
        self.num_sent_to_router = self.num_received = 0
        reply = self.decode.sockets.reply

        def counted_reply(identity: bytes, message) -> None:
            # NOTE: so that step() waits for what was sent: a loaded host may take longer than a poll to cross
            # loopback, and a test that polled 1 ms missed a message sent during the step (CI)
            self.num_sent_to_router += 1
            reply(identity, message)

        self.decode.sockets.reply = counted_reply

    @staticmethod
    def socket(server):
        socket = zmq.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(server.config.address)
        return socket

    def step(self, turns: int = 1) -> list:
        """Step both servers; -> the messages the decode node sent the router meanwhile, a StepTokens as its
        events (self.step_messages counts the StepTokens and their events)."""
        replies = []
        for _ in range(turns):
            self.prefill.step()
            self.decode.step()
            replies += self.receive_sent()
        return replies

    def receive_sent(self, timeout_s: float = 10.0) -> list:
        """Every message the decode node has sent the router and this bench has not received yet."""
        replies, deadline = [], time.monotonic() + timeout_s
        while self.num_received < self.num_sent_to_router:
            if not self.to_decode.poll(10):
                assert time.monotonic() < deadline, "a message the decode node sent never arrived"
                continue
            message = protocol.decode(self.to_decode.recv_multipart()[-1])
            self.num_received += 1
            if isinstance(message, protocol.StepTokens):
                self.step_messages.append(len(message.events))
                replies += message.events
            else:
                replies.append(message)
        return replies

    def prefilled(self, request_id: str, num_tokens: int = 20, params: SamplingParams = PARAMS,
                  first_id: int = 30) -> tuple[protocol.PrefillResult, list[int]]:
        prompt = list(range(first_id, first_id + num_tokens))
        self.to_prefill.send(protocol.encode(protocol.PrefillRequest(request_id, prompt, params)))
        deadline = time.monotonic() + 10
        while not self.to_prefill.poll(1):
            self.prefill.step()
            assert time.monotonic() < deadline, "no PrefillResult"
        return protocol.decode(self.to_prefill.recv_multipart()[-1]), prompt

    def send_decode(self, result: protocol.PrefillResult, prompt: list[int], kv=None,
                    params: SamplingParams = PARAMS) -> None:
        self.to_decode.send(protocol.encode(protocol.DecodeRequest(
            result.request_id, prompt, params, result.first_tokens, kv or result.kv)))

    def until(self, done, max_turns: int = 200) -> list:
        replies = []
        for _ in range(max_turns):
            replies += self.step()
            if done(replies):
                return replies
        raise AssertionError(f"not done after {max_turns} turns: {replies}")

    def receive_until_transferring(self, request_id: str, max_turns: int = 200) -> None:
        """Run the decode node's message and admission parts only, so that a started read is not polled yet
        (the fake read completes at its first poll, within the turn that started it)."""
        for _ in range(max_turns):
            self.prefill.step()
            self.decode.receive(timeout_ms=1)
            self.decode.admit()
            if request_id in self.decode.transferring:
                return
        raise AssertionError(f"{request_id} never started its read")

    def assert_idle(self) -> None:
        decode = self.decode
        assert not (decode.waiting or decode.claiming or decode.transferring or decode.awaiting_grammar or
                    decode.running)
        assert decode.block_manager.num_free_blocks == decode.block_manager.num_usable_blocks

    def assert_prefill_idle(self, turns: int = 5) -> None:
        """No lease left on the prefill node (after the messages in flight to it arrived)."""
        for _ in range(turns):
            self.prefill.step()
        prefill = self.prefill
        assert not prefill.transport.leases, prefill.transport.leases
        assert prefill.block_manager.num_free_blocks == prefill.block_manager.num_usable_blocks

    def close(self) -> None:
        for socket in (self.to_prefill, self.to_decode):
            socket.close()
        for server in (self.prefill, self.decode):
            server.close()


@pytest.fixture
def bench(tiny_model_dir):
    bench = Bench(tiny_model_dir)
    yield bench
    bench.close()


def finished(replies) -> bool:
    return any(isinstance(r, protocol.ErrorReply) or (isinstance(r, protocol.TokenEvent) and r.finish_reason)
               for r in replies)


def test_normal_path_streams_every_token_and_the_prefill_node_frees_its_copy(bench):
    result, prompt = bench.prefilled("ok")
    bench.send_decode(result, prompt)
    events = bench.until(finished)
    assert all(isinstance(e, protocol.TokenEvent) for e in events)
    assert sum(len(e.token_ids) for e in events) == PARAMS.max_tokens and events[-1].finish_reason == "length"
    bench.step(3)  # NOTE: the read's notification reaches the prefill node on its next turn
    assert bench.prefill.transport.counters.kv_released == 1 and not bench.prefill.transport.leases
    assert bench.decode.transport.counters.reads_completed == 1
    bench.assert_idle()


def test_a_new_transport_is_its_own_module_and_one_registry_line(tiny_model_dir, monkeypatch):
    """tests/transfer/copy_transport.py, written against transfer/transport.py alone, registered with one line:
    the normal path runs on it, counted as on the fake (inverse: the nodes really opened its sender and receiver)."""
    monkeypatch.setitem(KV_TRANSPORTS, "copy", "tests.transfer.copy_transport")
    bench = Bench(tiny_model_dir, transfer=TransferConfig(transport="copy"))
    try:
        assert isinstance(bench.prefill.transport, CopySender) and isinstance(bench.decode.transport, CopyReceiver)
        result, prompt = bench.prefilled("copied")
        bench.send_decode(result, prompt)
        events = bench.until(finished)
        assert sum(len(e.token_ids) for e in events) == PARAMS.max_tokens and events[-1].finish_reason == "length"
        bench.step(3)
        assert bench.prefill.transport.counters.kv_released == 1 and not bench.prefill.transport.leases
        assert bench.decode.transport.counters.reads_completed == 1
        bench.assert_idle()
    finally:
        bench.close()


def test_a_step_sends_each_router_one_message_with_every_running_request(bench):
    """One StepTokens per step for this router, holding an event per running request (the router decodes and
    wakes once per step); inverse: with one request running, a step's message holds one event."""
    for name in ("a", "b", "c"):
        result, prompt = bench.prefilled(name)
        bench.send_decode(result, prompt)
    events = bench.until(lambda replies: sum(bool(isinstance(r, protocol.TokenEvent) and r.finish_reason)
                                             for r in replies) == 3)
    assert {e.request_id for e in events} == {"a", "b", "c"}
    assert max(bench.step_messages) == 3
    bench.step_messages.clear()
    result, prompt = bench.prefilled("alone")
    bench.send_decode(result, prompt)
    bench.until(finished)
    assert bench.step_messages and set(bench.step_messages) == {1}
    bench.assert_idle()


@pytest.mark.parametrize("pulls_during_step", [True, False])
def test_a_claim_answered_while_a_step_runs_is_read_and_streams_token_1_in_that_turn(bench, monkeypatch,
                                                                                    pulls_during_step):
    """The prefill node answers the claim while the decode node's step runs (its wait calls pull_kv_during_step):
    the READ is posted, seen done and token 1 streamed before the step's turn ends, and the request decodes on to the
    same tokens. Inverse: a node that pulls nothing during its step leaves the claim reply for its next turn."""
    result, prompt = bench.prefilled("first")
    bench.send_decode(result, prompt)
    bench.until(lambda replies: bench.decode.running)
    second, second_prompt = bench.prefilled("second")
    deliver(bench.decode, bench.to_decode, protocol.DecodeRequest("second", second_prompt, PARAMS,
                                                                  second.first_tokens, second.kv))
    pull = bench.decode.pull_kv_during_step
    peer = bench.decode.sockets.connect_peer(second.kv.address)

    def prefill_answers_during_the_step():
        deadline = time.monotonic() + 10
        while "second" in bench.decode.claiming and not peer.poll(1):
            # NOTE: until the claim has crossed loopback and been answered (a loaded host may take longer than one
            # turn's receive)
            bench.prefill.step()
            assert time.monotonic() < deadline, "no ClaimReply"
        if pulls_during_step:
            pull()

    monkeypatch.setattr(bench.decode, "pull_kv_during_step", prefill_answers_during_the_step)
    replies = bench.step()
    second_started = any(isinstance(r, protocol.TokenEvent) and r.request_id == "second" for r in replies)
    assert second_started == pulls_during_step
    assert ("second" in bench.decode.claiming) != pulls_during_step
    monkeypatch.undo()
    events = bench.until(lambda replies: sum(bool(isinstance(r, protocol.TokenEvent) and r.finish_reason)
                                             for r in replies) == 2)
    result, prompt = bench.prefilled("alone")  # NOTE: the same prompt and seed, decoded with nothing beside it
    bench.send_decode(result, prompt)
    alone = bench.until(finished)

    def outputs(events, request_id):
        return [(e.token_ids, e.logprobs) for e in events if isinstance(e, protocol.TokenEvent)
                and e.request_id == request_id]

    assert outputs(replies + events, "second") == outputs(alone, "alone")
    bench.step(3)
    bench.assert_idle()


def test_during_a_step_an_abort_waits_for_the_turn_and_what_follows_it_waits_behind_it(bench, monkeypatch):
    """An Abort may end a running request whose blocks the step in flight still writes: taken during the step, it
    is held for the next turn, and a DecodeRequest behind it is held too (the router's order kept); both then take
    effect at the next turn."""
    result, prompt = bench.prefilled("first", num_tokens=20)
    bench.send_decode(result, prompt)
    bench.until(lambda replies: bench.decode.running)
    second, second_prompt = bench.prefilled("second")
    pull = bench.decode.pull_kv_during_step
    sent = []

    def router_sends_during_the_step():
        if not sent:
            deliver(bench.decode, bench.to_decode, protocol.Abort("first"))
            deliver(bench.decode, bench.to_decode, protocol.DecodeRequest("second", second_prompt, PARAMS,
                                                                          second.first_tokens, second.kv))
            sent.append(True)
        pull()

    monkeypatch.setattr(bench.decode, "pull_kv_during_step", router_sends_during_the_step)
    bench.step()
    held = [type(m) for _, m in bench.decode.sockets.held]
    assert held[0] is protocol.Abort and set(held) <= {protocol.Abort, protocol.DecodeRequest}  # NOTE: or on the socket
    assert not bench.decode.holds("second")
    assert [s.job.request_id for s in bench.decode.running] == ["first"]
    monkeypatch.undo()
    events = bench.until(finished)
    assert not any(s.job.request_id == "first" for s in bench.decode.running)
    assert any(isinstance(e, protocol.TokenEvent) and e.request_id == "second" for e in events)
    bench.until(lambda replies: not bench.decode.running)
    bench.step(3)
    bench.assert_idle()


def test_refused_claim_is_a_503_and_frees_the_slot(bench):
    result, prompt = bench.prefilled("unknown")
    bench.prefill.transport.leases.clear()  # NOTE: as if the lease were gone: the claim of it is refused
    bench.send_decode(result, prompt)
    [error] = bench.until(finished)
    assert isinstance(error, protocol.ErrorReply) and error.status == 503 and "could not be claimed" in error.message
    bench.assert_idle()


def test_expired_lease_is_a_503(tiny_model_dir):
    bench = Bench(tiny_model_dir, lease_s=0.05)
    try:
        result, prompt = bench.prefilled("late")
        time.sleep(0.1)
        bench.prefill.step()
        assert bench.prefill.transport.counters.lease_expiries == 1
        bench.send_decode(result, prompt)
        [error] = bench.until(finished)
        assert error.status == 503 and "expired" in error.message
        bench.assert_idle()
    finally:
        bench.close()


def test_failed_read_is_a_503_and_the_restarted_peer_is_handshaken_again(tiny_model_dir):
    bench = Bench(tiny_model_dir)
    try:
        result, prompt = bench.prefilled("lost")
        bench.send_decode(result, prompt)
        bench.receive_until_transferring("lost")
        bench.prefill.transport.agent.close()  # NOTE: the holder's agent goes away mid-read, as a killed node's does
        [error] = bench.until(finished)
        assert error.status == 503 and "read" in error.message and "prefill-a" not in bench.decode.peers
        bench.assert_idle()
        bench.assert_prefill_idle()  # NOTE: the failed reader released its claim (ReleaseKV), not the deadline
        assert bench.prefill.transport.num_released_unread == 1 and bench.prefill.transport.counters.lease_expiries == 0
        bench.prefill.close()
        bench.prefill = PrefillServer(node_config(tiny_model_dir, "prefill", "prefill-a"))
        bench.to_prefill.close()
        bench.to_prefill = bench.socket(bench.prefill)
        result, prompt = bench.prefilled("after-restart")
        bench.send_decode(result, prompt)
        events = bench.until(finished)
        assert events[-1].finish_reason == "length" and bench.decode.peers["prefill-a"].ready
    finally:
        bench.close()


def test_abort_while_claiming_frees_the_blocks_without_a_reply(bench):
    result, prompt = bench.prefilled("claiming")
    bench.send_decode(result, prompt)
    bench.until(lambda _: bench.decode.claiming)
    deliver(bench.decode, bench.to_decode, protocol.Abort("claiming"))
    replies = bench.step(20)
    assert not any(isinstance(r, protocol.TokenEvent) for r in replies)
    bench.assert_idle()
    bench.assert_prefill_idle()


def test_abort_while_transferring_frees_the_blocks_once_the_read_ends(bench):
    result, prompt = bench.prefilled("transferring")
    bench.send_decode(result, prompt)
    bench.receive_until_transferring("transferring")
    deliver(bench.decode, bench.to_decode, protocol.Abort("transferring"))
    bench.decode.receive(timeout_ms=100)
    assert bench.decode.transferring["transferring"].aborted
    replies = bench.step(5)
    assert not replies
    bench.assert_idle()
    bench.assert_prefill_idle()


def test_a_request_id_the_node_still_holds_is_refused_and_nothing_leaks(bench):
    """A second DecodeRequest of an id the node holds (waiting, claiming, reading or running) is a 409: claims,
    reads and aborts name a request by its id, and before, the second job took the first's place in them."""
    result, prompt = bench.prefilled("twice")
    bench.send_decode(result, prompt)
    bench.receive_until_transferring("twice")
    bench.send_decode(result, prompt)
    replies = bench.until(finished)
    assert [(r.status, "already" in r.message) for r in replies if isinstance(r, protocol.ErrorReply)] == [
        (409, True)]
    replies = bench.until(lambda rs: any(isinstance(r, protocol.TokenEvent) and r.finish_reason for r in rs))
    assert sum(len(e.token_ids) for e in replies if isinstance(e, protocol.TokenEvent)) >= 1
    bench.step(3)
    bench.assert_idle()
    bench.assert_prefill_idle()


def test_abort_while_running_stops_the_stream_and_frees_the_slot(bench):
    result, prompt = bench.prefilled("running")
    bench.send_decode(result, prompt)
    first = bench.until(lambda replies: bench.decode.running)
    deliver(bench.decode, bench.to_decode, protocol.Abort("running"))
    rest = bench.step(10)
    assert sum(len(e.token_ids) for e in first + rest) < PARAMS.max_tokens
    assert not any(getattr(e, "finish_reason", None) for e in first + rest)
    bench.assert_idle()


def test_a_peer_that_refuses_the_handshake_fails_its_waiting_jobs(bench):
    result, prompt = bench.prefilled("refused")
    bench.prefill.compat = {**bench.prefill.compat, "block_size": 32}  # NOTE: the prefill node now disagrees
    bench.send_decode(result, prompt)
    [error] = bench.until(finished)
    assert error.status == 503 and "block_size" in error.message and "prefill-a" not in bench.decode.peers
    bench.assert_idle()


def test_a_handshake_reply_of_another_transport_is_refused(bench):
    """The prefill node's reply names another transport than the decode node's: its payload is not the fake's to
    read, so the peer is refused and its waiting job fails (inverse: the same reply naming "fake", every other test)."""
    result, prompt = bench.prefilled("other-transport")
    bench.prefill.transport.transport = "nixl"  # NOTE: what HandshakeReply.transport now says
    bench.send_decode(result, prompt)
    [error] = bench.until(finished)
    assert error.status == 503 and "over transport 'nixl'" in error.message and "prefill-a" not in bench.decode.peers
    assert not bench.decode.transport.has_peer("prefill-a")
    bench.assert_idle()


def test_a_kv_handle_for_another_prompt_length_is_a_400(bench):
    result, prompt = bench.prefilled("mismatch")
    bench.send_decode(result, prompt[:-1])
    [error] = bench.until(finished)
    assert error.status == 400 and "KV handle" in error.message
    bench.assert_idle()


def emulate_vram(monkeypatch, probe_gbps: float) -> None:
    """The fake agents hold GPU KV whose READs UCX emulates through host memory (0.8 GB/s, as measured on one H200
    by default)."""
    monkeypatch.setattr(FakeKVTransferAgent, "memory_type", "VRAM")
    monkeypatch.setattr(FakeKVTransferAgent, "probe_gbps", probe_gbps)


@pytest.mark.parametrize("agent_gbps, transfer, refused", [
    (0.8, FAKE, True),
    (0.8, dataclasses.replace(FAKE, allow_slow_reads=True), False),  # NOTE: told to allow it
    (300.0, FAKE, False),  # NOTE: the direct CUDA-IPC path
    (0.8, dataclasses.replace(FAKE, min_vram_read_gbps=0.5), False),
])
def test_an_emulated_vram_path_is_refused_naming_the_setting(tiny_model_dir, monkeypatch, agent_gbps, transfer,
                                                            refused):
    emulate_vram(monkeypatch, agent_gbps)
    bench = Bench(tiny_model_dir, transfer=transfer)
    try:
        result, prompt = bench.prefilled("gpu")
        bench.send_decode(result, prompt)
        replies = bench.until(finished)
        if refused:
            [error] = replies
            assert error.status == 503 and "0.8 GB/s" in error.message and "--kv-cuda-ipc-get-zcopy y" in error.message
            assert "prefill-a" not in bench.decode.peers
        else:
            assert replies[-1].finish_reason == "length"
            assert bench.decode.stats()["kv_probe_read_gbps_min"] == agent_gbps
        bench.assert_idle()
    finally:
        bench.close()


def test_a_read_that_hangs_is_given_up_and_its_claim_released(tiny_model_dir):
    bench = Bench(tiny_model_dir, lease_s=0.6)
    try:
        bench.decode.transport.agent.hold_reads = True  # NOTE: the READ never completes
        result, prompt = bench.prefilled("hung")
        bench.send_decode(result, prompt)
        start = time.monotonic()
        [error] = bench.until(finished, max_turns=2000)
        assert error.status == 503 and "timed out" in error.message
        assert 0.25 < time.monotonic() - start < 2.0  # NOTE: half the peer's 0.6 s lease
        bench.assert_idle()
        bench.assert_prefill_idle()
        assert bench.prefill.transport.counters.lease_expiries == 0  # NOTE: released, not expired
    finally:
        bench.close()


def test_kv_of_a_restarted_prefill_node_is_refused_without_reading_it(tiny_model_dir):
    bench = Bench(tiny_model_dir)
    try:
        result, prompt = bench.prefilled("before")
        bench.send_decode(result, prompt)
        assert bench.until(finished)[-1].finish_reason == "length"
        old_instance = bench.decode.peers["prefill-a"].instance_id
        stale, stale_prompt = bench.prefilled("stale")  # NOTE: then the node restarts in place: the lease is gone
        bench.prefill.close()
        bench.prefill = PrefillServer(node_config(tiny_model_dir, "prefill", "prefill-a",
                                                  port=int(bench.prefill.config.port)))
        assert bench.prefill.instance_id != old_instance
        bench.to_prefill.close()
        bench.to_prefill = bench.socket(bench.prefill)
        reads_before = bench.decode.transport.counters.reads_started
        bench.send_decode(stale, stale_prompt)
        [error] = bench.until(finished)
        assert error.status == 503 and "could not be claimed" in error.message
        assert bench.decode.transport.counters.reads_started == reads_before  # NOTE: nothing read
        # NOTE: KV of the new instance: the decode node must not use what its transport knew of the old instance
        fresh, fresh_prompt = bench.prefilled("fresh")
        assert fresh.kv.instance_id == bench.prefill.instance_id
        bench.send_decode(fresh, fresh_prompt)
        assert bench.until(finished)[-1].finish_reason == "length"
        assert bench.decode.peers["prefill-a"].instance_id == bench.prefill.instance_id
        bench.assert_idle()
        bench.assert_prefill_idle()
    finally:
        bench.close()


def test_a_claim_a_dead_prefill_node_never_answers_fails_in_bounded_time(tiny_model_dir, monkeypatch):
    monkeypatch.setattr("decode_node.server.CLAIM_TIMEOUT_S", 0.3)
    bench = Bench(tiny_model_dir)
    try:
        result, prompt = bench.prefilled("orphan")
        bench.send_decode(result, prompt)
        replies = []
        for _ in range(400):  # NOTE: the prefill node never steps again: it is dead
            bench.decode.step()
            replies += bench.receive_sent()
            if finished(replies):
                break
        [error] = replies
        assert error.status == 503 and "did not answer" in error.message
        bench.assert_idle()
    finally:
        bench.close()


MALFORMED = {
    "temperature -1": ("params", {"temperature": -1}),
    "kv {}": ("kv", {}),
    "first token logprobs [1]": ("first_tokens", [{"index": 0, "token_id": 5, "logprobs": [1], "finish_reason": None}]),
    "prompt 'abc'": ("prompt_token_ids", "abc"),
    "kv.address not an address": ("kv.address", "not-an-address"),
    "logit_bias out of vocab": ("params", {"logit_bias": [[10**6, 1.0]]}),
    "more samples than slots": ("samples", 5),
    "a sample index beyond n": ("samples", -1),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_decode_request_is_refused_and_the_node_lives_on(bench, name):
    result, prompt = bench.prefilled(f"bad-{len(name)}")
    wire = msgpack.unpackb(protocol.encode(protocol.DecodeRequest(result.request_id, prompt, PARAMS,
                                                                  result.first_tokens, result.kv)))
    field, value = MALFORMED[name]
    if field == "samples":  # NOTE: 5 samples for a node of 4 slots, or sample 1 of a request with n = 1
        n = max(value, 1)
        wire["params"] = {**wire["params"], "n": n}
        first = wire["first_tokens"][0]
        wire["first_tokens"] = [{**first, "index": i} for i in range(value if value > 0 else 2)]
    elif field == "params":
        wire["params"] = {**wire["params"], **value}
    elif field == "kv.address":
        wire["kv"] = {**wire["kv"], "address": value}
    else:
        wire[field] = value
    bench.to_decode.send(msgpack.packb(wire))
    [error] = bench.until(finished)
    assert isinstance(error, protocol.ErrorReply) and error.status == 400 and error.request_id == result.request_id
    bench.send_decode(result, prompt)  # NOTE: the node still serves, this very request included
    assert bench.until(finished)[-1].finish_reason == "length"
    bench.assert_idle()


@pytest.mark.parametrize("data", [b"", b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"v": protocol.PROTOCOL_VERSION}),
                                  msgpack.packb({"v": protocol.PROTOCOL_VERSION, "type": "Abort"})])
def test_garbage_gets_an_error_reply_from_both_nodes(bench, data):
    for socket, server in ((bench.to_prefill, bench.prefill), (bench.to_decode, bench.decode)):
        socket.send(data)
        server.receive(timeout_ms=200)
        assert socket.poll(1000)
        reply = protocol.decode(socket.recv_multipart()[-1])
        assert isinstance(reply, protocol.ErrorReply) and reply.status == 400
    result, prompt = bench.prefilled("after-garbage")
    assert result.kv is not None


def test_each_forward_counts_one_iteration_of_the_tokens_it_computed(bench):
    """vllm:iteration_tokens_total, as vLLM's test_metrics_counts reads it: a 10-token request is 10 iterations (the
    prefill's, with the prompt and token 1; 9 decode steps of a row each) of prompt + 10 tokens. A decode step ahead
    of the host reads the step before's tokens: counted by what it read, the first step counted 0 tokens and the
    request 11 iterations."""
    params = dataclasses.replace(PARAMS, max_tokens=10)
    result, prompt = bench.prefilled("counted", num_tokens=12, params=params)
    bench.send_decode(result, prompt, params=params)
    bench.until(finished)
    bench.step(3)
    counts = {name: node.iteration_tokens for name, node in (("prefill", bench.prefill), ("decode", bench.decode))}
    assert (sum(counts["prefill"].bucket_counts), counts["prefill"].sum) == (1, 12 + 1)
    assert (sum(counts["decode"].bucket_counts), counts["decode"].sum) == (9, 9)
