"""The wire protocol: every message type round-trips through msgpack with its Python field types; other
versions, unknown types and malformed bodies are refused (as ProtocolError, the version first); the KV-done
notification is a message of it too."""

import math

import msgpack
import pytest

from wire import protocol
from wire.outputs import TokenLogprobs
from wire.sampling_params import SamplingParams

LOGPROBS = TokenLogprobs(7, -0.5, ((7, -0.5), (3, -1.25)))
KV = protocol.KVHandle("prefill-0", "tcp://127.0.0.1:5000", (3, 4, 9), 40, "abc123")
PARAMS = SamplingParams(temperature=0.6, seed=1, max_tokens=8, logprobs=2)
CONTROLLED = SamplingParams(temperature=0.6, n=3, presence_penalty=0.5, frequency_penalty=-1.0,
                            repetition_penalty=1.2, min_p=0.1, min_tokens=2, logit_bias={5: -2.5, 3: 1.0}, seed=11)
FIRST = protocol.FirstToken(0, 7, LOGPROBS)
MESSAGES = [
    protocol.PrefillRequest("r1", [1, 2, 3], PARAMS),
    protocol.PrefillRequest("r4", [1, 2, 3], CONTROLLED),
    protocol.PrefillResult("r1", [FIRST], KV),
    protocol.PrefillResult("r2", [protocol.FirstToken(0, 7, None, "length")], None),
    protocol.PrefillResult("r3", [FIRST], KV, [None, LOGPROBS, LOGPROBS]),
    protocol.PrefillResult("r5", [FIRST], KV, num_cached_tokens=512),
    protocol.PrefillResult("r4", [FIRST, protocol.FirstToken(1, 2, LOGPROBS, "stop"), protocol.FirstToken(2, 9, None)],
                           KV),
    protocol.DecodeRequest("r1", [1, 2, 3], PARAMS, [FIRST], KV),
    protocol.DecodeRequest("r4", [1, 2, 3], CONTROLLED, [FIRST, protocol.FirstToken(2, 9, None)], KV),
    protocol.GenerateRequest("r1", [1, 2, 3], PARAMS),
    protocol.GenerateRequest("r4", [1, 2, 3], CONTROLLED),
    protocol.StepTokens([protocol.TokenEvent("r1", [5], [LOGPROBS], None),
                         protocol.TokenEvent("r1", [5, 6], None, "stop"),
                         protocol.TokenEvent("r4", [5, 6], None, None, index=2)]),
    protocol.StepTokens([protocol.TokenEvent("r1", [5], None),
                         protocol.TokenEvent("r2", [6], [LOGPROBS], "length", index=1),
                         protocol.TokenEvent("r3", [7], None, None, [None, LOGPROBS]),
                         protocol.TokenEvent("r5", [7], None, None, None, 0, 1024)]),
    protocol.StepTokens([]),
    protocol.ErrorReply("r1", 503, "gone"),
    protocol.ErrorReply("r1", 400, "request r1: invalid regex constraint: unbalanced", constraint_reason="unbalanced"),
    protocol.Abort("r1"),
    protocol.Abort("r4", 1),
    protocol.Ping(9),
    protocol.HandshakeRefused("prefill-0", "block_size 16 != 32"),
    protocol.ClaimKV("r1", "decode-0", "instance-1"),
    protocol.ClaimReply("r1", True, (3, 4, 9)),
    protocol.ReleaseKV("r1", "read failed"),
    protocol.HandshakeReply("prefill-0", {"block_size": 16}, "abc123", "nixl", b"\x85the transport's own fields",
                            "instance-1", 30.0),
    protocol.KVReadDone("r1"),
    protocol.ResetPrefixCache(3),
    protocol.PrefixCacheReset(3, "prefill-0", 96),
    protocol.InstanceGone("decode-0", "instance-1"),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_with_its_field_types(message):
    assert protocol.decode(protocol.encode(message)) == message


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_is_a_map_of_its_type_fields_and_version_read_in_any_key_order(message):
    body = msgpack.unpackb(protocol.encode(message), raw=False)
    assert body.pop("type") == type(message).__name__ and body.pop("v") == protocol.PROTOCOL_VERSION
    assert list(body) == [name for name in message.__struct_fields__ if name != "v"]
    reordered = {"v": protocol.PROTOCOL_VERSION, **dict(reversed(body.items())), "type": type(message).__name__}
    assert protocol.decode(msgpack.packb(reordered, use_bin_type=True)) == message


def test_the_seed_travels_once_as_params_seed():
    request = protocol.PrefillRequest("r1", [1, 2, 3], PARAMS)
    body = msgpack.unpackb(protocol.encode(request), raw=False)
    assert "seed" not in body and body["params"]["seed"] == PARAMS.seed == request.seed == 1
    for make in (protocol.PrefillRequest, protocol.GenerateRequest):
        with pytest.raises(ValueError, match="seed must be an int64"):
            make("r1", [1, 2, 3], SamplingParams())  # NOTE: the router fixes every request's seed
    with pytest.raises(ValueError, match="seed must be an int64"):
        protocol.DecodeRequest("r1", [1, 2, 3], SamplingParams(), [FIRST], KV)


def test_every_message_type_is_covered_above():
    covered = {type(m).__name__ for m in MESSAGES} | {"Pong", "HandshakeRequest"}
    assert covered == set(protocol.MESSAGE_TYPES)


VERSION = protocol.PROTOCOL_VERSION
OTHER_VERSION = rf"protocol version {VERSION - 1} received, this node speaks {VERSION}"


@pytest.mark.parametrize("body, error", [
    ({"v": protocol.PROTOCOL_VERSION - 1, "type": "Ping", "nonce": 1}, OTHER_VERSION),
    ({"v": protocol.PROTOCOL_VERSION, "type": "Nope"}, "unknown message type 'Nope'"),
    ({"v": protocol.PROTOCOL_VERSION, "type": "Ping", "nonce": 1, "extra": 2}, "malformed Ping"),
    ({"v": protocol.PROTOCOL_VERSION, "type": "Ping"}, "malformed Ping: Object missing required field `nonce`"),
    ({"v": protocol.PROTOCOL_VERSION, "type": "TokenEvent", "request_id": "r", "token_ids": [1], "logprobs": None},
     "unknown message type 'TokenEvent'"),  # NOTE: a part of StepTokens since version 14, not a message
])
def test_foreign_messages_are_refused_with_the_reason(body, error):
    with pytest.raises(protocol.ProtocolError, match=error):
        protocol.decode(msgpack.packb(body))
    with pytest.raises(protocol.ProtocolError, match="undecodable"):
        protocol.decode(b"\xc1")


@pytest.mark.parametrize("bad, position", [(True, 700), (1.5, 0), ("7", 1023), ([3], 512)])
def test_a_long_token_id_list_with_one_bad_item_is_refused_naming_it(bad, position):
    """Token-id lists are checked as they are decoded (thousands per request); a bad item still names itself."""
    body = msgpack.unpackb(protocol.encode(protocol.GenerateRequest("r1", list(range(1024)), PARAMS)))
    body["prompt_token_ids"][position] = bad
    with pytest.raises(protocol.ProtocolError, match=rf"malformed GenerateRequest: Expected `int`, got `\w+` - at "
                                                     rf"`GenerateRequest.prompt_token_ids\[{position}\]`"):
        protocol.decode(msgpack.packb(body))


def test_another_version_is_refused_as_such_before_anything_else():
    """A peer of another version is told so, naming both versions, whatever else its message holds: fields this
    version does not know, fields missing, types it does not know, or no version at all."""
    for body in ({"v": protocol.PROTOCOL_VERSION - 1, "type": "PrefillRequest", "request_id": "r1", "seed": 3},
                 {"v": protocol.PROTOCOL_VERSION - 1, "type": "TokenEvent", "request_id": "r1"},
                 {"type": "Ping", "nonce": 1, "v": protocol.PROTOCOL_VERSION - 1}):
        with pytest.raises(protocol.ProtocolError, match=OTHER_VERSION):
            protocol.decode(msgpack.packb(body))
    for version in (None, "14", True, protocol.PROTOCOL_VERSION + 1):
        body = {"type": "Ping", "nonce": 1} if version is None else {"v": version, "type": "Ping", "nonce": 1}
        with pytest.raises(protocol.ProtocolError, match=rf"protocol version {version} received, this node speaks "
                                                         rf"{protocol.PROTOCOL_VERSION}"):
            protocol.decode(msgpack.packb(body))


def request_body(**changes) -> dict:
    body = msgpack.unpackb(protocol.encode(protocol.DecodeRequest("r1", [1, 2, 3], PARAMS, [FIRST], KV)))
    for path, value in changes.items():
        *parents, name = path.split("__")
        inner = body
        for parent in parents:
            inner = inner[int(parent)] if isinstance(inner, list) else inner[parent]
        inner[name] = value
    return body


@pytest.mark.parametrize("changes, error", [
    ({"request_id": "r" * 257}, r"Expected `str` of length <= 256 - at `DecodeRequest.request_id`"),
    ({"kv__node_id": "p" * (protocol.MAX_ID_CHARS + 1)}, r"at `DecodeRequest.kv.node_id`"),
    ({"kv__address": "not-an-address"}, r"is not tcp://host:port - at `DecodeRequest.kv`"),
    ({"kv__address": "tcp://host:5000\n"}, r"is not tcp://host:port - at `DecodeRequest.kv`"),
    ({"kv__block_ids": []}, r"block ids >= 0 - at `DecodeRequest.kv`"),
    ({"kv__extra": 1}, r"unknown field `extra` - at `DecodeRequest.kv`"),
    ({"params__seed": None}, r"seed must be an int64"),
    ({"params__seed": 2**63}, r"seed must be an int64"),
    ({"params__seed": 1.0}, r"Expected `int \| null`, got `float` - at `DecodeRequest.params.seed`"),
    ({"params__temperature": -1}, r"temperature must be >= 0"),
    ({"params__temperature": math.nan}, r"temperature must be >= 0"),
    ({"params__top_p": "1"}, r"Expected `float`, got `str` - at `DecodeRequest.params.top_p`"),
    ({"params__logit_bias": [[5, math.nan]]}, r"logit_bias values must be in"),
    ({"params__stop_token_ids": [True]}, r"Expected `int`, got `bool` - at `DecodeRequest.params.stop_token_ids\[0\]`"),
    ({"first_tokens__0__logprobs": [1]},
     r"Expected `object \| null`, got `array` - at `DecodeRequest.first_tokens\[0\].logprobs`"),
    ({"first_tokens__0__logprobs__logprob": math.nan}, r"at `DecodeRequest.first_tokens\[0\].logprobs.logprob`"),
    ({"first_tokens__0__logprobs__top": [[7, math.nan]]},
     r"at `DecodeRequest.first_tokens\[0\].logprobs.top\[0\]\[1\]`"),
    ({"first_tokens__0__index": "0"}, r"Expected `int`, got `str` - at `DecodeRequest.first_tokens\[0\].index`"),
])
def test_every_nested_part_is_checked_as_it_is_decoded(changes, error):
    with pytest.raises(protocol.ProtocolError, match=error):
        protocol.decode(msgpack.packb(request_body(**changes), use_bin_type=True))


@pytest.mark.parametrize("queue_seconds", [math.nan, -1.0])
def test_a_prefill_result_with_a_bad_queue_time_is_refused(queue_seconds):
    body = msgpack.unpackb(protocol.encode(protocol.PrefillResult("r1", [FIRST], KV)))
    body["queue_seconds"] = queue_seconds
    with pytest.raises(protocol.ProtocolError, match="at `PrefillResult.queue_seconds`"):
        protocol.decode(msgpack.packb(body))


def test_request_id_of_names_the_request_of_a_malformed_message_and_nothing_else():
    assert protocol.request_id_of(msgpack.packb(request_body(params__temperature=-1))) == "r1"
    assert protocol.request_id_of(msgpack.packb({"v": 1, "type": "Nope", "request_id": "r2"})) == "r2"
    for data in (b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"request_id": 7}),
                 msgpack.packb({"request_id": "r" * (protocol.MAX_ID_CHARS + 1)}), protocol.encode(protocol.Ping(1))):
        assert protocol.request_id_of(data) == ""


@pytest.mark.parametrize("field, value, error", [
    ("transport_payload", {"agent_metadata": b"m", "num_blocks": 64},
     "Expected `bytes`, got `object` - at `HandshakeReply.transport_payload`"),
    ("transport", 7, "Expected `str`, got `int` - at `HandshakeReply.transport`"),
    ("kv_base_addresses", [2**40], "malformed HandshakeReply"),  # NOTE: a NIXL field of version 11's reply
])
def test_a_handshake_reply_carries_its_transport_fields_as_one_checked_payload(field, value, error):
    reply = next(m for m in MESSAGES if isinstance(m, protocol.HandshakeReply))
    body = msgpack.unpackb(protocol.encode(reply), raw=False)
    body[field] = value
    with pytest.raises(protocol.ProtocolError, match=error):
        protocol.decode(msgpack.packb(body, use_bin_type=True))


@pytest.mark.parametrize("message, field, value, error", [
    (protocol.InstanceGone("decode-0", "instance-1"), "instance_id", "",
     r"Expected `str` of length >= 1 - at `InstanceGone.instance_id`"),
    (protocol.InstanceGone("decode-0", "instance-1"), "instance_id", "i" * 257,
     r"Expected `str` of length <= 256 - at `InstanceGone.instance_id`"),
    (protocol.InstanceGone("decode-0", "instance-1"), "node_id", 7,
     r"Expected `str`, got `int` - at `InstanceGone.node_id`"),
    (protocol.ClaimKV("r1", "decode-0", "instance-1"), "instance_id", "",
     r"Expected `str` of length >= 1 - at `ClaimKV.instance_id`"),
])
def test_a_process_is_named_by_a_non_empty_instance_id(message, field, value, error):
    """InstanceGone ends the leases a process claimed, matched on ClaimKV's node and instance ids: an empty instance
    id would name no process in particular, and is refused on either message."""
    body = msgpack.unpackb(protocol.encode(message), raw=False)
    body[field] = value
    with pytest.raises(protocol.ProtocolError, match=error):
        protocol.decode(msgpack.packb(body, use_bin_type=True))
    for missing in ("node_id", "instance_id"):  # NOTE: a claim of version 18 named no claimer
        body = msgpack.unpackb(protocol.encode(message), raw=False)
        del body[missing]
        with pytest.raises(protocol.ProtocolError, match=f"missing required field `{missing}`"):
            protocol.decode(msgpack.packb(body, use_bin_type=True))


def test_kv_done_notification_is_a_versioned_message_naming_its_request_and_nothing_else():
    notification = protocol.kv_done_notification("r-9")
    assert protocol.decode(notification) == protocol.KVReadDone("r-9")
    assert msgpack.unpackb(notification) == {"type": "KVReadDone", "request_id": "r-9", "v": protocol.PROTOCOL_VERSION}
    assert protocol.kv_done_request_id(notification) == "r-9"
    for other, error in ((b"something else", "undecodable"), (b"done:r-9", "undecodable"),
                         (protocol.encode(protocol.ClaimKV("r-9", "decode-0", "i")),
                          "ClaimKV is not a KV-done notification"),
                         (msgpack.packb({"type": "KVReadDone", "request_id": "r-9", "v": VERSION - 1}), OTHER_VERSION),
                         (msgpack.packb({"type": "KVReadDone", "request_id": 9, "v": VERSION}),
                          "malformed KVReadDone")):
        with pytest.raises(protocol.ProtocolError, match=error):
            protocol.kv_done_request_id(other)


@pytest.mark.parametrize("event", [
    {"request_id": "r", "token_ids": [1.5], "logprobs": None},
    {"request_id": "r" * 300, "token_ids": [1], "logprobs": None},
    {"request_id": "r", "token_ids": [1], "logprobs": None, "extra": 1},
    {"request_id": "r", "token_ids": [True], "logprobs": None},
    {"request_id": "r", "token_ids": [1], "logprobs": [[1, float("nan"), []]]},
    {"token_ids": [1], "logprobs": None},
    [1, 2],
])
def test_step_tokens_with_a_bad_event_are_refused_on_either_path(event):
    for keys in (("v", "type", "events"), ("type", "v", "events")):
        values = {"v": protocol.PROTOCOL_VERSION, "type": "StepTokens", "events": [event]}
        data = msgpack.packb({key: values[key] for key in keys}, use_bin_type=True)
        with pytest.raises(protocol.ProtocolError):
            protocol.decode(data)
