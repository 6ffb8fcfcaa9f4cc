"""The streamed token's fast path (issue 21): plain token events go from the node's receive loop straight to the
client's connection; what goes that way, and what the request's coroutine still sees, changes nothing the client
gets."""

import asyncio

import msgspec
import pytest

from router.api.handlers import ChoiceTotals
from router.api.streaming import PUSH_BUFFER_LIMIT_BYTES, ChunkWriter
from router.generation.output import ChoiceDelta
from router.generation.pipeline import generate
from router.nodes.client import ReplyQueue
from tests.router.fake_nodes import FakeBehaviour, expected_token_ids
from tests.router.harness import RouterHarness, post, sse_events
from tests.router.test_pipeline import with_cluster
from wire.protocol import ErrorReply, TokenEvent
from wire.sampling_params import SamplingParams
from wire.seeding import sample_seed

pytestmark = pytest.mark.timeout(60)
PACED = FakeBehaviour(event_delay_s=0.005)
"""A decode node slower than the router: the request's coroutine waits for each event, so the fast path may take
it."""


def test_pushed_and_yielded_events_make_the_whole_output_in_order(word_token_ids):
    params = SamplingParams(max_tokens=12, n=2, logprobs=1)
    arrivals = []

    def push(event):
        arrivals.append(("pushed", event))
        return True

    async def body(pool, prefills, decodes):
        async for event in generate(pool, "pushy", [5, 6, 7], params, 3, push=push):
            arrivals.append(("yielded", event))

    asyncio.run(with_cluster(word_token_ids, body, decode=PACED))
    for index in range(params.n):
        events = [(how, event) for how, event in arrivals if event.index == index]
        token_ids = [token_id for _, event in events for token_id in event.token_ids]
        assert token_ids == expected_token_ids(word_token_ids, [5, 6, 7], sample_seed(3, index), params)
        assert events[0][0] == "yielded" and events[0][1].prompt_logprobs is None  # NOTE: a sample's first
        assert events[-1][0] == "yielded" and events[-1][1].finish_reason == "length"
        assert any(how == "pushed" for how, _ in events)
        assert all(event.finish_reason is None for how, event in events if how == "pushed")


def test_a_push_that_declines_leaves_every_event_to_the_generator(word_token_ids):
    params = SamplingParams(max_tokens=8)

    async def body(pool, prefills, decodes):
        return [event async for event in generate(pool, "declined", [1, 2], params, 4, push=lambda event: False)]

    events = asyncio.run(with_cluster(word_token_ids, body, decode=PACED))
    assert [t for event in events for t in event.token_ids] == expected_token_ids(word_token_ids, [1, 2], 4, params)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("logprobs", [None, 2])
def test_a_fast_streamed_response_matches_the_full_one(tiny_model_dir, word_token_ids, monkeypatch, path, logprobs):
    taken, added = [], []
    take, take_text, accepts = ChunkWriter.take, ChunkWriter.take_text, ChoiceTotals.accepts
    monkeypatch.setattr(ChunkWriter, "take", lambda writer, delta: taken.append(delta) or take(writer, delta))
    monkeypatch.setattr(ChunkWriter, "take_text", lambda writer, index, text, ids, lps: taken.append(text) or take_text(
        writer, index, text, ids, lps))
    # NOTE: only the fast path asks a full response's totals whether they accept a delta
    monkeypatch.setattr(ChoiceTotals, "accepts", lambda totals, index: added.append(index) or accepts(totals, index))
    body = {"max_tokens": 16, "n": 2, "seed": 7, "return_token_ids": True, "ignore_eos": True}
    if logprobs is not None:
        body |= {"logprobs": logprobs} if path == "/v1/completions" else {"logprobs": True, "top_logprobs": logprobs}
    body |= {"prompt": "the river"} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": "the river"}]}
    with RouterHarness(tiny_model_dir, word_token_ids, decode=PACED) as router:
        full = post(router.base_url + path, body)
        streamed = post(router.base_url + path, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert full.status == streamed.status == 200
    events = sse_events(streamed.body)
    assert events[-1] == "[DONE]" and events[-2]["usage"] == full.body["usage"]
    for choice in full.body["choices"]:
        parts = [c for e in events[:-2] for c in e["choices"] if c["index"] == choice["index"]]
        text = "".join(c["text"] if "text" in c else c["delta"].get("content", "") for c in parts)
        assert text == choice.get("text", choice.get("message", {}).get("content"))
        assert [t for c in parts for t in c.get("token_ids") or []] == choice["token_ids"]
        assert parts[-1]["finish_reason"] == choice["finish_reason"]
        if logprobs is not None and path == "/v1/completions":
            for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                assert [x for c in parts if c["logprobs"] for x in c["logprobs"][key]] == choice["logprobs"][key]
        elif logprobs is not None:
            assert [x for c in parts if c["logprobs"] for x in c["logprobs"]["content"]] == choice["logprobs"][
                "content"]
    assert taken, "no streamed token took the fast path"
    assert added, "no token of the full response took the fast path"


class StubTransport:
    def __init__(self, buffered=0, closing=False):
        self.buffered, self.closing, self.written = buffered, closing, []

    def is_closing(self):
        return self.closing

    def get_write_buffer_size(self):
        return self.buffered

    def write(self, data):
        self.written.append(data)


class StubResponse:
    headers = {"Transfer-Encoding": "chunked"}


class StubRequest:
    def __init__(self, transport):
        self.transport = transport


def open_writer(ctx, transport) -> ChunkWriter:
    writer = ChunkWriter(StubResponse(), ctx, None)
    writer.open_fast_path(StubRequest(transport))
    writer.events(ChoiceDelta(0, "a", (1,), None, None))  # NOTE: the choice's first delta opens it
    return writer


def test_a_client_that_does_not_keep_up_or_is_gone_is_left_to_its_coroutine(tokenizer):
    from router.api.responses import ResponseContext

    ctx = ResponseContext("completion", "r", 0, "m", "fp", 1, None, tokenizer, prompts=((1,),))
    assert open_writer(ctx, StubTransport()).accepts(0)
    assert not open_writer(ctx, StubTransport()).accepts(1)  # NOTE: not open yet: its first chunk is the coroutine's
    assert not open_writer(ctx, StubTransport(buffered=PUSH_BUFFER_LIMIT_BYTES + 1)).accepts(0)
    assert not open_writer(ctx, StubTransport(closing=True)).accepts(0)
    writer = open_writer(ctx, StubTransport())
    writer.close_fast_path()
    assert not writer.accepts(0)


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("return_token_ids", [False, True])
@pytest.mark.parametrize("num_top", [None, 2])
@pytest.mark.parametrize("take", ["take", "take_text"])
def test_a_fast_chunk_is_the_chunk_the_coroutine_writes_in_http_chunked_framing(tokenizer, kind, return_token_ids,
                                                                                num_top, take):
    from router.api.responses import ResponseContext, chunk_choice
    from router.api.streaming import ChunkEncoder
    from router.generation.output import OutputOptions
    from wire.outputs import TokenLogprobs

    ctx = ResponseContext(kind, "r", 0, "m", "fp", 1, num_top, tokenizer,
                          OutputOptions(return_token_ids=return_token_ids), prompts=((1,),))
    transport = StubTransport()
    writer = open_writer(ctx, transport)
    deltas = [ChoiceDelta(0, ' b\u00e9"\n\u2028', (2, 3), None, None), ChoiceDelta(0, "c", (4,), None, None)]
    if num_top is not None:  # NOTE: an impossible token's -inf included (JSON has none: -9999.0)
        deltas = [msgspec.structs.replace(delta, logprobs=tuple(
            TokenLogprobs(token, -0.5 * i - (token == 3) * float("inf"), ((token + 1, -1.0), (token + 2, -2.5)))
            for i, token in enumerate(delta.token_ids))) for delta in deltas]
    text_offset, expected = 0, []
    for delta in deltas:
        if take == "take":
            writer.take(delta)
        else:
            writer.take_text(0, delta.text, list(delta.token_ids), None if delta.logprobs is None else list(
                delta.logprobs))
        choice, text_offset = chunk_choice(ctx, delta, text_offset)  # NOTE: completions' offsets run on
        event = ChunkEncoder(ctx).event(choice)
        expected.append(b"%x\r\n" % len(event) + event + b"\r\n")
    assert transport.written == expected
    assert writer.num_tokens == 4


def test_a_failing_push_fails_its_request_not_the_receive_loop():
    def push(reply):
        raise RuntimeError("a bug")

    async def scenario():
        queue = ReplyQueue()
        queue.push = push
        waiting = asyncio.ensure_future(queue.next_within(5.0))
        await asyncio.sleep(0)
        queue.offer(TokenEvent("r", [1], None), asyncio.get_running_loop().time())
        reply = await waiting
        assert isinstance(reply, ErrorReply) and reply.status == 500 and queue.push is None

    asyncio.run(scenario())
