"""Every message between router, prefill, decode and colocated nodes, defined once (msgpack on zmq), versioned.

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
  8: instance ids (Pong, HandshakeReply, KVHandle: a node restarted on its address is told apart from the one that
     died); ReleaseKV (a decode node gives up a claimed lease it will not read); HandshakeReply.lease_seconds; every
     field type-checked on arrival.
  9: HandshakeReply.kv_base_addresses, one per KV segment (was kv_base_address: one tensor; a vLLM engine keeps
     one per layer).
  10: StepTokens: a decode node sends every TokenEvent of one decode step for one router in one message (it sent
     one message per request per step), encoded and decoded in C (msgspec) on that path.
  11: GenerateRequest: a whole request to a colocated node (prefill and decode in one process), answered with
     StepTokens like a decode node's, each sample's first event carrying the prompt's logprobs; the node role
     "colocated" in Pong.
  12: HandshakeReply.transport and transport_payload: the KV transport's name and its own handshake fields, in its
     own encoding (they were NIXL's, as fields of the message: agent_metadata, kv_base_addresses, num_blocks,
     block_nbytes, memory_type, device_id, ucx_settings).
  13: Pong.capacity (NodeCapacity: the node's decode rows and KV blocks, facts that may differ between the nodes
     of a pool, kept apart from ModelFacts and the fingerprint, which must agree): the router refuses an n no node
     can place before any prefill.

Besides the messages, one notification that the KV transport carries: a decode node's READ of a prefill node's KV
ends with kv_done_notification(request_id), on which the prefill node frees its copy.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import msgpack
import msgspec

from wire.outputs import TokenLogprobs
from wire.sampling_params import SamplingParams
from wire.seeding import SEED_BOUND

PROTOCOL_VERSION = 13
KV_DONE_PREFIX = b"done:"


class ProtocolError(ValueError):
    """A message that is not ours: bad encoding, unknown type or another protocol version."""


def check_seed(seed) -> None:
    """Seeds become int64 noise keys: outside [0, 2**63) one would fail the sampler, not the message."""
    if not isinstance(seed, int) or not 0 <= seed < SEED_BOUND:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {str(seed)[:30]}")


ZMQ_ADDRESS = re.compile(r"tcp://[A-Za-z0-9.\-]{1,253}:[0-9]{1,5}")
"""How nodes reach each other: tcp://host:port (a host name or IPv4 address)."""
MAX_ID_CHARS = 256


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
    instance_id: str = ""
    """The prefill process that holds it: a node restarted on the same address is another instance, and
    whatever a decode node knew of the old one (its NIXL metadata) must not be used for it."""

    def __post_init__(self):
        if not ZMQ_ADDRESS.fullmatch(str(self.address)):
            raise ValueError(f"KV handle address {str(self.address)[:80]!r} is not tcp://host:port")
        if self.num_tokens < 1 or not self.block_ids or any(b < 0 for b in self.block_ids):
            raise ValueError("KV handle needs num_tokens >= 1 and block ids >= 0")


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
    """The request's seed; sample i samples with wire.seeding.sample_seed(seed, i)."""

    def __post_init__(self):
        check_seed(self.seed)


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

    def __post_init__(self):
        check_seed(self.seed)


# --- router -> colocated -> router ---------------------------------------------------------------------------
@dataclass(frozen=True)
class GenerateRequest:
    """A whole request to a colocated node: it prefills the prompt and decodes every sample itself."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    """The request's seed; sample i samples with wire.seeding.sample_seed(seed, i)."""

    def __post_init__(self):
        check_seed(self.seed)


@dataclass(frozen=True)
class TokenEvent:
    """New tokens of one request from one decode step (the first event also carries the prefill's token)."""

    request_id: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None
    finish_reason: str | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    """A sample's first event: set by the router from the PrefillResult (decode nodes never set it), or by the
    colocated node that prefilled the prompt."""
    index: int = 0
    """The sample (of params.n) these tokens belong to."""


@dataclass(frozen=True)
class StepTokens:
    """decode -> router: the TokenEvents of one decode step for the requests one router sent, in one message, so
    the router decodes, and its receive loop wakes, once per step rather than once per request."""

    events: list[TokenEvent]


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
class NodeCapacity:
    """What one node can hold at once: facts of that node alone (nodes of a pool may differ), which the router
    places requests by; never part of what the pool must agree on."""

    max_num_seqs: int
    """Decode rows: the most samples of one request it can run together."""
    num_kv_blocks: int
    """Usable KV blocks: the most one request's samples may reserve together."""
    block_size: int
    """Tokens per KV block."""


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
    instance_id: str = ""
    """This node process (random at start): a change means the node restarted and forgot what it held."""
    capacity: NodeCapacity | None = None
    """What this node can hold (None: not told, e.g. an older fake): the router places n samples by it."""


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
    transport: str
    """The KV transport the prefill node's blocks are read by (wire.config.TransferConfig.transport): a decode node
    on another one refuses the peer."""
    transport_payload: bytes
    """That transport's own handshake fields, in its own encoding: what its sender's handshake_payload() gives and its
    receiver's add_peer() reads and checks (NIXL's: agent metadata, KV segment addresses, block layout, memory
    type, device, UCX settings; transfer/endpoints.py)."""
    instance_id: str = ""
    """The prefill process: KV handles naming another instance are not its (it restarted)."""
    lease_seconds: float = 60.0
    """How long the prefill node keeps a lease, claimed or not: a READ must end well within it."""


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
class ReleaseKV:
    """decode -> prefill: this node will not read (or finish reading) the lease: free it now."""

    request_id: str
    reason: str = ""


@dataclass(frozen=True)
class ClaimReply:
    request_id: str
    ok: bool
    block_ids: tuple[int, ...] = ()
    reason: str = ""


MESSAGE_TYPES = {cls.__name__: cls for cls in (
    PrefillRequest, PrefillResult, DecodeRequest, GenerateRequest, TokenEvent, StepTokens, ErrorReply, Abort, Ping,
    Pong, HandshakeRequest, HandshakeReply, HandshakeRefused, ClaimKV, ClaimReply, ReleaseKV)}


def encode(message) -> bytes:
    if type(message) is StepTokens:
        return _STEP_TOKENS_ENCODER.encode(_step_tokens_wire(message))
    body = {f.name: _to_wire(getattr(message, f.name)) for f in dataclasses.fields(message)}
    return msgpack.packb({"v": PROTOCOL_VERSION, "type": type(message).__name__, **body}, use_bin_type=True)


def decode(data: bytes):
    if data.startswith(STEP_TOKENS_HEAD):
        return _decode_step_tokens(data)
    try:
        body = msgpack.unpackb(data, raw=False)
        version, type_name = body.pop("v"), body.pop("type")
    except Exception as error:
        raise ProtocolError(f"undecodable message: {error}") from error
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {str(version)[:20]} received, this node speaks {PROTOCOL_VERSION}")
    if not isinstance(type_name, str) or type_name not in MESSAGE_TYPES:
        raise ProtocolError(f"unknown message type {str(type_name)[:40]!r}")
    try:
        message_type = MESSAGE_TYPES[type_name]
        message = _from_body(message_type, body)
    except Exception as error:  # NOTE: any field may be anything: a bad one is a refused message, never a crash
        raise ProtocolError(f"malformed {type_name}: {type(error).__name__}: {error}") from error
    check_fields(message, type_name)
    return message


def request_id_of(data: bytes) -> str:
    """The request id a (possibly malformed) message names, if any: what an error reply to it can name."""
    try:
        request_id = msgpack.unpackb(data, raw=False).get("request_id", "")
    except Exception:
        return ""
    return request_id if isinstance(request_id, str) and len(request_id) <= MAX_ID_CHARS else ""


INT_MIN, INT_END = -(2**63), 2**64
"""What msgpack carries as an integer (int64 and uint64)."""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_fields(value, path: str) -> None:
    """Every field of a decoded dataclass (nested ones too) has its annotated type; else ProtocolError."""
    for name, hint in _hints(type(value)).items():
        _check_type(getattr(value, name), hint, f"{path}.{name}")


def _check_type(value, hint, path: str) -> None:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in args:
            try:
                return _check_type(value, option, path)
            except ProtocolError as error:
                errors.append(str(error))
        raise ProtocolError(errors[0])
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ProtocolError(f"{path} must be a list, got {type(value).__name__}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ProtocolError(f"{path} must have {len(args)} items")
            for i, (item, item_hint) in enumerate(zip(value, args, strict=True)):
                _check_type(item, item_hint, f"{path}[{i}]")
            return
        if args[0] is int and all(type(item) is int and INT_MIN <= item < INT_END for item in value):
            return  # NOTE: token ids: thousands per request, checked in one pass; the loop below names a bad one
        for i, item in enumerate(value):
            _check_type(item, args[0], f"{path}[{i}]")
        return
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ProtocolError(f"{path} must be a map with string keys")
        return
    _check_plain(value, hint, path)


def _check_plain(value, hint, path: str) -> None:
    if hint is type(None):
        ok = value is None
    elif hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and INT_MIN <= value < INT_END
    elif hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)
    elif hint is str:
        ok = isinstance(value, str) and (len(value) <= MAX_ID_CHARS or not path.endswith(("_id", ".address")))
    elif dataclasses.is_dataclass(hint):
        ok = isinstance(value, hint)
        if ok:
            check_fields(value, path)
    else:
        ok = isinstance(value, hint)
    if not ok:
        raise ProtocolError(f"{path} must be {getattr(hint, '__name__', hint)}, got {str(value)[:40]!r}")


def _to_wire(value):
    if isinstance(value, TokenLogprobs):
        return [value.token_id, value.logprob, [list(t) for t in value.top]]
    if dataclasses.is_dataclass(value):
        return {f.name: _to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        if all(type(v) is int for v in value):  # NOTE: token ids and block ids: thousands per message, as they are
            return list(value)
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
    GenerateRequest: {"params": _params},
    TokenEvent: {"logprobs": lambda items: [_token_logprobs(i) for i in items],
                 "prompt_logprobs": lambda items: [_token_logprobs(i) for i in items]},
    StepTokens: {"events": lambda items: [_from_body(TokenEvent, item) for item in items]},
    ClaimReply: {"block_ids": tuple},
    Pong: {"model_facts": lambda wire: ModelFacts(**wire), "counters": tuple,
           "capacity": lambda wire: NodeCapacity(**wire)},
}
"""Per message type, the fields whose wire form (msgpack maps and lists) is not their Python form."""


def _from_wire(message_type: type, name: str, value):
    decoder = _FIELD_DECODERS.get(message_type, {}).get(name)
    return value if decoder is None or value is None else decoder(value)


def _from_body(message_type: type, body):
    if not isinstance(body, dict):
        raise TypeError(f"{message_type.__name__} must be a map")
    return message_type(**{name: _from_wire(message_type, name, value) for name, value in body.items()})


# --- StepTokens in C: the one message sent every decode step (hundreds of events each) -------------------------
# NOTE: the same wire form as encode()'s generic one (a map {"v", "type", "events": [TokenEvent maps]}, keys in
# that order), so either side may use either path; msgspec checks every field's type as it decodes, as
# check_fields does for the other messages (tests/corun/test_protocol.py holds the two paths to one answer).
_WireLogprobs = tuple[int, float, list[tuple[int, float]]]


class _TokenEventWire(msgspec.Struct, forbid_unknown_fields=True):
    request_id: typing.Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)]
    token_ids: list[int]
    logprobs: list[_WireLogprobs] | None
    finish_reason: str | None = None
    prompt_logprobs: list[_WireLogprobs | None] | None = None
    index: int = 0


class _StepTokensWire(msgspec.Struct, forbid_unknown_fields=True):
    v: int
    type: str
    events: list[_TokenEventWire]


_STEP_TOKENS_ENCODER = msgspec.msgpack.Encoder()
_STEP_TOKENS_DECODER = msgspec.msgpack.Decoder(_StepTokensWire)
STEP_TOKENS_HEAD = msgpack.packb({"v": PROTOCOL_VERSION, "type": "StepTokens", "events": []})[:-1]
"""The bytes a StepTokens message of this version starts with (the map header, v, type and the events key)."""


def _step_tokens_wire(message: StepTokens) -> _StepTokensWire:
    def wire(logprobs):
        return None if logprobs is None else [_to_wire(lp) for lp in logprobs]

    return _StepTokensWire(PROTOCOL_VERSION, "StepTokens", [
        _TokenEventWire(e.request_id, e.token_ids, wire(e.logprobs), e.finish_reason, wire(e.prompt_logprobs), e.index)
        for e in message.events])


def _logprobs_list(items) -> list[TokenLogprobs | None] | None:
    return None if items is None else [_token_logprobs(item) for item in items]


def _decode_step_tokens(data: bytes) -> StepTokens:
    try:
        wire = _STEP_TOKENS_DECODER.decode(data)
    except msgspec.MsgspecError as error:
        raise ProtocolError(f"malformed StepTokens: {error}") from error
    events = []
    for e in wire.events:
        event = TokenEvent(e.request_id, e.token_ids, _logprobs_list(e.logprobs), e.finish_reason,
                           _logprobs_list(e.prompt_logprobs), e.index)
        if e.logprobs is not None or e.prompt_logprobs is not None:  # NOTE: rare; msgspec lets NaN floats through
            check_fields(event, "StepTokens.events")
        events.append(event)
    return StepTokens(events)


def kv_done_notification(request_id: str) -> bytes:
    """The notification a decode node's READ ends with (its KV transport delivers it): the prefill node may free
    its copy."""
    return KV_DONE_PREFIX + request_id.encode()


def kv_done_request_id(notification: bytes) -> str | None:
    """The request a KV-done notification names; None for any other notification."""
    if not notification.startswith(KV_DONE_PREFIX):
        return None
    return notification[len(KV_DONE_PREFIX):].decode(errors="replace")
