"""Every message between router, prefill nodes and decode nodes, defined once (msgpack on zmq), versioned.

Torch-free: the router imports this. A message is a frozen dataclass; on the wire it is the msgpack map
{"v": PROTOCOL_VERSION, "type": class name, **fields}. A peer speaking another version is refused.

Version history:
  1: first version (prefill/decode/handshake/claim/token events/ping; PrefillResult.finish_reason with kv=None
     when the first token ends the request).
  2: HandshakeRefused (was an ErrorReply with an empty request id, matched to the peer by its address); the
     NIXL "KV read done" notification defined here (kv_done_notification); Pong.model_facts (the router learns
     max_model_len, vocab size and max logprobs from the nodes instead of copies in its own flags).
  3: node_id names a node in every message (was engine_id).
  4: HandshakeReply.device_id and ucx_settings.
  5: PrefillResult.prompt_logprobs, TokenEvent.prompt_logprobs.
  6: Pong.counters.
  7: n samples per prompt: PrefillResult.first_tokens and DecodeRequest.first_tokens (one FirstToken per sample,
     replacing first_token_id / first_logprobs / finish_reason), TokenEvent.index and Abort.index; the sampling
     controls in SamplingParams (n, penalties, min_p, min_tokens, logit_bias); PrefillResult.queue_seconds.

Besides the messages, one NIXL notification: a decode node's READ of a prefill node's KV ends with
kv_done_notification(request_id), on which the prefill node frees its copy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import msgpack

from corun.outputs import TokenLogprobs
from corun.sampling_params import SamplingParams

PROTOCOL_VERSION = 7
KV_DONE_PREFIX = b"done:"


class ProtocolError(ValueError):
    """A message that is not ours: bad encoding, unknown type or another protocol version."""


@dataclass(frozen=True)
class KVHandle:
    """Where a prefilled request's KV lives: enough for a decode node to claim and pull it."""

    node_id: str
    """The prefill node's id, also its NIXL agent name."""
    address: str
    """The prefill node's zmq control address (handshake and claims)."""
    block_ids: tuple[int, ...]
    num_tokens: int
    compat_hash: str


@dataclass(frozen=True)
class FirstToken:
    """Token 1 of one sample of a prompt, sampled by the prefill node with seed sample_seed(seed, index)."""

    index: int
    """The sample: 0 .. params.n - 1."""
    token_id: int
    logprobs: TokenLogprobs | None
    finish_reason: str | None = None
    """Set when this token already ends the sample (a stop token, or max_tokens == 1)."""


# --- router -> prefill -> router -----------------------------------------------------------------------------
@dataclass(frozen=True)
class PrefillRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    """The request's seed; sample i samples with corun.seeding.sample_seed(seed, i)."""


@dataclass(frozen=True)
class PrefillResult:
    request_id: str
    first_tokens: list[FirstToken]
    """One per sample, in index order."""
    kv: KVHandle | None
    """None when every sample already finished with its first token (then no decode is needed)."""
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    """params.prompt_logprobs set: one per prompt token (the first None), from this node's isolated prefill."""
    queue_seconds: float = 0.0
    """How long the request waited in this node's queue before its first chunk ran (vLLM's queue time)."""


# --- router -> decode -> router ------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeRequest:
    """The prompt's KV is read once; every sample listed decodes from its own copy of it."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    first_tokens: list[FirstToken]
    """The samples to decode (those their first token did not finish), with their first tokens."""
    kv: KVHandle


@dataclass(frozen=True)
class TokenEvent:
    """New tokens of one request from one decode step (the first event also carries the prefill's token)."""

    request_id: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None
    finish_reason: str | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    """Set by the router on a sample's first event, from the PrefillResult (decode nodes never set it)."""
    index: int = 0
    """The sample (of params.n) these tokens belong to."""


@dataclass(frozen=True)
class ErrorReply:
    request_id: str
    status: int
    """HTTP-like: 400 bad request, 503 no capacity or peer unusable, 500 internal."""
    message: str


@dataclass(frozen=True)
class Abort:
    request_id: str
    index: int | None = None
    """One sample (a stop string ended it); None: every sample of the request."""


@dataclass(frozen=True)
class Ping:
    nonce: int


@dataclass(frozen=True)
class ModelFacts:
    """What the router validates requests against, learnt from the nodes (every node of a pool must agree)."""

    max_model_len: int
    vocab_size: int
    """The model's embedding rows: token ids must be below it."""
    max_logprobs: int


@dataclass(frozen=True)
class Pong:
    nonce: int
    node_id: str
    role: str
    fingerprint: str
    """Hash of everything on this node that determines outputs (model digest, engine config, versions)."""
    model_facts: ModelFacts
    stats: dict[str, Any] = field(default_factory=dict)
    counters: tuple[str, ...] = ()
    """Which stats only ever grow (exported as Prometheus counters; the others are gauges)."""


# --- decode -> prefill ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HandshakeRequest:
    node_id: str
    compat: dict[str, Any]


@dataclass(frozen=True)
class HandshakeReply:
    node_id: str
    compat: dict[str, Any]
    compat_hash: str
    agent_metadata: bytes
    kv_base_address: int
    num_blocks: int
    block_nbytes: int
    memory_type: str
    """NIXL memory segment: "DRAM" or "VRAM"."""
    device_id: int
    """The KV tensor's CUDA device in the prefill process (0 for DRAM)."""
    ucx_settings: dict[str, str]
    """The UCX settings the prefill node's agent was made with (TransferConfig.ucx_environment()), for the log."""


@dataclass(frozen=True)
class HandshakeRefused:
    """prefill -> decode: the handshake is refused (the KV compatibility facts disagree)."""

    node_id: str
    """The refusing prefill node."""
    reason: str


@dataclass(frozen=True)
class ClaimKV:
    """Decode asks to pull a request's KV; the prefill node pins the lease so it cannot expire mid-transfer."""

    request_id: str


@dataclass(frozen=True)
class ClaimReply:
    request_id: str
    ok: bool
    block_ids: tuple[int, ...] = ()
    reason: str = ""


MESSAGE_TYPES = {cls.__name__: cls for cls in (
    PrefillRequest, PrefillResult, DecodeRequest, TokenEvent, ErrorReply, Abort, Ping, Pong,
    HandshakeRequest, HandshakeReply, HandshakeRefused, ClaimKV, ClaimReply)}


def encode(message) -> bytes:
    body = {f.name: _to_wire(getattr(message, f.name)) for f in dataclasses.fields(message)}
    return msgpack.packb({"v": PROTOCOL_VERSION, "type": type(message).__name__, **body}, use_bin_type=True)


def decode(data: bytes):
    try:
        body = msgpack.unpackb(data, raw=False)
        version, type_name = body.pop("v"), body.pop("type")
    except Exception as error:
        raise ProtocolError(f"undecodable message: {error}") from error
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version} received, this node speaks {PROTOCOL_VERSION}")
    if type_name not in MESSAGE_TYPES:
        raise ProtocolError(f"unknown message type {type_name!r}")
    try:
        message_type = MESSAGE_TYPES[type_name]
        return message_type(**{name: _from_wire(message_type, name, value) for name, value in body.items()})
    except TypeError as error:
        raise ProtocolError(f"malformed {type_name}: {error}") from error


def _to_wire(value):
    if isinstance(value, TokenLogprobs):
        return [value.token_id, value.logprob, [list(t) for t in value.top]]
    if dataclasses.is_dataclass(value):
        return {f.name: _to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_to_wire(v) for v in value]
    return value


def _token_logprobs(wire) -> TokenLogprobs | None:
    if wire is None:
        return None
    token_id, logprob, top = wire
    return TokenLogprobs(token_id, logprob, tuple((int(t), float(lp)) for t, lp in top))


def _kv_handle(wire) -> KVHandle:
    return KVHandle(**{**wire, "block_ids": tuple(wire["block_ids"])})


def _params(wire) -> SamplingParams:
    return SamplingParams(**wire)


def _first_tokens(items) -> list[FirstToken]:
    return [FirstToken(item["index"], item["token_id"], _token_logprobs(item["logprobs"]), item["finish_reason"])
            for item in items]


_FIELD_DECODERS: dict[type, dict[str, Any]] = {
    PrefillRequest: {"params": _params},
    PrefillResult: {"first_tokens": _first_tokens, "kv": _kv_handle,
                    "prompt_logprobs": lambda items: [_token_logprobs(i) for i in items]},
    DecodeRequest: {"params": _params, "first_tokens": _first_tokens, "kv": _kv_handle},
    TokenEvent: {"logprobs": lambda items: [_token_logprobs(i) for i in items],
                 "prompt_logprobs": lambda items: [_token_logprobs(i) for i in items]},
    ClaimReply: {"block_ids": tuple},
    Pong: {"model_facts": lambda wire: ModelFacts(**wire), "counters": tuple},
}
"""Per message type, the fields whose wire form (msgpack maps and lists) is not their Python form."""


def _from_wire(message_type: type, name: str, value):
    decoder = _FIELD_DECODERS.get(message_type, {}).get(name)
    return value if decoder is None or value is None else decoder(value)


def kv_done_notification(request_id: str) -> bytes:
    """The NIXL notification a decode node's READ ends with: the prefill node may free its copy."""
    return KV_DONE_PREFIX + request_id.encode()


def kv_done_request_id(notification: bytes) -> str | None:
    """The request a KV-done notification names; None for any other notification."""
    if not notification.startswith(KV_DONE_PREFIX):
        return None
    return notification[len(KV_DONE_PREFIX):].decode(errors="replace")
