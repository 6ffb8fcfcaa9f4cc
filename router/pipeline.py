"""One prompt through the cluster: prefill on one node, then decode on another, token events streamed back.

Usable without HTTP: `async for event in generate(pool, request_id, prompt_token_ids, params, seed)`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from corun.protocol import Abort, DecodeRequest, ErrorReply, PrefillRequest, PrefillResult, TokenEvent
from corun.sampling_params import SamplingParams
from router.nodes import NodeClient, NodePool


class GenerationError(Exception):
    """A request the cluster could not serve; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


async def generate(pool: NodePool, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                   seed: int) -> AsyncIterator[TokenEvent]:
    """Prefill then decode; yields the decode node's events, the last one with its finish_reason.

    Closing the iterator early (or cancelling its consumer) aborts the decode. Raises GenerationError.
    """
    prefill = await run_prefill(pool, PrefillRequest(request_id, prompt_token_ids, params, seed))
    decode_request = DecodeRequest(request_id, prompt_token_ids, params, seed, prefill.first_token_id,
                                   prefill.first_logprobs, prefill.kv)
    async for event in run_decode(pool, decode_request):
        yield event


async def run_prefill(pool: NodePool, request: PrefillRequest) -> PrefillResult:
    node = pool.choose_prefill()
    with node.open_request(request.request_id, work=len(request.prompt_token_ids)) as replies:
        await send_within(node, request, pool.request_timeout_s)
        reply = await next_reply(node, replies, pool.request_timeout_s)
    if not isinstance(reply, PrefillResult):
        raise GenerationError(502, f"prefill node {node.address} answered {type(reply).__name__}")
    return reply


async def run_decode(pool: NodePool, request: DecodeRequest) -> AsyncIterator[TokenEvent]:
    node = pool.choose_decode()
    finished = False
    with node.open_request(request.request_id, work=1) as replies:
        try:
            await send_within(node, request, pool.request_timeout_s)
            while not finished:
                event = await next_reply(node, replies, pool.request_timeout_s)
                if not isinstance(event, TokenEvent):
                    raise GenerationError(502, f"decode node {node.address} answered {type(event).__name__}")
                finished = event.finish_reason is not None
                yield event
        finally:
            if not finished:
                # NOTE: consumer gone, stop string matched or node silent: free the decode slot.
                node.post(Abort(request.request_id))


async def send_within(node: NodeClient, message, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(node.send(message), timeout_s)
    except asyncio.TimeoutError:
        raise GenerationError(503, f"{node.role} node {node.address} is unreachable") from None


async def next_reply(node: NodeClient, replies: asyncio.Queue, timeout_s: float):
    """The node's next message for this request; ErrorReply and silence become GenerationError."""
    try:
        reply = await asyncio.wait_for(replies.get(), timeout_s)
    except asyncio.TimeoutError:
        raise silence_error(node, timeout_s) from None
    if isinstance(reply, ErrorReply):
        raise GenerationError(reply.status, f"{node.role} node {node.address}: {reply.message}")
    return reply


def silence_error(node: NodeClient, timeout_s: float) -> GenerationError:
    # NOTE: a node that still answers pings is alive but slow (504); one that does not is gone (503).
    if node.healthy:
        return GenerationError(504, f"{node.role} node {node.address} sent nothing for {timeout_s:g} s")
    return GenerationError(503, f"{node.role} node {node.address} stopped answering")
