"""POST /v1/completions and /v1/chat/completions: id and seed binding, admission, full or streamed responses."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from router.api.auth import CLIENT_KEY
from router.api.clients import DEFAULT_CLIENT
from router.api.errors import RequestError, bad_request
from router.api.openai_api import GenerationRequest, Kind, bind_seed, parse_body
from router.api.responses import ChoiceDelta, ChoiceTotal, ResponseContext, response_body
from router.api.state import RouterState
from router.api.streaming import stream_response
from router.api.structured import refused_constraint
from router.generation.beam_search import beam_search_deltas
from router.generation.deltas import DeltaOutlet, merge, prompt_deltas
from router.generation.pipeline import GenerationError
from router.nodes.choice import Placement, UnknownNode
from wire.outputs import TokenLogprobs
from wire.seeding import seed_from_request_id

logger = logging.getLogger(__name__)

PIN_HEADERS = ("X-CoRun-Prefill-Node", "X-CoRun-Decode-Node")
MAX_FIELD_NAMES_HEADER = 1000
"""X-CoRun-Ignored-Fields is cut here: clients' parsers limit a response head too (h11, under httpx and openai:
16 KiB)."""
STATE_KEY = web.AppKey("router_state", RouterState)
RESPONSE_HEADERS_KEY = web.RequestKey("corun_response_headers", dict)
"""Headers every answer to this request carries, errors included (set as soon as they are known)."""
MAX_REQUEST_ID_LEN = 128


async def completions(request: web.Request) -> web.StreamResponse:
    return await serve_generation(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await serve_generation(request, "chat")


async def serve_generation(request: web.Request, kind: Kind) -> web.StreamResponse:
    """Within its client's limits (router/api/clients.py): the request is counted before its body is read, and its
    samples wait for the client's decode slots once it is parsed."""
    state = request.app[STATE_KEY]
    request_id, client_named = read_request_id(request)
    request[RESPONSE_HEADERS_KEY] = {"X-Request-Id": request_id}
    with state.clients.request(request.get(CLIENT_KEY, DEFAULT_CLIENT)) as client:
        body = await read_body(request)
        model = await state.model_info()
        placement = read_placement(request, state)
        generation = await state.offload.run(parse_body, body, kind, model)
        num_samples = len(generation.prompts) * generation.params.n
        async with state.clients.decode_slots(client, num_samples):
            with state.admission.admit(num_samples):
                return await generate_response(request, state, request_id, generation, placement, client.name,
                                               state.node_id_tags.fresh() if client_named else "")


async def generate_response(request: web.Request, state: RouterState, request_id: str,
                            generation: GenerationRequest, placement: Placement,
                            tenant: str = DEFAULT_CLIENT, node_id_tag: str = "") -> web.StreamResponse:
    """node_id_tag: what makes the ids on the nodes this request's own (RouterState.node_id_tags; "" for an id the
    router made)."""
    if generation.ignored_fields:
        names = field_names_header(generation.ignored_fields)
        logger.warning("request %s: ignored unknown field(s) %s", request_id, names)
        request[RESPONSE_HEADERS_KEY]["X-CoRun-Ignored-Fields"] = names
    # NOTE: one seed for every prompt of the request, so a prompt's output is the same alone or in a list.
    seed = generation.client_seed
    if seed is None:
        seed = seed_from_request_id(request_id, state.config.base_seed)
    request[RESPONSE_HEADERS_KEY]["X-CoRun-Seed"] = str(seed)
    n = generation.params.n
    # NOTE: OpenAI's order: choice index = prompt index * n + sample index
    ctx = ResponseContext(generation.kind, request_id, int(time.time()), state.config.served_model_name,
                          state.system_fingerprint(), seed, generation.params.logprobs, state.tokenizer,
                          generation.output, tuple(p for p in generation.prompts for _ in range(n)), n,
                          generation.tools, state.config.enable_prompt_tokens_details)
    outlet = fast_path_outlet(generation)
    deltas = merge([choice_deltas(state, generation, i * n, node_request_id(state.config, request_id + node_id_tag, i),
                                  list(prompt), seed, placement, outlet, tenant)
                    for i, prompt in enumerate(generation.prompts)])
    try:
        if generation.stream:
            return await stream_response(request, ctx, generation, deltas, request[RESPONSE_HEADERS_KEY], outlet)
        return await full_response(request, ctx, generation, deltas, outlet)
    except GenerationError as error:
        # NOTE: before any token (a node refuses a constraint at admission), so the answer is still a plain 400
        if error.constraint_reason is None or generation.constraint_field is None:
            raise
        raise refused_constraint(generation.constraint_field, generation.params.structured.kind,
                                 error.constraint_reason) from None
    finally:
        await deltas.aclose()


def fast_path_outlet(generation: GenerationRequest) -> DeltaOutlet | None:
    """Where a prompt's plain deltas may skip its coroutine (router/api/streaming.py; ChoiceTotals). NOTE: one
    prompt only: several are merged through a queue, whose deltas the fast path could overtake."""
    if len(generation.prompts) != 1 or generation.beam_search is not None:
        return None
    return DeltaOutlet()


def choice_deltas(state: RouterState, generation: GenerationRequest, index: int, request_id: str,
                  prompt: list[int], seed: int, placement: Placement,
                  outlet: DeltaOutlet | None = None, tenant: str = DEFAULT_CLIENT) -> AsyncIterator[ChoiceDelta]:
    """One prompt's n choices (index, index + 1, ...): its samples, or with beam search its best beams; tenant:
    its client (router/api/clients.py), whose prompts the prefill nodes take in turn with other clients'."""
    if generation.beam_search is not None:
        return beam_search_deltas(state.pool, state.tokenizer, index, request_id, prompt, generation.params,
                                  generation.beam_search, placement, generation.output, tenant)
    return prompt_deltas(state.pool, state.tokenizer, state.metrics, index, request_id, prompt,
                         bind_seed(generation, seed), generation.stop_strings, placement, generation.output, outlet,
                         tenant)


def node_request_id(config, request_id: str, prompt_index: int) -> str:
    """The id of a request's prompt on the nodes: the router's instance name (the id is unique only per router;
    '/' never occurs in an instance name), the request id (tagged where the client named it: NodeIdTags), the
    prompt's index."""
    prefix = f"{config.instance_name}/" if config.instance_name else ""
    return f"{prefix}{request_id}-{prompt_index}"


def read_placement(request: web.Request, state: RouterState) -> Placement:
    """Optional pinning of a request to named nodes (tests run one request through every (P, D) pair): only with
    RouterConfig.enable_node_pinning, and each pin checked against the pool here, before any node sees the
    request."""
    pins = {header: request.headers.get(header) for header in PIN_HEADERS}
    given = [header for header, pin in pins.items() if pin is not None]
    if not given:
        return Placement()
    if not state.config.enable_node_pinning:
        raise bad_request(f"{' and '.join(given)}: node pinning is off (start the router with "
                          "--enable-node-pinning)")
    for header, find_pinned in zip(PIN_HEADERS, (state.pool.pinned_prefill, state.pool.pinned_decode), strict=True):
        if pins[header] is not None:
            check_pin(header, pins[header], find_pinned)
    return Placement(*pins.values())


def check_pin(header: str, pin: str, find_pinned: Callable[[str], object]) -> None:
    """A 400 unless the pool has the pinned node (find_pinned: the pool's pinned_prefill or pinned_decode)."""
    if not pin:  # NOTE: to the pool an empty pin means "not pinned"
        raise bad_request(f"{header} is empty: name a node (its id or address)")
    try:
        find_pinned(pin)
    except UnknownNode as error:
        raise bad_request(f"{header}: {error}") from None


def field_names_header(names: tuple[str, ...]) -> str:
    """Field names for a response header: ASCII with JSON's escapes (a name is client text: it may hold a newline
    or a lone surrogate, which no header may carry), at most MAX_FIELD_NAMES_HEADER characters."""
    text = ", ".join(json.dumps(name)[1:-1] for name in names)
    return text if len(text) <= MAX_FIELD_NAMES_HEADER else text[:MAX_FIELD_NAMES_HEADER] + "..."


def read_request_id(request: web.Request) -> tuple[str, bool]:
    """The client's X-Request-Id (printable ASCII, at most 128 characters), else a fresh uuid4 hex; and whether the
    client named it (such ids may repeat: NodeIdTags)."""
    request_id = request.headers.get("X-Request-Id")
    if request_id is None:
        return uuid.uuid4().hex, False
    if not (0 < len(request_id) <= MAX_REQUEST_ID_LEN and request_id.isascii() and request_id.isprintable()):
        raise bad_request(f"X-Request-Id must be 1 to {MAX_REQUEST_ID_LEN} printable ASCII characters")
    return request_id, True


async def read_body(request: web.Request) -> bytes:
    """The raw body, once it has all arrived: 413 beyond RouterConfig.max_request_bytes, 408 when it takes longer
    than body_timeout_s (a trickled body; what still comes is dropped for app.LINGER_S, then the connection
    closes)."""
    config = request.app[STATE_KEY].config
    if request.content_length is not None and request.content_length > config.max_request_bytes:
        raise body_too_large(config.max_request_bytes)
    try:
        return await asyncio.wait_for(request.read(), config.body_timeout_s)
    except web.HTTPRequestEntityTooLarge:  # NOTE: a chunked body, which has no Content-Length to check first
        raise body_too_large(config.max_request_bytes) from None
    except asyncio.TimeoutError:
        raise RequestError(408, f"the request body did not arrive within {config.body_timeout_s:g} s") from None


def body_too_large(max_request_bytes: int) -> RequestError:
    return RequestError(413, f"the request body is larger than {max_request_bytes} bytes (the router's "
                             "--max-request-bytes)")


async def full_response(request: web.Request, ctx: ResponseContext, generation: GenerationRequest,
                        deltas: AsyncIterator[ChoiceDelta], outlet: DeltaOutlet | None = None) -> web.Response:
    totals = ChoiceTotals(len(generation.prompts) * generation.params.n)
    if outlet is not None:
        outlet.sink = totals
    async for delta in deltas:
        totals.take(delta)
    body = response_body(ctx, totals.choices, sum(len(prompt) for prompt in generation.prompts))
    return web.Response(body=body, content_type="application/json", headers=request[RESPONSE_HEADERS_KEY])


class ChoiceTotals:
    """A full response's choices, added up from their deltas: through the request's coroutine, or from the node's
    receive loop (a DeltaSink: the fast path of router/api/streaming.py, for a response that is not streamed)."""

    def __init__(self, num_choices: int):
        self.choices = [ChoiceTotal(index) for index in range(num_choices)]

    def accepts(self, index: int) -> bool:
        return True  # NOTE: nothing to wait for: the fast path only ever hands over deltas in order

    def take(self, delta: ChoiceDelta) -> None:
        self.choices[delta.index].add(delta)

    def take_text(self, index: int, text: str, token_ids: list[int], logprobs: list[TokenLogprobs] | None) -> None:
        self.choices[index].add(ChoiceDelta(index, text, tuple(token_ids), None if logprobs is None else tuple(
            logprobs), None))
