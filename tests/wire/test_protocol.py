"""The wire protocol: every message type round-trips through msgpack with its Python field types; other
versions, unknown types and malformed bodies are refused; the KV-done notification is defined here too."""

import msgpack
import pytest

from wire import protocol
from wire.outputs import TokenLogprobs
from wire.sampling_params import SamplingParams

LOGPROBS = TokenLogprobs(7, -0.5, ((7, -0.5), (3, -1.25)))
KV = protocol.KVHandle("prefill-0", "tcp://127.0.0.1:5000", (3, 4, 9), 40, "abc123")
PARAMS = SamplingParams(temperature=0.6, seed=1, max_tokens=8, logprobs=2)
CONTROLLED = SamplingParams(temperature=0.6, n=3, presence_penalty=0.5, frequency_penalty=-1.0,
                            repetition_penalty=1.2, min_p=0.1, min_tokens=2, logit_bias={5: -2.5, 3: 1.0})
FIRST = protocol.FirstToken(0, 7, LOGPROBS)
MESSAGES = [
    protocol.PrefillRequest("r1", [1, 2, 3], PARAMS, 11),
    protocol.PrefillRequest("r4", [1, 2, 3], CONTROLLED, 11),
    protocol.PrefillResult("r1", [FIRST], KV),
    protocol.PrefillResult("r2", [protocol.FirstToken(0, 7, None, "length")], None),
    protocol.PrefillResult("r3", [FIRST], KV, [None, LOGPROBS, LOGPROBS]),
    protocol.PrefillResult("r4", [FIRST, protocol.FirstToken(1, 2, LOGPROBS, "stop"), protocol.FirstToken(2, 9, None)],
                           KV),
    protocol.DecodeRequest("r1", [1, 2, 3], PARAMS, 11, [FIRST], KV),
    protocol.DecodeRequest("r4", [1, 2, 3], CONTROLLED, 11, [FIRST, protocol.FirstToken(2, 9, None)], KV),
    protocol.GenerateRequest("r1", [1, 2, 3], PARAMS, 11),
    protocol.GenerateRequest("r4", [1, 2, 3], CONTROLLED, 11),
    protocol.TokenEvent("r1", [5], [LOGPROBS], None),
    protocol.TokenEvent("r1", [5, 6], None, "stop"),
    protocol.TokenEvent("r4", [5, 6], None, None, index=2),
    protocol.StepTokens([protocol.TokenEvent("r1", [5], None),
                         protocol.TokenEvent("r2", [6], [LOGPROBS], "length", index=1),
                         protocol.TokenEvent("r3", [7], None, None, [None, LOGPROBS])]),
    protocol.StepTokens([]),
    protocol.ErrorReply("r1", 503, "gone"),
    protocol.Abort("r1"),
    protocol.Abort("r4", 1),
    protocol.Ping(9),
    protocol.HandshakeRefused("prefill-0", "block_size 16 != 32"),
    protocol.ClaimKV("r1"),
    protocol.ClaimReply("r1", True, (3, 4, 9)),
    protocol.ReleaseKV("r1", "read failed"),
    protocol.HandshakeReply("prefill-0", {"block_size": 16}, "abc123", "nixl", b"\x85the transport's own fields",
                            "instance-1", 30.0),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_with_its_field_types(message):
    assert protocol.decode(protocol.encode(message)) == message


def test_every_message_type_is_covered_above():
    covered = {type(m).__name__ for m in MESSAGES} | {"Pong", "HandshakeRequest"}
    assert covered == set(protocol.MESSAGE_TYPES)


@pytest.mark.parametrize("body, error", [
    ({"v": protocol.PROTOCOL_VERSION - 1, "type": "Ping", "nonce": 1}, "protocol version"),
    ({"v": protocol.PROTOCOL_VERSION, "type": "Nope"}, "unknown message type"),
    ({"v": protocol.PROTOCOL_VERSION, "type": "Ping", "nonce": 1, "extra": 2}, "malformed Ping"),
])
def test_foreign_messages_are_refused_with_the_reason(body, error):
    with pytest.raises(protocol.ProtocolError, match=error):
        protocol.decode(msgpack.packb(body))
    with pytest.raises(protocol.ProtocolError, match="undecodable"):
        protocol.decode(b"\xc1")


@pytest.mark.parametrize("bad, position", [(True, 700), (1.5, 0), ("7", 1023), ([3], 512)])
def test_a_long_token_id_list_with_one_bad_item_is_refused_naming_it(bad, position):
    """Token-id lists are checked in one pass (thousands per request); a bad item still names itself."""
    body = msgpack.unpackb(protocol.encode(protocol.GenerateRequest("r1", list(range(1024)), PARAMS, 11)))
    body["prompt_token_ids"][position] = bad
    with pytest.raises(protocol.ProtocolError, match=rf"prompt_token_ids\[{position}\] must be int"):
        protocol.decode(msgpack.packb(body))


@pytest.mark.parametrize("field, value, error", [
    ("transport_payload", {"agent_metadata": b"m", "num_blocks": 64}, "HandshakeReply.transport_payload must be bytes"),
    ("transport", 7, "HandshakeReply.transport must be str"),
    ("kv_base_addresses", [2**40], "malformed HandshakeReply"),  # NOTE: a NIXL field of version 11's reply
])
def test_a_handshake_reply_carries_its_transport_fields_as_one_checked_payload(field, value, error):
    reply = next(m for m in MESSAGES if isinstance(m, protocol.HandshakeReply))
    body = msgpack.unpackb(protocol.encode(reply), raw=False)
    body[field] = value
    with pytest.raises(protocol.ProtocolError, match=error):
        protocol.decode(msgpack.packb(body, use_bin_type=True))


def test_kv_done_notification_names_its_request_and_nothing_else():
    assert protocol.kv_done_request_id(protocol.kv_done_notification("r-9")) == "r-9"
    assert protocol.kv_done_request_id(b"something else") is None


def generic_wire(message) -> bytes:
    """A message as encode() writes every message but StepTokens (its fast path is held to this)."""
    body = {f.name: protocol._to_wire(getattr(message, f.name)) for f in protocol.dataclasses.fields(message)}
    return msgpack.packb({"v": protocol.PROTOCOL_VERSION, "type": type(message).__name__, **body}, use_bin_type=True)


@pytest.mark.parametrize("message", [m for m in MESSAGES if isinstance(m, protocol.StepTokens)], ids=str)
def test_step_tokens_fast_path_writes_and_reads_the_generic_wire_form(message):
    assert protocol.encode(message) == generic_wire(message)
    assert protocol.decode(generic_wire(message)) == message
    # NOTE: inverse: the generic path (another key order) reads the same message, so the fast path is not the
    # only one that can answer
    body = msgpack.unpackb(generic_wire(message))
    reordered = msgpack.packb({"type": body["type"], "v": body["v"], "events": body["events"]}, use_bin_type=True)
    assert not reordered.startswith(protocol.STEP_TOKENS_HEAD) and protocol.decode(reordered) == message


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
