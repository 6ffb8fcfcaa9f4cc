"""One prompt through the cluster: prefill on one node, then decode on another, token events streamed back; or
the whole request on one colocated node (NodePool.choose_colocated).

n samples: the prefill node prefills the prompt once and samples each sample's first token; one decode node
reads the KV once and decodes every sample from its own copy. Events carry the sample's index.

Usable without HTTP: `async for event in generate(pool, request_id, prompt_token_ids, params, seed)`.
A failure a retry can cure (503: a node gone, a KV lease expired, a KV read failed) re-runs the request, on
the least loaded nodes again, skipping the tokens already delivered: outputs are deterministic, so the re-run
continues exactly where the first run stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
from collections.abc import AsyncIterator, Callable, Container

from msgspec.structs import replace

from router.nodes.choice import NoNodeAvailable, NotPlaceable, Placement, RoutedRequest, UnknownNode
from router.nodes.client import SILENT, NodeClient, ReplyQueue
from router.nodes.pool import NodePool
from wire.protocol import (
    Abort,
    DecodeRequest,
    ErrorReply,
    GenerateRequest,
    PrefillRequest,
    PrefillResult,
    TokenEvent,
)
from wire.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
NODE_CHECK_INTERVAL_S = 0.5
UNREACHABLE_AFTER_S = 3.0
"""How long a send waits on a node that is down before the attempt fails over (a restart may be that quick)."""
RETRYABLE_STATUSES = frozenset({503})

TokenPush = Callable[[TokenEvent], bool]
"""Takes a token event straight from the node's receive loop (router/nodes/client.py, ReplyQueue.push) the whole
way to the client, doing what each generator below would have done with it: True once delivered; False, having
changed nothing, for an event that needs the request's coroutine (a sample's first or last, one a retry replays, one
its consumer cannot take now), which then queues for it as every event did before. Each layer adds its own check."""


class GenerationError(Exception):
    """A request the cluster could not serve; `status` is the HTTP status to answer with. constraint_reason: where
    a node refused the request's structured-output constraint, the grammar library's reason (the API layer answers
    naming the field the constraint came from, without the node's name and ids)."""

    def __init__(self, status: int, message: str, constraint_reason: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.constraint_reason = constraint_reason


async def generate(pool: NodePool, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                   seed: int, placement: Placement = Placement(), stopped: set[int] | None = None,
                   on_queue_time: Callable[[float], None] = lambda seconds: None,
                   push: TokenPush | None = None, tenant: str = "") -> AsyncIterator[TokenEvent]:
    """Prefill then decode; yields token events (event.index: the sample), each sample's last one with its
    finish_reason. stopped: samples the consumer has ended (a stop string): the nodes stop decoding them.
    on_queue_time: told how long the prompt waited in the prefill node's queue (each attempt's). push: takes what
    events it can instead of this generator (they are not yielded). tenant: the request's client, whose prompts a
    prefill or colocated node takes in turn with other clients' (PrefillRequest.tenant, GenerateRequest.tenant).

    Closing the iterator early (or cancelling its consumer) aborts the work on the nodes. Raises GenerationError.
    """
    stopped = set() if stopped is None else stopped
    if params.seed != seed:  # NOTE: the request's seed travels once, as params.seed
        params = dataclasses.replace(params, seed=seed)
    progress = SampleProgress()
    push = None if push is None else progress.pushing(push)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        # NOTE: a fresh id per attempt: a late reply to a failed attempt can never mix into the next one.
        attempt_id = request_id if attempt == 1 else f"{request_id}:retry{attempt - 1}"
        try:
            attempt_events = generate_once(pool, attempt_id, prompt_token_ids, params, placement,
                                           lambda index: index in stopped or index in progress.finished,
                                           on_queue_time, push, tenant)
            async with contextlib.aclosing(attempt_events) as events:
                progress.start_attempt()
                async for event in events:
                    event = progress.new_part(event)
                    if event is not None:
                        yield event if attempt == 1 else replace(event, request_id=request_id)
            return
        except GenerationError as error:
            if error.status not in RETRYABLE_STATUSES or attempt == MAX_ATTEMPTS or pool.closing:
                raise
            logger.warning("request %s: attempt %d failed (%s); retrying", request_id, attempt, error.message)


class SampleProgress:
    """What each sample has delivered, so that a re-run (deterministic: the same tokens again) continues exactly
    where the failed attempt stopped: a sample's tokens already delivered are skipped, a finished sample's
    events dropped."""

    def __init__(self):
        self.delivered: dict[int, int] = {}
        self.finished: set[int] = set()
        self.seen: dict[int, int] = {}

    def start_attempt(self) -> None:
        self.seen = {}

    def pushing(self, push: TokenPush) -> TokenPush:
        """push for the events new_part would pass unchanged (nothing to skip, not finishing), counted as it
        counts them."""
        def push_new(event: TokenEvent) -> bool:
            index, num_tokens = event.index, len(event.token_ids)
            num_seen = self.seen.get(index, 0)
            if index in self.finished or self.delivered.get(index, 0) > num_seen or not push(event):
                return False
            self.seen[index] = num_seen + num_tokens
            self.delivered[index] = self.delivered.get(index, 0) + num_tokens
            return True
        return push_new

    def new_part(self, event: TokenEvent) -> TokenEvent | None:
        index = event.index
        if index in self.finished:
            return None
        num_seen = self.seen.get(index, 0)
        self.seen[index] = num_seen + len(event.token_ids)
        skip = min(len(event.token_ids), max(0, self.delivered.get(index, 0) - num_seen))
        if skip == len(event.token_ids) and event.finish_reason is None:
            return None
        if skip:
            logprobs = None if event.logprobs is None else event.logprobs[skip:]
            event = replace(event, token_ids=event.token_ids[skip:], logprobs=logprobs)
        self.delivered[index] = self.delivered.get(index, 0) + len(event.token_ids)
        if event.finish_reason is not None:
            self.finished.add(index)
        return event


async def generate_once(pool: NodePool, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                        placement: Placement,
                        is_done: Callable[[int], bool] = lambda index: False,
                        on_queue_time: Callable[[float], None] = lambda seconds: None,
                        push: TokenPush | None = None, tenant: str = "") -> AsyncIterator[TokenEvent]:
    # NOTE: the choice is given the request (its prompt, its samples), so that a policy may route on the prompt
    routed = RoutedRequest(request_id, prompt_token_ids, params.n, placement, params.max_tokens)
    choose(pool.check_placeable, routed)  # NOTE: an n no node can hold is refused here, before any prefill
    colocated = choose(pool.choose_colocated, routed)
    if colocated is not None:
        # NOTE: the node prefills and decodes; its events are a decode node's, the prompt's logprobs included
        request = GenerateRequest(request_id, prompt_token_ids, params, tenant=tenant)
        decoding = run_decode(colocated, request, pool.request_timeout_s, is_done, push)
        async with contextlib.aclosing(decoding) as events:
            async for event in events:
                yield event
        return
    prefill_node = choose(pool.choose_prefill, routed)
    prefill = await run_prefill(prefill_node, PrefillRequest(request_id, prompt_token_ids, params, tenant=tenant),
                                params.n, pool.request_timeout_s)
    on_queue_time(prefill.queue_seconds)
    for first in prefill.first_tokens:
        if first.finish_reason is not None:
            # NOTE: finished by its first token (stop token or max_tokens == 1): nothing to decode.
            logprobs = None if first.logprobs is None else [first.logprobs]
            yield TokenEvent(request_id, [first.token_id], logprobs, first.finish_reason, prefill.prompt_logprobs,
                             first.index, prefill.num_cached_tokens)
    if prefill.kv is not None:
        decoding = decode_prefilled(pool, prefill_node, routed, prefill, params, is_done, push, tenant)
        async with contextlib.aclosing(decoding) as events:
            async for event in events:
                yield event


async def decode_prefilled(pool: NodePool, prefill_node: NodeClient, routed: RoutedRequest, prefill: PrefillResult,
                           params: SamplingParams, is_done: Callable[[int], bool],
                           push: TokenPush | None = None, tenant: str = "") -> AsyncIterator[TokenEvent]:
    """The samples the prefill left to decode, on a decode node that reads the prompt's KV from prefill_node.

    NOTE: a decode node streams only once it has read the KV (the prefill node freed it then). If this ends before
    that (the decode node refused the request, failed it, died, or the client left), the lease goes back now: an
    Abort ends an unclaimed lease at once (a claimed one is its claimer's to give back), instead of holding the
    prefill node's blocks for kv_lease_seconds."""
    request_id, prompt_logprobs = routed.request_id, prefill.prompt_logprobs
    to_decode = [first for first in prefill.first_tokens if first.finish_reason is None]
    decode_request = DecodeRequest(request_id, routed.prompt_token_ids, params, to_decode, prefill.kv, tenant=tenant)
    with_prompt = {first.index for first in to_decode}
    kv_read = False
    try:
        # NOTE: chosen only now, so that the decode work of requests prefilled meanwhile counts in the choice.
        decode_node = choose(pool.choose_decode, routed)
        async with contextlib.aclosing(run_decode(decode_node, decode_request, pool.request_timeout_s,
                                                  is_done, push, with_prompt)) as events:
            async for event in events:
                kv_read = True
                # NOTE: the prompt's logprobs and cached tokens travel with each sample's first event
                if event.index in with_prompt:
                    with_prompt.discard(event.index)
                    event = replace(event, prompt_logprobs=prompt_logprobs,
                                    num_cached_tokens=prefill.num_cached_tokens)
                yield event
    finally:
        if not kv_read:
            prefill_node.post(Abort(request_id))


def choose(choose_node: Callable[[RoutedRequest], NodeClient | None], request: RoutedRequest) -> NodeClient | None:
    """The node choose_node picks; a 400 for a pin to no node of the pool or a request no node can hold (both
    known before any node sees the request), a 503 when every node of the role is draining."""
    try:
        return choose_node(request)
    except (UnknownNode, NotPlaceable) as error:
        raise GenerationError(400, str(error)) from None
    except NoNodeAvailable as error:
        raise GenerationError(503, str(error)) from None


async def run_prefill(node: NodeClient, request: PrefillRequest, num_samples: int,
                      timeout_s: float) -> PrefillResult:
    with node.open_request(request.request_id, work=len(request.prompt_token_ids)) as replies:
        try:
            await send_within(node, request, timeout_s)
            reply = await next_reply(node, replies, timeout_s)
        except BaseException:
            # NOTE: cancelled or timed out before the result: take it off the node's queue. Never after the
            # result: a decode node may be reading the KV by then.
            node.post(Abort(request.request_id))
            raise
    if not isinstance(reply, PrefillResult) or [first.index for first in reply.first_tokens] != list(
            range(num_samples)):
        raise node_failure(node, 502, f"answered {type(reply).__name__} without {num_samples} first token(s)")
    if reply.kv is None and any(first.finish_reason is None for first in reply.first_tokens):
        raise node_failure(node, 502, "answered without KV")
    return reply


async def run_decode(node: NodeClient, request: DecodeRequest | GenerateRequest, timeout_s: float,
                     is_done: Callable[[int], bool] = lambda index: False,
                     push: TokenPush | None = None,
                     yield_next: Container[int] = frozenset()) -> AsyncIterator[TokenEvent]:
    """The samples' token events until each finished; a sample is_done says the consumer ended is aborted on
    the node at its next event (which is dropped). A decode node decodes request.first_tokens' samples, a
    colocated node every sample of the GenerateRequest. push: takes the events it can of running samples, not
    their last (the node's receive loop hands it them), nor those of samples in yield_next (the caller's live set:
    decode_prefilled gives a sample's first event the prompt's logprobs, then takes it out)."""
    if isinstance(request, GenerateRequest):
        running = set(range(request.params.n))
    else:
        running = {first.index for first in request.first_tokens}
    aborted: set[int] = set()
    with node.open_request(request.request_id, work=len(running)) as replies:
        if push is not None:
            replies.push = running_push(push, running, is_done, yield_next)
        try:
            await send_within(node, request, timeout_s)
            while running:
                event = await next_reply(node, replies, timeout_s)
                if isinstance(event, TokenEvent):
                    event = take_queued_tokens(event, replies)
                if isinstance(event, TokenEvent) and event.index in aborted:
                    continue  # NOTE: decoded before the node saw the sample's Abort
                if not isinstance(event, TokenEvent) or event.index not in running:
                    raise node_failure(node, 502, f"answered {type(event).__name__} for no running sample")
                if event.finish_reason is not None:
                    running.discard(event.index)
                elif is_done(event.index):
                    running.discard(event.index)
                    aborted.add(event.index)
                    node.post(Abort(request.request_id, event.index))
                    continue
                yield event
        finally:
            if running:
                # NOTE: consumer gone, stop string matched, node failed or silent: free the decode slots.
                node.post(Abort(request.request_id))


def running_push(push: TokenPush, running: set[int], is_done: Callable[[int], bool],
                 yield_next: Container[int] = frozenset()) -> Callable[[object], bool]:
    """push for the replies run_decode would yield as they are: token events of running samples, not their last,
    nor one of a sample its consumer has ended (run_decode aborts it), nor one of a sample in yield_next."""
    def push_running(reply) -> bool:
        return (type(reply) is TokenEvent and reply.finish_reason is None and reply.index in running
                and reply.index not in yield_next and not is_done(reply.index) and push(reply))
    return push_running


def take_queued_tokens(event: TokenEvent, replies: ReplyQueue) -> TokenEvent:
    """event with the same sample's tokens that queued up behind it (the consumer fell behind the decode steps):
    one delta, one SSE chunk and one write for them all, as vLLM's output processor merges what it finds queued;
    a router keeping up finds nothing queued and streams one token per step."""
    while event.finish_reason is None and not replies.empty():
        queued = replies.peek()
        if type(queued) is not TokenEvent or queued.index != event.index or (queued.logprobs is None) != (
                event.logprobs is None) or queued.prompt_logprobs is not None or queued.num_cached_tokens is not None:
            break
        replies.get_nowait()
        logprobs = None if event.logprobs is None else event.logprobs + queued.logprobs
        event = replace(event, token_ids=event.token_ids + queued.token_ids, logprobs=logprobs,
                        finish_reason=queued.finish_reason)
    return event


async def send_within(node: NodeClient, message, timeout_s: float) -> None:
    """Send; a 503 once the node has been unhealthy (down, restarting) for UNREACHABLE_AFTER_S of the wait, or
    at timeout_s. NOTE: a send to a node with no connection waits (zmq IMMEDIATE): without this bound, a request
    sent while its only node of a role restarts waited the whole request timeout, in silence."""
    sending = node.send(message)
    if sending.done():  # NOTE: the common case, a connected node: no task, no timer
        sending.result()
        return
    loop = asyncio.get_running_loop()
    deadline, unhealthy_since = loop.time() + timeout_s, None
    try:
        while not (await asyncio.wait({sending}, timeout=NODE_CHECK_INTERVAL_S))[0]:
            now = loop.time()
            unhealthy_since = None if node.healthy else (unhealthy_since or now)
            if (now >= deadline or node.router_closing
                    or (unhealthy_since is not None and now - unhealthy_since >= UNREACHABLE_AFTER_S)):
                raise node_failure(node, 503, "is unreachable")
    finally:
        sending.cancel()
    sending.result()


async def next_reply(node: NodeClient, replies: ReplyQueue, timeout_s: float):
    """The node's next message for this request; ErrorReply and silence become GenerationError.

    NOTE: a wait ends soon after the node stops answering pings (router/nodes/client.py, UNHEALTHY_WAIT_S), so a dead
    node costs a few seconds at most (then a retry elsewhere), not the whole request timeout.
    """
    reply = await replies.next_within(timeout_s)
    if reply is SILENT:
        raise silence_error(node, timeout_s, replies.ended_unhealthy)
    if isinstance(reply, ErrorReply):
        raise node_failure(node, reply.status, f": {reply.message}", constraint_reason=reply.constraint_reason)
    return reply


def silence_error(node: NodeClient, timeout_s: float, stopped_answering: bool) -> GenerationError:
    """stopped_answering: the wait ended because the node did (its watchdog), not at timeout_s.

    NOTE: a node that still answers pings is alive but slow (504); one that does not is gone (503). Its health is
    read again only for a wait that reached its deadline: one ended by the node's silence may end just before the
    node is heard again, and was then reported as a 504 "sent nothing for <the whole timeout>"."""
    if stopped_answering or not node.healthy:
        return node_failure(node, 503, "stopped answering")
    return node_failure(node, 504, f"sent nothing for {timeout_s:g} s")


def node_failure(node: NodeClient, status: int, what: str, constraint_reason: str | None = None) -> GenerationError:
    """A node's failure as the client sees it ("<node> <what>", or "<node>: <message>" for what = ": <message>"):
    the node by its name, and no address, even one a node's own message holds (the log line has them)."""
    text = f"{node.name}{'' if what.startswith(':') else ' '}{what}"
    logger.warning("%s (at %s)", text, node.address)
    return GenerationError(status, without_addresses(text), constraint_reason)


ADDRESS = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s,;)\]'\"]+|\[[0-9a-fA-F:.]+\](:\d+)?|\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b"
                     r"|\b[\w.-]+:\d{2,5}\b")
"""An endpoint (tcp://..., ipc://..., ucx://...), an IP address with or without a port, or host:port."""


def without_addresses(text: str) -> str:
    return ADDRESS.sub("<address>", text)
