"""Every message between router, prefill, decode and colocated nodes, defined once (msgpack on zmq), versioned.

Torch-free: the router imports this. A message is a frozen msgspec Struct, one of the tagged union MESSAGE_TYPES;
on the wire it is the msgpack map {"type": class name, **fields, "v": PROTOCOL_VERSION}. msgspec checks every field
(nested parts, ids, ranges) as it decodes, and unknown fields are refused; __post_init__ holds the rules between
fields. NOTE: SamplingParams and TokenLogprobs stay dataclasses (their users' types): msgspec checks their fields
and runs their __post_init__, but skips a key they do not have (it has no forbid_unknown_fields for dataclasses).
A message of another version is refused as such, whatever else is wrong with it; anything malformed is a
ProtocolError, never another exception.

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
  14: msgspec Structs, decoded and checked in C (the hand-written checker is gone); "v" is the map's last entry;
     the request's seed travels once, as params.seed (PrefillRequest, DecodeRequest and GenerateRequest had a seed
     field beside it, always equal); KVReadDone, the KV-done notification the transport carries (was the bytes
     b"done:" + request id); TokenEvent is a part of StepTokens only (a decode node's first event of a
     sample, sent alone, is a StepTokens of one); TokenLogprobs is a map {token_id, logprob, top} (was the list
     [token_id, logprob, top]).
  15: SamplingParams.allowed_token_ids and bad_words_token_ids; seeds are any int64 (were [0, 2**63)).
  16: SamplingParams.structured (wire.structured.StructuredOutput: a JSON schema, json_object, regex, choice or
     EBNF grammar the output must follow).
  17: the prefix cache (issue 25): PrefillResult.num_cached_tokens and TokenEvent.num_cached_tokens (prompt tokens
     whose KV came from the node's prefix cache); ResetPrefixCache, answered with PrefixCacheReset;
     NodeCapacity.prefix_chunk_tokens.
  18: PrefillRequest.tenant (the router's client of the request): a prefill node takes the waiting prompts of its
     tenants in turn instead of first come, first served (issue 23: fairness across clients).
  19: ClaimKV.node_id and instance_id (the claiming decode process); InstanceGone, router -> prefill nodes: a decode
     node's process is gone (another instance answered on its address), so the leases it claimed end at once
     instead of at their deadline (issue 23: a killed decode node held prefill KV for kv_lease_seconds).
  20: GenerateRequest.tenant: a colocated node takes its tenants' waiting prompts in turn, as prefill nodes do.
  21: ErrorReply.constraint_reason: a node's refusal of a structured-output constraint carries the grammar library's
     reason as a field (the router read it back out of the message's text).
  22: DecodeRequest.tenant: a node compiles its clients' structured-output constraints in turn (corun/fair_workers.py;
     prefill and colocated nodes had the tenant already).

Not every message travels on zmq: KVReadDone is the notification a decode node's READ of a prefill node's KV ends
with, carried by the KV transport (kv_done_notification), on which the prefill node frees its copy.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Union

import msgspec

from wire.outputs import TokenLogprobs
from wire.sampling_params import SEED_MAX, SEED_MIN, SamplingParams

PROTOCOL_VERSION = 22


class ProtocolError(ValueError):
    """A message that is not ours: bad encoding, unknown type or another protocol version."""


def check_seed(seed) -> None:
    """Seeds become int64 noise keys: outside int64 one would fail the sampler, not the message."""
    if not isinstance(seed, int) or not SEED_MIN <= seed <= SEED_MAX:
        raise ValueError(f"seed must be an int64, got {str(seed)[:30]}")


ZMQ_ADDRESS = re.compile(r"tcp://[A-Za-z0-9.\-]{1,253}:[0-9]{1,5}")
"""How nodes reach each other: tcp://host:port (a host name or IPv4 address)."""
MAX_ID_CHARS = 256
Id = Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)]
"""A request, node or instance id."""
InstanceId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]
"""A node process' instance id where one must be named (an empty one would match every process that has none)."""
Seconds = Annotated[float, msgspec.Meta(ge=0.0)]
Count = Annotated[int, msgspec.Meta(ge=0)]
# NOTE: msgpack carries integers of int64 and uint64 only, and msgspec refuses a bool for an int; NaN fails every
# bound (wire.outputs.Logprob), so a float with a Meta bound is never NaN.


class Part(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A nested part of messages (no tag or version of its own)."""


class Message(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="type", tag=True):
    """One of MESSAGE_TYPES: tagged with its class name, carrying the protocol version."""

    v: int = PROTOCOL_VERSION
    """The sender's protocol version (keyword-only, so every message keeps its fields' positional order)."""


class KVHandle(Part):
    """Where a prefilled request's KV lives: enough for a decode node to claim and pull it."""

    node_id: Id
    """The prefill node's id, also its NIXL agent name."""
    address: str
    """The prefill node's zmq control address (handshake and claims)."""
    block_ids: tuple[int, ...]
    num_tokens: int
    compat_hash: str
    instance_id: Id = ""
    """The prefill process that holds it: a node restarted on the same address is another instance, and
    whatever a decode node knew of the old one (its NIXL metadata) must not be used for it."""

    def __post_init__(self):
        if not ZMQ_ADDRESS.fullmatch(self.address):
            raise ValueError(f"KV handle address {self.address[:80]!r} is not tcp://host:port")
        if self.num_tokens < 1 or not self.block_ids or any(b < 0 for b in self.block_ids):
            raise ValueError("KV handle needs num_tokens >= 1 and block ids >= 0")


class FirstToken(Part):
    """Token 1 of one sample of a prompt, sampled by the prefill node with seed sample_seed(seed, index)."""

    index: int
    """The sample: 0 .. params.n - 1."""
    token_id: int
    logprobs: TokenLogprobs | None
    finish_reason: str | None = None
    """Set when this token already ends the sample (a stop token, or max_tokens == 1)."""


class SeededRequest(Message):
    """A prompt and its sampling parameters, whose seed the router has fixed (the request's seed travels once, as
    params.seed): sample i samples with wire.seeding.sample_seed(params.seed, i)."""

    request_id: Id
    prompt_token_ids: list[int]
    params: SamplingParams

    def __post_init__(self):
        check_seed(self.params.seed)

    @property
    def seed(self) -> int:
        return self.params.seed


# --- router -> prefill -> router -----------------------------------------------------------------------------
class PrefillRequest(SeededRequest):
    tenant: Id = ""
    """The client the prompt is for (router/api/clients.py: a hash of its API key, never the key): the node takes
    its waiting prompts tenant by tenant (prefill_node/server.py), so that one client's burst does not queue
    another's prompt behind all of it. Changes only when a prompt is prefilled, never its outputs."""


class PrefillResult(Message):
    request_id: Id
    first_tokens: list[FirstToken]
    """One per sample, in index order."""
    kv: KVHandle | None
    """None when every sample already finished with its first token (then no decode is needed)."""
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    """params.prompt_logprobs set: one per prompt token (the first None), from this node's isolated prefill."""
    queue_seconds: Seconds = 0.0
    """How long the request waited in this node's queue before its first chunk ran (vLLM's queue time)."""
    num_cached_tokens: Count = 0
    """Prompt tokens whose KV came from this node's prefix cache (usage.prompt_tokens_details.cached_tokens)."""


# --- router -> decode -> router ------------------------------------------------------------------------------
class DecodeRequest(SeededRequest):
    """The prompt's KV is read once; every sample listed decodes from its own copy of it."""

    first_tokens: list[FirstToken]
    """The samples to decode (those their first token did not finish), with their first tokens."""
    kv: KVHandle
    tenant: Id = ""
    """The client the request is for, as PrefillRequest.tenant: the node compiles its clients' constraints in turn.
    Changes only when a constraint compiles, never the outputs."""


# --- router -> colocated -> router ---------------------------------------------------------------------------
class GenerateRequest(SeededRequest):
    """A whole request to a colocated node: it prefills the prompt and decodes every sample itself."""

    tenant: Id = ""
    """The client the prompt is for, as PrefillRequest.tenant: the node takes its waiting prompts tenant by tenant."""


class TokenEvent(Part):
    """New tokens of one request from one decode step (the first event also carries the prefill's token)."""

    request_id: Id
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None
    finish_reason: str | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    """A sample's first event: set by the router from the PrefillResult (decode nodes never set it), or by the
    colocated node that prefilled the prompt."""
    index: int = 0
    """The sample (of params.n) these tokens belong to."""
    num_cached_tokens: Count | None = None
    """A sample's first event, from the node that prefilled the prompt (as prompt_logprobs): prompt tokens whose
    KV came from its prefix cache."""


class StepTokens(Message):
    """decode -> router: the TokenEvents of one decode step for the requests one router sent, in one message, so
    the router decodes, and its receive loop wakes, once per step rather than once per request."""

    events: list[TokenEvent]


class ErrorReply(Message):
    request_id: Id
    status: int
    """HTTP-like: 400 bad request, 503 no capacity or peer unusable, 500 internal."""
    message: str
    constraint_reason: str | None = None
    """A refusal of the request's structured-output constraint (it does not compile): the grammar library's reason,
    which the router answers with, naming the field the constraint came from."""


class Abort(Message):
    request_id: Id
    index: int | None = None
    """One sample (a stop string ended it); None: every sample of the request."""


class Ping(Message):
    nonce: int


class ResetPrefixCache(Message):
    """router -> prefill and colocated nodes: forget every cached prompt chunk (vLLM's /reset_prefix_cache)."""

    nonce: int


class PrefixCacheReset(Message):
    nonce: int
    node_id: Id
    num_blocks_freed: Count
    """KV blocks freed at once (those of chunks a request still holds are freed when it ends)."""


class ModelFacts(Part):
    """What the router validates requests against, learnt from the nodes (every node of a pool must agree)."""

    max_model_len: int
    vocab_size: int
    """The model's embedding rows: token ids must be below it."""
    max_logprobs: int


class NodeCapacity(Part):
    """What one node can hold at once: facts of that node alone (nodes of a pool may differ), which the router
    places requests by; never part of what the pool must agree on."""

    max_num_seqs: int
    """Decode rows: the most samples of one request it can run together."""
    num_kv_blocks: int
    """Usable KV blocks: the most one request's samples may reserve together."""
    block_size: int
    """Tokens per KV block."""
    prefix_chunk_tokens: int = 0
    """The prefix cache's chunk (prefill_chunk_size) on a prefill or colocated node with one; 0: none. The router's
    prefix-aware routing hashes prompts by it."""


class Pong(Message):
    nonce: int
    node_id: Id
    role: str
    fingerprint: str
    """Hash of everything on this node that determines outputs (model digest, engine config, versions)."""
    model_facts: ModelFacts
    stats: dict[str, Any] = msgspec.field(default_factory=dict)
    counters: tuple[str, ...] = ()
    """Which stats only ever grow (exported as Prometheus counters; the others are gauges)."""
    instance_id: Id = ""
    """This node process (random at start): a change means the node restarted and forgot what it held."""
    capacity: NodeCapacity | None = None
    """What this node can hold (None: not told, e.g. an older fake): the router places n samples by it."""


# --- decode -> prefill ---------------------------------------------------------------------------------------
class HandshakeRequest(Message):
    node_id: Id
    compat: dict[str, Any]


class HandshakeReply(Message):
    node_id: Id
    compat: dict[str, Any]
    compat_hash: str
    transport: str
    """The KV transport the prefill node's blocks are read by (wire.config.TransferConfig.transport): a decode node
    on another one refuses the peer."""
    transport_payload: bytes
    """That transport's own handshake fields, in its own encoding: what its sender's handshake_payload() gives and its
    receiver's add_peer() reads and checks (NIXL's: agent metadata, KV segment addresses, block layout, memory
    type, device, UCX settings; transfer/endpoints.py)."""
    instance_id: Id = ""
    """The prefill process: KV handles naming another instance are not its (it restarted)."""
    lease_seconds: Annotated[float, msgspec.Meta(gt=0.0)] = 60.0
    """How long the prefill node keeps a lease, claimed or not: a READ must end well within it."""


class HandshakeRefused(Message):
    """prefill -> decode: the handshake is refused (the KV compatibility facts disagree)."""

    node_id: Id
    """The refusing prefill node."""
    reason: str


class ClaimKV(Message):
    """Decode asks to pull a request's KV; the prefill node pins the lease so it cannot expire mid-transfer."""

    request_id: Id
    node_id: Id
    """The claiming decode node."""
    instance_id: InstanceId
    """The claiming decode process: its leases end at once when it is known to be gone (InstanceGone)."""


class ReleaseKV(Message):
    """decode -> prefill: this node will not read (or finish reading) the lease: free it now."""

    request_id: Id
    reason: str = ""


class ClaimReply(Message):
    request_id: Id
    ok: bool
    block_ids: tuple[int, ...] = ()
    reason: str = ""


# --- router -> prefill ---------------------------------------------------------------------------------------
class InstanceGone(Message):
    """router -> prefill nodes: this process of a decode node has ended: the leases it claimed (ClaimKV's node_id and
    instance_id) will never be read, and end now instead of at their deadline.

    Sent only on proof, never on silence (a stopped process misses pings but may resume and read): another instance
    of the node answered on its address, which it binds only once this one closed its sockets, i.e. left its loop
    for good or died (router/nodes/client.py)."""

    node_id: Id
    instance_id: InstanceId


# --- decode -> prefill, by the KV transport ------------------------------------------------------------------
class KVReadDone(Message):
    """The notification a decode node's READ of a request's KV ends with, delivered by the KV transport (not zmq)
    once the bytes are read: the prefill node may free its copy."""

    request_id: Id


MESSAGE_TYPES: dict[str, type[Message]] = {cls.__name__: cls for cls in (
    PrefillRequest, PrefillResult, DecodeRequest, GenerateRequest, StepTokens, ErrorReply, Abort, Ping, Pong,
    HandshakeRequest, HandshakeReply, HandshakeRefused, ClaimKV, ClaimReply, ReleaseKV, KVReadDone, ResetPrefixCache,
    PrefixCacheReset, InstanceGone)}


class _Envelope(msgspec.Struct):
    """What any map claiming to be a message names (every other entry skipped): for the reason it is refused."""

    v: Any = None
    type: Any = None
    request_id: Any = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Union[tuple(MESSAGE_TYPES.values())])  # noqa: UP007 (a Union of a tuple)
_ENVELOPE_DECODER = msgspec.msgpack.Decoder(_Envelope)
_VERSION_ENTRY = _ENCODER.encode({"v": PROTOCOL_VERSION})[1:]
"""The last entry of every map encode() writes."""


def encode(message: Message) -> bytes:
    return _ENCODER.encode(message)


def decode(data: bytes) -> Message:
    """The message data holds, every field checked; ProtocolError for anything else."""
    try:
        message = _DECODER.decode(data)
    except Exception as error:  # NOTE: any byte may be anything: a refused message, never a crash
        raise _refusal(data, error) from error
    # NOTE: v has a default (messages are built without it), so a map that lacks it decodes too: encode() writes it
    # last, which the tail shows at no cost; a map in another key order is read again for it. (A crafted map whose
    # last string ends in those bytes passes without v: v tells versions apart, it guards nothing.)
    version = message.v if data.endswith(_VERSION_ENTRY) else _ENVELOPE_DECODER.decode(data).v
    if version != PROTOCOL_VERSION:
        raise _version_refusal(version)
    return message


def _refusal(data: bytes, error: Exception) -> ProtocolError:
    """Why data is not a message of ours, in this order: not a map, another version, an unknown type, a bad field."""
    try:
        envelope = _ENVELOPE_DECODER.decode(data)
    except Exception as envelope_error:
        return ProtocolError(f"undecodable message: {envelope_error}")
    if type(envelope.v) is not int or envelope.v != PROTOCOL_VERSION:
        return _version_refusal(envelope.v)
    type_name = envelope.type
    if not isinstance(type_name, str) or type_name not in MESSAGE_TYPES:
        return ProtocolError(f"unknown message type {str(type_name)[:40]!r}")
    # NOTE: msgspec names the field as `$.path`: `<type>.path` reads as the message's own
    return ProtocolError(f"malformed {type_name}: {str(error).replace('`$', f'`{type_name}')}")


def _version_refusal(version) -> ProtocolError:
    return ProtocolError(f"protocol version {str(version)[:20]} received, this node speaks {PROTOCOL_VERSION}")


def request_id_of(data: bytes) -> str:
    """The request id a (possibly malformed) message names, if any: what an error reply to it can name."""
    try:
        request_id = _ENVELOPE_DECODER.decode(data).request_id
    except Exception:
        return ""
    return request_id if isinstance(request_id, str) and len(request_id) <= MAX_ID_CHARS else ""


def kv_done_notification(request_id: str) -> bytes:
    """The notification a decode node's READ ends with (its KV transport delivers it): the prefill node may free
    its copy."""
    return encode(KVReadDone(request_id))


def kv_done_request_id(notification: bytes) -> str:
    """The request a KV-done notification names; ProtocolError for anything else (another version included)."""
    message = decode(notification)
    if type(message) is not KVReadDone:
        raise ProtocolError(f"{type(message).__name__} is not a KV-done notification")
    return message.request_id
