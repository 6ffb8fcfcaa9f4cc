"""In-process fake prefill and decode nodes: zmq.asyncio ROUTER servers speaking wire.protocol.

Their tokens are a pure function of (prompt, seed, position) over a list of candidate token ids, so a test can
compute the exact expected output with `expected_token_ids`. The decode node groups tokens into events of 1-3
tokens at random, which must not change anything the router returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import random
import re
from dataclasses import dataclass

import zmq
import zmq.asyncio

from wire.iteration_tokens import STAT_KEY as ITERATION_TOKENS_KEY
from wire.iteration_tokens import IterationTokenCounts
from wire.outputs import TokenLogprobs
from wire.protocol import (
    Abort,
    DecodeRequest,
    ErrorReply,
    FirstToken,
    KVHandle,
    ModelFacts,
    NodeCapacity,
    Ping,
    Pong,
    PrefillRequest,
    PrefillResult,
    StepTokens,
    TokenEvent,
    decode,
    encode,
)
from wire.sampling_params import SamplingParams
from wire.seeding import sample_seed

FAKE_FINGERPRINT = "fake-node-fingerprint-v1"


NODE_ID_TAG = re.compile(r"\.[0-9a-f]{5,}(?=-\d)")
"""The tag the router adds to a client-named request's ids on the nodes (router/api/state.py NodeIdTags)."""


def without_tag(request_id: str) -> str:
    """A node's request id as the client named the request: "r.1a2b0-0" -> "r-0"."""
    return NODE_ID_TAG.sub("", request_id, count=1)


def fake_token_id(candidate_ids: list[int], prompt_token_ids: list[int], seed: int, position: int) -> int:
    digest = hashlib.blake2b(repr((list(prompt_token_ids), seed, position)).encode(), digest_size=8).digest()
    return candidate_ids[int.from_bytes(digest, "little") % len(candidate_ids)]


def fake_logprobs(candidate_ids: list[int], token_id: int, position: int, k: int | None) -> TokenLogprobs | None:
    if k is None:
        return None
    top = tuple((candidate_ids[(position + i) % len(candidate_ids)], -0.5 * (i + 1)) for i in range(k))
    return TokenLogprobs(token_id, -0.25 - (position % 5) * 0.5, top)


def expected_token_ids(candidate_ids: list[int], prompt_token_ids: list[int], seed: int,
                       params: SamplingParams) -> list[int]:
    """What the fake cluster generates: max_tokens tokens, or fewer when a stop token id comes up."""
    token_ids: list[int] = []
    for position in range(len(prompt_token_ids), len(prompt_token_ids) + params.max_tokens):
        token_ids.append(fake_token_id(candidate_ids, prompt_token_ids, seed, position))
        if token_ids[-1] in params.stop_token_ids:
            break
    return token_ids


@dataclass(frozen=True)
class FakeBehaviour:
    event_delay_s: float = 0.0
    """decode: pause before each token event (a slow node)."""
    silent: bool = False
    """Take requests and never answer them (pings are still answered)."""
    error: tuple[int, str] | tuple[int, str, str] | None = None
    """Answer every request with ErrorReply(its id, *error): (status, message[, constraint_reason])."""
    fail_after_tokens: int | None = None
    """decode: after streaming this many tokens, fail the request with ErrorReply(503) (a lost KV read, a
    crashed peer), `num_failures` times in all; later requests run normally."""
    num_failures: int = 1
    num_slots: int | None = None
    """decode: samples decoded at once (a real node's max_num_seqs); the others wait for a free slot. None: any."""
    model_facts: ModelFacts | None = None
    """What the node reports of its model; None: FakeNode's default_facts."""
    capacity: NodeCapacity | None = None
    """What the node reports it can hold (Pong.capacity); None: nothing (the router lets the node judge)."""


FAKE_KV_USAGE = {"prefill": 0.5, "decode": 0.25}
"""What each fake node reports as kv_cache_usage_perc, by role."""


def fake_iteration_tokens(role: str) -> dict:
    """A fixed history of forwards: a prefill node ran one 10-token chunk, a decode node two 1-row steps."""
    steps = IterationTokenCounts()
    for num_tokens in ((10,) if role == "prefill" else (1, 1)):
        steps.observe(num_tokens)
    return steps.as_stat()


class FakeNode:
    def __init__(self, role: str, node_id: str, candidate_ids: list[int], behaviour: FakeBehaviour,
                 default_facts: ModelFacts):
        self.role, self.node_id, self.candidate_ids, self.behaviour = role, node_id, candidate_ids, behaviour
        self.model_facts = behaviour.model_facts or default_facts
        self.fingerprint = FAKE_FINGERPRINT
        self.received: list = []
        self.instance_id = "instance-1"
        """What its Pongs report: tests change it to play a node restarted in place."""
        self.address = ""
        self._socket: zmq.asyncio.Socket | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self, context: zmq.asyncio.Context, address: str | None = None) -> str:
        """Serve on a free port, or on address (a node restarted in place)."""
        self._socket = context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        if address is None:
            address = f"tcp://127.0.0.1:{self._socket.bind_to_random_port('tcp://127.0.0.1')}"
        else:
            await bind_when_free(self._socket, address)
        self.address = address
        self._spawn(self._serve())
        return self.address

    async def close(self) -> None:
        """NOTE: zmq's I/O thread unbinds the address after close returns: a node restarted on it waits for that
        (bind_when_free)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._socket.close()

    def request_ids(self, message_type: type) -> list[str]:
        """The ids of the messages of message_type received, as the client named the request (without_tag)."""
        return [without_tag(m.request_id) for m in self.received if isinstance(m, message_type)]

    def _spawn(self, coroutine) -> asyncio.Task:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _serve(self) -> None:
        while True:
            identity, payload = await self._socket.recv_multipart()
            message = decode(payload)
            self.received.append(message)
            if isinstance(message, Ping):
                await self._reply(identity, Pong(message.nonce, self.node_id, self.role, self.fingerprint,
                                                 self.model_facts, self.stats(), instance_id=self.instance_id,
                                                 capacity=self.behaviour.capacity))
            elif self.behaviour.error is not None and hasattr(message, "params"):
                await self._reply(identity, ErrorReply(message.request_id, *self.behaviour.error))
            elif not self.behaviour.silent:
                await self.handle(identity, message)

    async def _reply(self, identity: bytes, message) -> None:
        await self._socket.send_multipart([identity, encode(message)])

    def stats(self) -> dict:
        # NOTE: "engine" is not numeric: the router must skip it, not fail on it.
        return {"num_background_tasks": len(self._tasks), "kv_usage": 0.25,
                "num_requests_received": len(self.received), "engine": "fake",
                "kv_cache_usage_perc": FAKE_KV_USAGE[self.role],
                ITERATION_TOKENS_KEY: fake_iteration_tokens(self.role)}

    async def handle(self, identity: bytes, message) -> None:
        raise NotImplementedError


FAKE_QUEUE_S = 0.007
"""The queue time a fake prefill node reports."""


class FakePrefill(FakeNode):
    async def handle(self, identity: bytes, message) -> None:
        if not isinstance(message, PrefillRequest):
            return  # NOTE: Abort: nothing queued to drop, a fake prefill answers at once
        params, position = message.params, len(message.prompt_token_ids)
        first_tokens = []
        for index in range(params.n):
            seed = sample_seed(message.seed, index)
            token_id = fake_token_id(self.candidate_ids, message.prompt_token_ids, seed, position)
            logprobs = fake_logprobs(self.candidate_ids, token_id, position, params.logprobs)
            # NOTE: as the real prefill node: a sample finished by its first token gets no decode.
            finish_reason = "stop" if token_id in params.stop_token_ids else "length" if params.max_tokens == 1 \
                else None
            first_tokens.append(FirstToken(index, token_id, logprobs, finish_reason))
        finished = all(first.finish_reason for first in first_tokens)
        kv = None if finished else KVHandle(self.node_id, self.address, (0, 1), position, "fake-compat")
        await self._reply(identity, PrefillResult(message.request_id, first_tokens, kv, queue_seconds=FAKE_QUEUE_S))


class FakeDecode(FakeNode):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._streams: dict[str, asyncio.Task] = {}
        self._num_failures_left = self.behaviour.num_failures if self.behaviour.fail_after_tokens is not None else 0
        num_slots = self.behaviour.num_slots
        self._slots = contextlib.nullcontext() if num_slots is None else asyncio.Semaphore(num_slots)
        self.num_running = 0
        """Samples holding a slot now."""
        self.finished_request_ids: list[str] = []
        """Of each sample that sent its last token, in order."""

    async def handle(self, identity: bytes, message) -> None:
        if isinstance(message, DecodeRequest):
            fail_after = self._take_failure()
            for first in message.first_tokens:
                key = (message.request_id, first.index)
                self._streams[key] = self._spawn(self._stream(identity, message, first, fail_after))
        elif isinstance(message, Abort):
            for key in [k for k in self._streams if k[0] == message.request_id and message.index in (None, k[1])]:
                self._streams.pop(key).cancel()

    async def _stream(self, identity: bytes, request: DecodeRequest, first: FirstToken,
                      fail_after: int | None) -> None:
        async with self._slots:
            self.num_running += 1
            try:
                await self._send_output(identity, request, first, fail_after)
            finally:
                self.num_running -= 1

    async def _send_output(self, identity: bytes, request: DecodeRequest, first: FirstToken,
                           fail_after: int | None) -> None:
        remaining, num_sent = self.output(request, first), 0
        # NOTE: unseeded on purpose: event grouping differs from run to run and must not matter.
        grouping = random.Random()
        while remaining:
            if fail_after is not None and num_sent >= fail_after:
                await self._reply(identity, ErrorReply(request.request_id, 503, "KV read failed (fake)"))
                break
            size = 1 if fail_after is not None else grouping.randint(1, 3)
            group, remaining = remaining[:size], remaining[size:]
            await asyncio.sleep(self.behaviour.event_delay_s)
            await self._reply(identity, StepTokens([token_event(request, first.index, group, is_last=not remaining)]))
            num_sent += size
        if not remaining:
            self.finished_request_ids.append(without_tag(request.request_id))
        self._streams.pop((request.request_id, first.index), None)

    def _take_failure(self) -> int | None:
        """Tokens to send before failing this request, None when it runs normally."""
        if self._num_failures_left <= 0:
            return None
        self._num_failures_left -= 1
        return self.behaviour.fail_after_tokens

    def output(self, request: DecodeRequest, first: FirstToken) -> list[tuple[int, TokenLogprobs | None]]:
        """The prefill's token, then one per position until max_tokens or a stop token id."""
        params, position = request.params, len(request.prompt_token_ids)
        seed = sample_seed(request.seed, first.index)
        items = [(first.token_id, first.logprobs)]
        while len(items) < params.max_tokens and items[-1][0] not in params.stop_token_ids:
            position += 1
            token_id = fake_token_id(self.candidate_ids, request.prompt_token_ids, seed, position)
            items.append((token_id, fake_logprobs(self.candidate_ids, token_id, position, params.logprobs)))
        return items


def token_event(request: DecodeRequest, index: int, group: list[tuple[int, TokenLogprobs | None]],
                is_last: bool) -> TokenEvent:
    token_ids = [token_id for token_id, _ in group]
    finish_reason = None
    if is_last:
        finish_reason = "stop" if token_ids[-1] in request.params.stop_token_ids else "length"
    logprobs = None if request.params.logprobs is None else [lp for _, lp in group]
    return TokenEvent(request.request_id, token_ids, logprobs, finish_reason, index=index)


async def bind_when_free(socket: zmq.asyncio.Socket, address: str, timeout_s: float = 10.0) -> None:
    """Bind address once the socket closed on it has let it go: a closed zmq socket's I/O thread unbinds a moment
    later (on a loaded host, after the restarted node's bind: EADDRINUSE)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            socket.bind(address)
            return
        except zmq.ZMQError as error:
            if error.errno != errno.EADDRINUSE or asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(0.01)
