"""Stream chunks encoded with their envelope encoded once (ChunkEncoder) are the bytes of the whole chunk's
encoding."""

import json

import pytest

from router.api.responses import ResponseContext, chunk_choice, role_choice, usage
from router.api.streaming import JSON_ENCODER, ChunkEncoder
from router.generation.output import ChoiceDelta
from wire.outputs import TokenLogprobs


def whole_chunk(ctx, choice, chunk_usage):
    return b"data: " + JSON_ENCODER.encode({**ctx.envelope(streaming=True), "choices": [choice],
                                            "usage": chunk_usage}) + b"\n\n"


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_a_chunk_is_the_bytes_of_its_whole_encoding_with_and_without_usage(tokenizer, kind):
    ctx = ResponseContext(kind, "req-\u00e9\"1", 1700000000, "model \u2603", "fp_1", 2**62 + 1, 2, tokenizer, n=3)
    chunks = ChunkEncoder(ctx)
    deltas = [ChoiceDelta(1, " h\u00e9llo \"q\"\n", (17, 18), None, None),
              ChoiceDelta(2, "", (19,), (TokenLogprobs(19, -0.25, ((19, -0.25), (3, -1.5))),), "stop", "\n")]
    for delta in deltas:
        choice, _ = chunk_choice(ctx, delta, 0, first=False)
        for chunk_usage in (None, usage(5, 7)):
            encoded = chunks.event(choice, chunk_usage)
            assert encoded == whole_chunk(ctx, choice, chunk_usage)
            assert json.loads(encoded[len(b"data: "):])["choices"][0]["index"] == delta.index
    # NOTE: inverse: another choice gives other bytes
    other, _ = chunk_choice(ctx, deltas[0], 0)
    assert chunks.event(role_choice(0)) != whole_chunk(ctx, other, None)
    assert chunks.event(role_choice(0)) == whole_chunk(ctx, role_choice(0), None)


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("return_token_ids", [False, True])
def test_a_plain_chunk_from_its_template_is_the_chunk_encoded_whole(tokenizer, kind, return_token_ids):
    from router.api.streaming import PlainChunk
    from router.generation.output import OutputOptions

    ctx = ResponseContext(kind, "req-\u00e9\"1", 1700000000, "model \u2603", "fp_1", 2**62 + 1, None, tokenizer,
                          OutputOptions(return_token_ids=return_token_ids), ((1, 2),) * 3, n=3)
    chunks = ChunkEncoder(ctx)
    for index in range(3):
        plain = PlainChunk(ctx, chunks, index)
        for text, token_ids in ((" h\u00e9llo \"q\"\n\x01\x02", (17, 18)), ("", (19,)), ("\ufffd", ())):
            delta = ChoiceDelta(index, text, token_ids, None, None)
            choice, _ = chunk_choice(ctx, delta, 5)
            assert plain.event(delta) == chunks.event(choice)
