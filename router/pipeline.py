"""One prompt through the cluster: prefill on one node, then decode on another, token events streamed back.

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
from collections.abc import AsyncIterator

from corun.protocol import Abort, DecodeRequest, ErrorReply, PrefillRequest, PrefillResult, TokenEvent
from corun.sampling_params import SamplingParams
from router.nodes import NodeClient, NodePool, NoNodeAvailable, Placement, UnknownNode

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
NODE_CHECK_INTERVAL_S = 0.5
RETRYABLE_STATUSES = frozenset({503})


class GenerationError(Exception):
    """A request the cluster could not serve; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


async def generate(pool: NodePool, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                   seed: int, placement: Placement = Placement()) -> AsyncIterator[TokenEvent]:
    """Prefill then decode; yields token events, the last one with its finish_reason.

    Closing the iterator early (or cancelling its consumer) aborts the work on the nodes. Raises GenerationError.
    """
    num_delivered = 0
    for attempt in range(1, MAX_ATTEMPTS + 1):
        # NOTE: a fresh id per attempt: a late reply to a failed attempt can never mix into the next one.
        attempt_id = request_id if attempt == 1 else f"{request_id}:retry{attempt - 1}"
        try:
            attempt_events = generate_once(pool, attempt_id, prompt_token_ids, params, seed, placement)
            async with contextlib.aclosing(attempt_events) as events:
                async for event in skip_tokens(events, num_delivered):
                    num_delivered += len(event.token_ids)
                    yield dataclasses.replace(event, request_id=request_id)
            return
        except GenerationError as error:
            if error.status not in RETRYABLE_STATUSES or attempt == MAX_ATTEMPTS:
                raise
            logger.warning("request %s: attempt %d failed (%s); retrying", request_id, attempt, error.message)


async def generate_once(pool: NodePool, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                        seed: int, placement: Placement) -> AsyncIterator[TokenEvent]:
    prefill_node = choose(pool.choose_prefill, placement.prefill)
    prefill = await run_prefill(prefill_node, PrefillRequest(request_id, prompt_token_ids, params, seed),
                                pool.request_timeout_s)
    if prefill.finish_reason is not None:
        # NOTE: finished by its first token (stop token or max_tokens == 1): the prefill node kept no KV.
        logprobs = None if prefill.first_logprobs is None else [prefill.first_logprobs]
        yield TokenEvent(request_id, [prefill.first_token_id], logprobs, prefill.finish_reason,
                         prefill.prompt_logprobs)
        return
    decode_request = DecodeRequest(request_id, prompt_token_ids, params, seed, prefill.first_token_id,
                                   prefill.first_logprobs, prefill.kv)
    # NOTE: chosen only now, so that the decode work of requests prefilled meanwhile counts in the choice.
    decode_node = choose(pool.choose_decode, placement.decode)
    prompt_logprobs = prefill.prompt_logprobs
    async with contextlib.aclosing(run_decode(decode_node, decode_request, pool.request_timeout_s)) as events:
        async for event in events:
            # NOTE: the prompt's logprobs travel with its first event
            yield event if prompt_logprobs is None else dataclasses.replace(event, prompt_logprobs=prompt_logprobs)
            prompt_logprobs = None


def choose(choose_node, pinned: str | None) -> NodeClient:
    try:
        return choose_node(pinned)
    except UnknownNode as error:
        raise GenerationError(400, str(error)) from None
    except NoNodeAvailable as error:
        raise GenerationError(503, str(error)) from None


async def run_prefill(node: NodeClient, request: PrefillRequest, timeout_s: float) -> PrefillResult:
    with node.open_request(request.request_id, work=len(request.prompt_token_ids)) as replies:
        try:
            await send_within(node, request, timeout_s)
            reply = await next_reply(node, replies, timeout_s)
        except BaseException:
            # NOTE: cancelled or timed out before the result: take it off the node's queue. Never after the
            # result: a decode node may be reading the KV by then.
            node.post(Abort(request.request_id))
            raise
    if not isinstance(reply, PrefillResult) or (reply.kv is None and reply.finish_reason is None):
        raise GenerationError(502, f"prefill node {node.address} answered {type(reply).__name__} without KV")
    return reply


async def run_decode(node: NodeClient, request: DecodeRequest, timeout_s: float) -> AsyncIterator[TokenEvent]:
    finished = False
    with node.open_request(request.request_id, work=1) as replies:
        try:
            await send_within(node, request, timeout_s)
            while not finished:
                event = await next_reply(node, replies, timeout_s)
                if not isinstance(event, TokenEvent):
                    raise GenerationError(502, f"decode node {node.address} answered {type(event).__name__}")
                finished = event.finish_reason is not None
                yield event
        finally:
            if not finished:
                # NOTE: consumer gone, stop string matched, node failed or silent: free the decode slot.
                node.post(Abort(request.request_id))


async def skip_tokens(events: AsyncIterator[TokenEvent], num_skip: int) -> AsyncIterator[TokenEvent]:
    """The events without their first num_skip tokens (those a failed attempt already delivered)."""
    num_seen = 0
    async for event in events:
        skip = min(len(event.token_ids), max(0, num_skip - num_seen))
        num_seen += len(event.token_ids)
        if skip == len(event.token_ids) and event.finish_reason is None:
            continue
        logprobs = None if event.logprobs is None else event.logprobs[skip:]
        yield dataclasses.replace(event, token_ids=event.token_ids[skip:], logprobs=logprobs)


async def send_within(node: NodeClient, message, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(node.send(message), timeout_s)
    except asyncio.TimeoutError:
        raise GenerationError(503, f"{node.role} node {node.address} is unreachable") from None


async def next_reply(node: NodeClient, replies: asyncio.Queue, timeout_s: float):
    """The node's next message for this request; ErrorReply and silence become GenerationError.

    NOTE: waits in short slices and gives up as soon as the node stops answering pings, so a dead node costs
    a few seconds (then a retry elsewhere), not the whole request timeout.
    """
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            reply = await asyncio.wait_for(replies.get(), max(0.0, min(NODE_CHECK_INTERVAL_S, remaining)))
            break
        except asyncio.TimeoutError:
            if remaining <= NODE_CHECK_INTERVAL_S or not node.healthy:
                raise silence_error(node, timeout_s) from None
    if isinstance(reply, ErrorReply):
        raise GenerationError(reply.status, f"{node.role} node {node.address}: {reply.message}")
    return reply


def silence_error(node: NodeClient, timeout_s: float) -> GenerationError:
    # NOTE: a node that still answers pings is alive but slow (504); one that does not is gone (503).
    if node.healthy:
        return GenerationError(504, f"{node.role} node {node.address} sent nothing for {timeout_s:g} s")
    return GenerationError(503, f"{node.role} node {node.address} stopped answering")
