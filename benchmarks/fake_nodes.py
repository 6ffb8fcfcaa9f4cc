"""`python -m benchmarks.fake_nodes --role prefill|decode --vocab-size V`: a node without a model, to load the router.

It speaks wire.protocol as the real nodes do (a zmq ROUTER socket, Ping/Pong with model facts), but computes
nothing: the prefill node answers each PrefillRequest at once (token 0 of benchmarks.fake_output, and a KV handle
no one reads); the decode node paces steps as a real one does: every --step-ms it sends each router one StepTokens
holding, for every running sample of that router, one TokenEvent with one new token, and ends each sample at
max_tokens (finish_reason "length"). Aborts stop samples.
Logprobs (a request's `logprobs` K) are benchmarks.fake_output.output_logprobs's; prompt logprobs get a 400. Like a
real decode node, this one never waits for the
router: a router that falls behind holds the events in zmq's and TCP's buffers and its own queues (neither side
has a HWM since the drops this benchmark found; a drop to a router that is gone is counted).

The decode node's step must stay cheap at a thousand samples on a small host (else the driver, not the router, is
measured): each sample's event bytes are packed once when it arrives, and a step only joins them with a packed
token id. How well it kept its pace is reported on its control socket (a REP socket: send b"window", get JSON of
what happened since the previous b"window").

On start it prints one JSON line {"address", "control", "pid"}; it runs until SIGTERM or until its parent exits.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass

import msgpack
import msgspec
import zmq

from benchmarks.fake_output import TOKEN_PERIOD, output_logprobs, output_token_id
from wire.protocol import (
    Abort,
    DecodeRequest,
    ErrorReply,
    FirstToken,
    KVHandle,
    ModelFacts,
    Ping,
    Pong,
    PrefillRequest,
    PrefillResult,
    ProtocolError,
    StepTokens,
    TokenEvent,
    decode,
    encode,
)

FINGERPRINT = "fake-node-router-throughput-v1"
"""Both fakes report it: the router refuses a pool whose nodes disagree."""
MAX_MODEL_LEN = 1 << 20
MAX_LOGPROBS = 20
PARENT_CHECK_S = 0.5
SPIN_BELOW_S = 0.001
"""zmq polls in whole milliseconds: the last one before a step is slept precisely instead."""


class FakeNode:
    role = ""

    def __init__(self, vocab_size: int, host: str = "127.0.0.1", port: int = 0):
        self.context = zmq.Context()
        self.server = self.context.socket(zmq.ROUTER)
        self.server.setsockopt(zmq.LINGER, 0)
        # NOTE: as the real nodes' ROUTER (node_core/serving.py): no send HWM, so a lagging router is never sent
        # fewer events. MANDATORY makes a drop that still happens (a router gone) countable instead of silent.
        self.server.setsockopt(zmq.SNDHWM, 0)
        self.server.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if port:
            self.server.bind(f"tcp://{host}:{port}")
        else:
            port = self.server.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self.control = self.context.socket(zmq.REP)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control_address = f"tcp://{host}:{self.control.bind_to_random_port(f'tcp://{host}')}"
        self.poller = zmq.Poller()
        self.poller.register(self.server, zmq.POLLIN)
        self.poller.register(self.control, zmq.POLLIN)
        self.node_id = f"fake-{self.role}-{port}"
        self.instance_id = uuid.uuid4().hex
        self.model_facts = ModelFacts(MAX_MODEL_LEN, vocab_size, MAX_LOGPROBS)
        self.window = WindowCounters()

    def close(self) -> None:
        self.server.close()
        self.control.close()
        self.context.term()

    def serve(self, parent_pid: int) -> None:
        next_parent_check = time.monotonic() + PARENT_CHECK_S
        while True:
            wait_s = min(self.seconds_to_next_step(), next_parent_check - time.monotonic())
            if wait_s < SPIN_BELOW_S:
                time.sleep(max(0.0, wait_s))
                ready = dict(self.poller.poll(0))
            else:
                ready = dict(self.poller.poll(int(wait_s * 1000)))
            if self.server in ready:
                self.receive_all()
            if self.control in ready:
                self.control.recv()
                self.control.send(json.dumps(self.take_window()).encode())
            self.step_if_due()
            if time.monotonic() >= next_parent_check:
                if os.getppid() != parent_pid:
                    return  # NOTE: the benchmark is gone (killed): no orphan keeps a port and a core busy
                next_parent_check = time.monotonic() + PARENT_CHECK_S

    def receive_all(self) -> None:
        while True:
            try:
                frames = self.server.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity = frames[0]
            try:
                message = decode(frames[-1])
            except ProtocolError as error:
                print(f"{self.node_id}: dropped a message: {error}", file=sys.stderr, flush=True)
                continue
            if isinstance(message, Ping):
                self.send(identity, encode(Pong(message.nonce, self.node_id, self.role, FINGERPRINT,
                                                self.model_facts, self.stats(), instance_id=self.instance_id)))
            elif hasattr(message, "params") and message.params.prompt_logprobs is not None:
                self.send(identity, encode(ErrorReply(message.request_id, 400, "the fake nodes make no prompt "
                                                                               "logprobs")))
            else:
                self.handle(identity, message)

    def send(self, identity: bytes, payload: bytes, num_events: int = 1) -> None:
        try:
            self.server.send_multipart([identity, payload], zmq.NOBLOCK)
        except zmq.ZMQError:  # NOTE: EAGAIN: the router's pipe is full (HWM); EHOSTUNREACH: that router is gone
            self.window.events_dropped += num_events
        else:
            self.window.events_sent += num_events

    def take_window(self) -> dict:
        window, self.window = self.window, WindowCounters()
        return {**window.as_dict(time.monotonic()), **self.stats()}

    def handle(self, identity: bytes, message) -> None:
        raise NotImplementedError

    def stats(self) -> dict:
        return {}

    def seconds_to_next_step(self) -> float:
        return PARENT_CHECK_S

    def step_if_due(self) -> None:
        pass


class WindowCounters:
    """What a node did since the control socket last asked."""

    def __init__(self):
        self.started = time.monotonic()
        self.events_sent = self.events_dropped = self.requests = self.aborts = 0
        self.step_intervals_s: list[float] = []
        self.step_emit_s: list[float] = []
        """How long each step took to send its events (the fake's own work per step)."""
        self.running_per_step: list[int] = []

    def as_dict(self, now: float) -> dict:
        return {"seconds": now - self.started, "events_sent": self.events_sent, "events_dropped": self.events_dropped,
                "requests": self.requests, "aborts": self.aborts, "step_intervals_s": self.step_intervals_s,
                "step_emit_s": self.step_emit_s, "running_per_step": self.running_per_step}


class FakePrefill(FakeNode):
    role = "prefill"

    def handle(self, identity: bytes, message) -> None:
        if not isinstance(message, PrefillRequest):
            return  # NOTE: an Abort: nothing is ever queued here
        self.window.requests += 1
        params, num_prompt_tokens = message.params, len(message.prompt_token_ids)
        finish_reason = "length" if params.max_tokens == 1 else None
        logprobs = None if params.logprobs is None else output_logprobs(0, params.logprobs)
        first_tokens = [FirstToken(index, output_token_id(0), logprobs, finish_reason) for index in range(params.n)]
        kv = None if finish_reason else KVHandle(self.node_id, self.address, (0,), num_prompt_tokens, "fake",
                                                 self.instance_id)
        self.send(identity, encode(PrefillResult(message.request_id, first_tokens, kv)))


PACKED_TOKENS = [msgpack.packb(output_token_id(position)) for position in range(TOKEN_PERIOD)]


@functools.cache
def packed_logprobs(num_top: int | None) -> list[bytes]:
    """Per output position (mod TOKEN_PERIOD): the packed logprobs of its event ([output_logprobs], or nil)."""
    if num_top is None:
        return [msgpack.packb(None)] * TOKEN_PERIOD
    return [msgspec.msgpack.encode([output_logprobs(position, num_top)]) for position in range(TOKEN_PERIOD)]


@dataclass
class RunningSample:
    identity: bytes
    head: bytes
    """The event's bytes inside StepTokens up to its one token id."""
    tail: bytes
    last_tail: bytes
    """The bytes after the logprobs: finish_reason null, or "length" on the sample's last event."""
    position: int
    """The next output position to send (0 is the prefill's token)."""
    max_tokens: int
    logprobs: list[bytes]
    """packed_logprobs of the request's logprobs."""

    def event(self, token_id: bytes, position: int) -> bytes:
        """The event of the token at position (token_id: its id, packed)."""
        ending = self.last_tail if position == self.max_tokens - 1 else self.tail
        return self.head + token_id + LOGPROBS_KEY + self.logprobs[position % TOKEN_PERIOD] + ending


LOGPROBS_KEY = msgpack.packb("logprobs")


def token_event_parts(request_id: str, index: int) -> tuple[bytes, bytes, bytes]:
    """(head, tail, last tail) such that head + packb(token id) + LOGPROBS_KEY + packed logprobs + tail is the
    wire.protocol encoding of TokenEvent(request_id, [token id], logprobs, None, index=index) inside a StepTokens
    (last tail: finish_reason "length")."""
    pack = msgpack.packb
    head = b"\x87" + pack("request_id") + pack(request_id) + pack("token_ids") + b"\x91"
    after_finish = pack("prompt_logprobs") + pack(None) + pack("index") + pack(index) + pack("num_cached_tokens") + \
        pack(None)
    finish = pack("finish_reason")
    return head, finish + pack(None) + after_finish, finish + pack("length") + after_finish


STEP_TOKENS_HEAD, STEP_TOKENS_TAIL = encode(StepTokens([])).split(b"\x90")
"""The bytes of a StepTokens message before and after its events' array (its type, then its version)."""


def step_tokens_bytes(events: list[bytes]) -> bytes:
    """wire.protocol.encode of StepTokens from the events' own bytes (token_event_parts)."""
    n = len(events)
    header = bytes([0x90 | n]) if n < 16 else (b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16
                                                else b"\xdd" + n.to_bytes(4, "big"))
    return STEP_TOKENS_HEAD + header + b"".join(events) + STEP_TOKENS_TAIL


def check_token_event_parts() -> None:
    """The hand-packed events must be byte for byte what the real nodes send: a protocol change stops the fake
    here, instead of feeding the router messages it refuses."""
    head, tail, last_tail = token_event_parts("request-x", 3)
    for num_top in (None, 2):
        sample = RunningSample(b"", head, tail, last_tail, 0, 7, packed_logprobs(num_top))
        for position, finish_reason in ((5, None), (6, "length")):
            logprobs = None if num_top is None else [output_logprobs(position, num_top)]
            events = [TokenEvent("request-x", [output_token_id(position)], logprobs, finish_reason, index=3)] * 20
            if step_tokens_bytes([sample.event(PACKED_TOKENS[position], position)] * 20) != encode(
                    StepTokens(events)):
                raise RuntimeError("wire.protocol's StepTokens changed: update token_event_parts and "
                                   "step_tokens_bytes in benchmarks/fake_nodes.py")


class FakeDecode(FakeNode):
    role = "decode"

    def __init__(self, vocab_size: int, step_s: float, host: str = "127.0.0.1", port: int = 0):
        check_token_event_parts()
        super().__init__(vocab_size, host, port)
        self.step_s = step_s
        self.running: dict[tuple[str, int], RunningSample] = {}
        self.next_step_at = time.monotonic() + step_s
        self.last_step_at: float | None = None

    def stats(self) -> dict:
        return {"num_running": len(self.running)}

    def handle(self, identity: bytes, message) -> None:
        if isinstance(message, DecodeRequest):
            self.window.requests += 1
            for first in message.first_tokens:
                head, tail, last_tail = token_event_parts(message.request_id, first.index)
                sample = RunningSample(identity, head, tail, last_tail, 0, message.params.max_tokens,
                                       packed_logprobs(message.params.logprobs))
                # NOTE: as the real node once its KV read is done: the prefill's token goes out at once, then one
                # token per step.
                self.send(identity, step_tokens_bytes([sample.event(msgpack.packb(first.token_id), 0)]))
                sample.position = 1
                if sample.position < sample.max_tokens:
                    self.running[(message.request_id, first.index)] = sample
        elif isinstance(message, Abort):
            self.window.aborts += 1
            for key in [key for key in self.running if key[0] == message.request_id
                        and message.index in (None, key[1])]:
                del self.running[key]

    def seconds_to_next_step(self) -> float:
        return self.next_step_at - time.monotonic()

    def step_if_due(self) -> None:
        start = time.monotonic()
        if start < self.next_step_at:
            return
        finished = []
        step_events: dict[bytes, list[bytes]] = {}
        for key, sample in self.running.items():
            step_events.setdefault(sample.identity, []).append(
                sample.event(PACKED_TOKENS[sample.position % TOKEN_PERIOD], sample.position))
            sample.position += 1
            if sample.position == sample.max_tokens:
                finished.append(key)
        for identity, events in step_events.items():
            self.send(identity, step_tokens_bytes(events), len(events))
        for key in finished:
            del self.running[key]
        end = time.monotonic()
        if self.last_step_at is not None:
            self.window.step_intervals_s.append(start - self.last_step_at)
            self.window.step_emit_s.append(end - start)
            self.window.running_per_step.append(len(self.running) + len(finished))
        self.last_step_at = start
        # NOTE: keep the cadence through wake-up jitter; after a stall of a whole step, restart it from now
        # rather than sending the missed steps in a burst (a real node never runs two steps at once).
        self.next_step_at += self.step_s
        if self.next_step_at <= end:
            self.next_step_at = end + self.step_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fake_nodes", description=__doc__.split("\n")[0])
    parser.add_argument("--role", choices=("prefill", "decode"), required=True)
    parser.add_argument("--vocab-size", type=int, required=True, help="what the node reports of its model")
    parser.add_argument("--step-ms", type=float, default=20.0, help="decode: the step interval")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    args = parser.parse_args(argv)
    parent_pid = os.getppid()
    if args.role == "prefill":
        node: FakeNode = FakePrefill(args.vocab_size, args.host, args.port)
    else:
        node = FakeDecode(args.vocab_size, args.step_ms / 1e3, args.host, args.port)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    print(json.dumps({"address": node.address, "control": node.control_address, "pid": os.getpid()}), flush=True)
    try:
        node.serve(parent_pid)
    except KeyboardInterrupt:
        pass
    finally:
        node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
