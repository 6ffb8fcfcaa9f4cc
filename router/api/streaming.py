"""A streamed response (server-sent events): its chunks, written by the request's coroutine, or, for a plain token
of a choice already open, straight from the node's receive loop (the fast path, ChunkWriter.accepts / take).

NOTE: the fast path (issue 21): the router spent more CPU waking each stream's coroutine for each decode step, and
resuming the generators between it and the node, than on the token's own detokenizing, framing and write. A decode
step's tokens are now written in one pass of the receive loop; the coroutine wakes for what needs it (a choice's
first and last chunks, stops, errors, retries) and for a client that is not keeping up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import msgspec
from aiohttp import hdrs, web

from router.api.errors import error_body
from router.api.openai_api import GenerationRequest
from router.api.responses import (
    JSON_ENCODER,
    ChoiceDelta,
    ResponseContext,
    chunk_choice,
    format_logprobs,
    role_choice,
    usage,
    usage_chunk,
)
from router.api.tools import ToolStream
from router.generation.deltas import DeltaOutlet
from router.generation.pipeline import GenerationError
from wire.outputs import TokenLogprobs

logger = logging.getLogger(__name__)

PUSH_BUFFER_LIMIT_BYTES = 64 * 2**10
"""A client whose connection buffers more than this (unsent) is not keeping up: its chunks go through its coroutine,
which waits for the buffer to drain (aiohttp's write), rather than growing the buffer without bound. asyncio's
default high-water mark."""


async def stream_response(request: web.Request, ctx: ResponseContext, generation: GenerationRequest,
                          deltas: AsyncIterator[ChoiceDelta], headers: dict,
                          outlet: DeltaOutlet | None = None) -> web.StreamResponse:
    """Server-sent events. The response starts with the first delta, so that a request failing before any
    token still gets its real HTTP status. outlet: where the deltas' fast path finds the writer (None: no fast
    path)."""
    first_delta = await anext(deltas)
    response = EventStream(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers})
    await response.prepare(request)
    writer = ChunkWriter(response, ctx, continuous_prompt_tokens(generation))
    if outlet is not None:
        writer.open_fast_path(request)
        outlet.sink = writer
    try:
        ending = await write_events(writer, generation, first_delta, deltas)
        await response.write_eof(ending)
    except ConnectionResetError:
        logger.info("the client of request %s went away", ctx.request_id)
    finally:
        writer.close_fast_path()
    return response


class EventStream(web.StreamResponse):
    """A StreamResponse whose head goes out with its first chunk, in one write. NOTE: aiohttp's knob (web.Response
    sets it too); the first chunk is written right after prepare() (stream_response), so no client waits longer."""

    _send_headers_immediately = False


def continuous_prompt_tokens(generation: GenerationRequest) -> int | None:
    """stream_options.continuous_usage_stats: every chunk carries the usage so far (its prompt tokens)."""
    return sum(len(prompt) for prompt in generation.prompts) if generation.continuous_usage else None


async def write_events(writer: ChunkWriter, generation: GenerationRequest, first_delta: ChoiceDelta,
                       deltas: AsyncIterator[ChoiceDelta]) -> bytes:
    """Write the choices' chunks; returns the stream's ending (the last choice's last chunk, usage or the error,
    [DONE]), for the response's last write. NOTE: one write, one syscall, where there were three."""
    ctx = writer.ctx
    try:
        ending = [await write_deltas(writer, first_delta, deltas)]
        if generation.include_usage:
            num_prompt_tokens = sum(len(prompt) for prompt in generation.prompts)
            ending.append(sse_event(usage_chunk(ctx, num_prompt_tokens, writer.num_tokens,
                                                ctx.cached_tokens(writer.choice_to_cached))))
    except GenerationError as error:
        # NOTE: the status line is gone already; the error travels as an event, as vLLM sends it.
        logger.warning("request %s failed mid-stream: %s", ctx.request_id, error.message)
        ending = [sse_event(error_body(error.status, error.message))]
    return b"".join([*ending, b"data: [DONE]\n\n"])


async def write_deltas(writer: ChunkWriter, first_delta: ChoiceDelta, deltas: AsyncIterator[ChoiceDelta]) -> bytes:
    """Send first_delta, then each of deltas the fast path did not send, as chunks (a delta's in one write); the
    chunks of the delta that ends the last open choice are returned instead, for the stream's last write."""
    delta, held = first_delta, b""
    while delta is not None:
        events = b"".join(writer.events(delta))
        if writer.all_finished:
            held = events
        else:
            await writer.response.write(events)
        delta = await anext(deltas, None)
    writer.close_fast_path()  # NOTE: nothing more may follow the choices' chunks but usage and [DONE]
    return held


class ChunkWriter:
    """One streamed response's chunks and what they have counted (text offsets, completion tokens, cached prompt
    tokens, tool calls): the state both the request's coroutine (events) and the fast path (accepts, take) write
    from."""

    def __init__(self, response: web.StreamResponse, ctx: ResponseContext, continuous_prompt_tokens: int | None):
        """continuous_prompt_tokens: every chunk carries the usage so far (stream_options.continuous_usage_stats)."""
        self.response, self.ctx = response, ctx
        self.continuous_prompt_tokens = continuous_prompt_tokens
        self.num_tokens = 0
        """Completion tokens sent."""
        self._num_finished = 0
        self.choice_to_cached: dict[int, int | None] = {}
        self._text_offsets: dict[int, int] = {}
        self._tool_streams: dict[int, ToolStream] = {}
        self._chunks = ChunkEncoder(ctx)
        self._plain_chunks: dict[int, PlainChunk] = {}
        """Per choice: its chunks for plain deltas, when they can be written from a template (not with tool calls or
        continuous usage stats, which rewrite or add to every chunk)."""
        self._transport: asyncio.Transport | None = None
        """Where the fast path writes (HTTP chunked framing its own); None while it is closed."""

    def open_fast_path(self, request: web.Request) -> None:
        """Call once the response is prepared. NOTE: only a chunked, uncompressed body: the fast path frames each
        chunk itself, and writes to the connection's transport (aiohttp's own write is a coroutine)."""
        headers = self.response.headers
        if headers.get(hdrs.TRANSFER_ENCODING) == "chunked" and hdrs.CONTENT_ENCODING not in headers:
            self._transport = request.transport

    def close_fast_path(self) -> None:
        self._transport = None

    def accepts(self, index: int) -> bool:
        """Whether take may write choice index's next delta now: the choice is open (its first chunks sent) and
        the client keeps up."""
        transport = self._transport
        return (transport is not None and index in self._text_offsets and not transport.is_closing()
                and transport.get_write_buffer_size() <= PUSH_BUFFER_LIMIT_BYTES)

    def take(self, delta: ChoiceDelta) -> None:
        """Write a delta accepts allowed, straight to the connection (one HTTP chunk per event)."""
        for event in self.events(delta):
            self._transport.write(b"%x\r\n%b\r\n" % (len(event), event))

    def take_text(self, index: int, text: str, token_ids: list[int], logprobs: list[TokenLogprobs] | None = None
                  ) -> None:
        """take() of a delta of text, token ids and logprobs alone (router/generation/deltas.py, DeltaSink), from its
        choice's chunk template when it has one."""
        plain = self._plain_chunks.get(index)
        if plain is None:
            self.take(ChoiceDelta(index, text, tuple(token_ids), None if logprobs is None else tuple(logprobs), None))
            return
        encoded_logprobs = None
        if logprobs is not None:
            formatted, self._text_offsets[index] = format_logprobs(self.ctx, logprobs, self._text_offsets[index])
            encoded_logprobs = JSON_ENCODER.encode(formatted)
        self.num_tokens += 0 if self.ctx.output.drop_generated else len(token_ids)
        self._transport.write(plain.http_chunk(text, token_ids, encoded_logprobs))

    def events(self, delta: ChoiceDelta) -> list[bytes]:
        """The server-sent events of one delta: its chunk, after the choice's opening chunks on a chat choice's
        first delta."""
        ctx = self.ctx
        first = delta.index not in self._text_offsets
        plain = self._plain_chunks.get(delta.index)
        if plain is not None and is_plain(delta):
            self.num_tokens += 0 if ctx.output.drop_generated else len(delta.token_ids)
            return [plain.event(delta)]
        if first and ctx.tools is None and self.continuous_prompt_tokens is None:
            self._plain_chunks[delta.index] = PlainChunk(ctx, self._chunks, delta.index)
        if delta.num_cached_tokens is not None:
            self.choice_to_cached[delta.index] = delta.num_cached_tokens
        events = self.chat_opening(delta.index) if ctx.kind == "chat" and first else []
        choice, self._text_offsets[delta.index] = chunk_choice(ctx, delta, self._text_offsets.get(delta.index, 0),
                                                               first)
        if ctx.tools is not None:
            stream = self._tool_streams.setdefault(delta.index, ToolStream(ctx.tools, ctx.request_id, delta.index))
            choice = stream.rewrite(choice)
        self.num_tokens += 0 if ctx.output.drop_generated else len(delta.token_ids)
        self._num_finished += delta.finish_reason is not None
        events.append(self._chunks.event(choice, self.usage_so_far()))
        return events

    @property
    def all_finished(self) -> bool:
        """Every choice's last chunk is made (NOTE: ctx.prompts has one entry per choice)."""
        return self._num_finished == len(self.ctx.prompts)

    def usage_so_far(self) -> dict | None:
        if self.continuous_prompt_tokens is None:
            return None
        return usage(self.continuous_prompt_tokens, self.num_tokens)

    def chat_opening(self, index: int) -> list[bytes]:
        """A chat choice's first chunks, as vLLM's: the role (with the prompt's token ids when asked:
        return_token_ids), then the echoed last message (echo). NOTE: with continuous usage stats these carry usage
        so far (0 completion tokens), not null."""
        ctx = self.ctx
        opening_usage = None if self.continuous_prompt_tokens is None else usage(self.continuous_prompt_tokens, 0)
        if ctx.output.return_token_ids:
            events = [sse_event({**ctx.envelope(streaming=True), "choices": [role_choice(index)],
                                 "usage": opening_usage, "prompt_token_ids": list(ctx.prompts[index])})]
        else:
            events = [self._chunks.event(role_choice(index), opening_usage)]
        if ctx.output.chat_echo:
            echo = {"index": index, "delta": {"content": ctx.output.chat_echo}, "logprobs": None,
                    "finish_reason": None}
            events.append(self._chunks.event(echo, opening_usage))
        return events


def is_plain(delta: ChoiceDelta) -> bool:
    """Nothing but text and token ids: neither a choice's first delta (the writer knows) nor its last."""
    return (delta.logprobs is None and delta.finish_reason is None and delta.stop_reason is None
            and delta.prompt_logprobs is None and delta.num_cached_tokens is None)


class PlainChunk:
    """One choice's chunk for a delta of text, token ids and (maybe) logprobs, after the choice's first: the bytes of
    chunk_choice's chunk around those three, written without building and encoding its dict per token."""

    def __init__(self, ctx: ResponseContext, chunks: ChunkEncoder, index: int):
        choice, _ = chunk_choice(ctx, ChoiceDelta(index, "", (), None, None), 0)
        choice["logprobs"] = msgspec.Raw(LOGPROBS_MARK)
        if ctx.kind == "completion":
            choice["text"] = msgspec.Raw(TEXT_MARK)
        else:
            choice["delta"]["content"] = msgspec.Raw(TEXT_MARK)
        self._with_ids = choice["token_ids"] is not None
        if self._with_ids:
            choice["token_ids"] = msgspec.Raw(IDS_MARK)
        # NOTE: JSON escapes every control character inside strings: the marks' bytes occur nowhere else. The
        # logprobs come first, then the ids, then the text, in both kinds of chunk (chunk_choice's key order).
        encoded = chunks.event(choice)
        self._head, rest = encoded.split(LOGPROBS_MARK)
        if self._with_ids:
            self._after_logprobs, rest = rest.split(IDS_MARK)
            self._before_text, self._tail = rest.split(TEXT_MARK)
        else:
            (self._after_logprobs, self._tail), self._before_text = rest.split(TEXT_MARK), b""
        self._plain_head = self._head + b"null" + self._after_logprobs
        """Up to the ids (or the text, without ids) of a delta without logprobs."""

    def event(self, delta: ChoiceDelta) -> bytes:
        """The chunk of a plain delta (is_plain)."""
        text = JSON_ENCODER.encode(delta.text)
        if not self._with_ids:
            return self._plain_head + text + self._tail
        return self._plain_head + JSON_ENCODER.encode(delta.token_ids) + self._before_text + text + self._tail

    def http_chunk(self, text: str, token_ids: list[int], logprobs: bytes | None = None) -> bytes:
        """The chunk of a delta of text, token_ids and logprobs (the choice's encoded logprobs, None for none),
        framed as one HTTP chunk (size line, data, CRLF), built in one join. NOTE: a call per streamed token."""
        head = self._plain_head if logprobs is None else self._head + logprobs + self._after_logprobs
        encoded_text = JSON_ENCODER.encode(text)
        if not self._with_ids:
            size = len(head) + len(encoded_text) + len(self._tail)
            return b"".join((b"%x\r\n" % size, head, encoded_text, self._tail, b"\r\n"))
        ids = JSON_ENCODER.encode(token_ids)
        size = len(head) + len(ids) + len(self._before_text) + len(encoded_text) + len(self._tail)
        return b"".join((b"%x\r\n" % size, head, ids, self._before_text, encoded_text, self._tail, b"\r\n"))


TEXT_MARK = b"\x01"
IDS_MARK = b"\x02"
LOGPROBS_MARK = b"\x03"


class ChunkEncoder:
    """A response's stream chunks as server-sent events: {envelope, "choices": [choice], "usage": usage}, the
    envelope every chunk repeats encoded once. NOTE: the bytes of send_event's encoding of that dict (msgspec keeps
    a dict's key order); one chunk is encoded per streamed token."""

    def __init__(self, ctx: ResponseContext):
        envelope = JSON_ENCODER.encode(ctx.envelope(streaming=True))
        self._head = b"data: " + envelope[:-1] + b',"choices":['

    def event(self, choice: dict, chunk_usage: dict | None = None) -> bytes:
        if chunk_usage is None:
            return self._head + JSON_ENCODER.encode(choice) + b'],"usage":null}\n\n'
        return self._head + JSON_ENCODER.encode(choice) + b'],"usage":' + JSON_ENCODER.encode(chunk_usage) + b"}\n\n"


def sse_event(body: dict) -> bytes:
    return b"data: " + JSON_ENCODER.encode(body) + b"\n\n"  # NOTE: one is built per streamed chunk
