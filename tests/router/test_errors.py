"""Bad input gets a 400/404 in the OpenAI error shape, never a 500, and the router keeps serving."""

import asyncio
import json

import aiohttp
import pytest

from tests.router.fake_nodes import FakeBehaviour, without_tag
from tests.router.harness import NO_CLIENT_TIMEOUT, RouterHarness, get, post
from wire.protocol import DecodeRequest, PrefillRequest

pytestmark = pytest.mark.timeout(30)
VALID = {"model": "corun-tiny", "prompt": "the cat", "max_tokens": 4, "seed": 1}


def completions(router, body=None, **kwargs):
    return post(router.base_url + "/v1/completions", body, **kwargs)


def assert_error(reply, status: int, *message_parts: str) -> None:
    assert reply.status == status, reply.body
    error = reply.body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    for part in message_parts:
        assert part in error["message"], error["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe", b""])
def test_a_body_that_is_not_json_is_a_400(router, raw):
    assert_error(completions(router, raw=raw), 400, "not valid JSON")


@pytest.mark.parametrize("body", [[1, 2], "prompt", 3, None])
def test_a_body_that_is_not_an_object_is_a_400(router, body):
    assert_error(completions(router, raw=json.dumps(body).encode()), 400, "JSON object")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("temperature", "hot", "'temperature' must be a number >= 0"),
    ("temperature", -0.5, "'temperature' must be a number >= 0"),
    ("top_p", 0, "'top_p' must be a number in (0, 1]"),
    ("top_k", -2, "'top_k' must be an integer in [-1, 2048]"),
    ("top_k", 10**30, "'top_k'"),
    ("max_tokens", 0, "'max_tokens' must be an integer >= 1"),
    ("max_tokens", 2.5, "'max_tokens'"),
    ("max_tokens", True, "'max_tokens'"),
    ("seed", -2**63 - 1, "'seed' must be an int64 integer"),
    ("seed", 2**63, "'seed'"),
    ("logprobs", 21, "'logprobs' must be an integer in [0, 20]"),
    ("stream", "yes", "'stream' must be a boolean"),
    ("stop", ["a"] * 129, "'stop'"),
    ("stop", ["a" * 5000, "b" * 5000], "'stop'"),
    ("stop", "", "'stop'"),
    ("stop_token_ids", [1, 999999], "'stop_token_ids'"),
    ("n", 0, "'n' must be an integer in [1, 64]"),
    ("n", 65, "'n'"),
    ("n", 1.5, "'n'"),
    ("echo", "yes", "'echo' must be a boolean"),
    ("prompt_logprobs", 21, "'prompt_logprobs' must be an integer in [0, 20]"),
    ("best_of", 3, "'best_of'"),
    ("suffix", "tail", "'suffix'"),
    ("presence_penalty", 2.5, "'presence_penalty' must be a number in [-2, 2]"),
    ("frequency_penalty", "x", "'frequency_penalty'"),
    ("repetition_penalty", 0, "'repetition_penalty' must be a number in (0, 100]"),
    ("min_p", 1.5, "'min_p' must be a number in [0, 1]"),
    ("min_tokens", 9, "'min_tokens' must be an integer in [0, 4]"),
    ("logit_bias", {"5": 101}, "'logit_bias' must be an object of token ids"),
    ("logit_bias", {"99999": 1}, "'logit_bias'"),
    ("logit_bias", {"-5": 1}, "'logit_bias'"),
    ("logit_bias", [5, 1], "'logit_bias'"),
    ("stream_options", {"include_usage": True}, "'stream_options'"),
    ("prompt", [["a"]], "'prompt' must be"),
    ("prompt", {"text": "a"}, "'prompt' must be"),
])
def test_a_field_of_the_wrong_type_or_range_is_a_400_naming_it(router, field, value, message):
    reply = completions(router, {**VALID, field: value})
    assert_error(reply, 400, message)
    assert reply.body["error"]["param"] == field


def test_unknown_fields_are_named_with_strict_fields(tiny_model_dir, word_token_ids):
    """--strict-fields: a 400 naming them (by default they are ignored with a warning: test_field_policy.py)."""
    with RouterHarness(tiny_model_dir, word_token_ids, strict_fields=True) as strict:
        strict.wait_until_healthy()
        assert_error(completions(strict, {**VALID, "temprature": 1, "foo": 2}), 400, "'foo'", "'temprature'")
        stream = {**VALID, "stream": True, "stream_options": {"include_usage": True, "compress": True}}
        assert_error(completions(strict, stream), 400, "'stream_options.compress'")


@pytest.mark.parametrize("prompt", ["", [], [[]], [[1], []]])
def test_an_empty_prompt_is_a_400(router, prompt):
    assert_error(completions(router, {**VALID, "prompt": prompt}), 400, "empty")


def test_token_ids_outside_the_vocabulary_are_a_400(router):
    assert_error(completions(router, {**VALID, "prompt": [1, 2, 2048]}), 400, "2048", "vocabulary")
    assert_error(completions(router, {**VALID, "prompt": [5, -3, 7, -4]}), 400, "token id -3 ", "vocabulary")
    assert_error(completions(router, {**VALID, "prompt": [-1]}), 400, "-1")


def test_a_prompt_too_long_for_the_context_is_a_400_saying_so(router):
    reply = completions(router, {**VALID, "prompt": [5] * 1084, "max_tokens": 16})
    assert_error(reply, 400, "This model's maximum context length is 1024 tokens. However, you requested 1100 "
                             "tokens (1084 in the prompt, 16 for the completion).")


def test_an_unknown_model_is_a_404(router):
    assert_error(completions(router, {**VALID, "model": "gpt-4"}), 404, "gpt-4")


def test_an_unknown_route_is_a_404_in_the_same_shape(router):
    assert_error(get(router.base_url + "/v1/engines"), 404)


@pytest.mark.parametrize("request_id", ["x" * 129, "tab\there"])
def test_a_bad_request_id_is_a_400(router, request_id):
    assert_error(completions(router, VALID, headers={"X-Request-Id": request_id}), 400, "X-Request-Id")


@pytest.mark.parametrize(("messages", "message"), [
    ([], "'messages'"),
    ([{"role": 5, "content": "hi"}], "role"),
    ([{"content": "hi"}], "role"),
    ([{"role": "user", "content": 5}], "content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], "content"),
])
def test_bad_chat_messages_are_a_400(router, messages, message):
    reply = post(router.base_url + "/v1/chat/completions", {"model": "corun-tiny", "messages": messages})
    assert_error(reply, 400, message)


def test_chat_top_logprobs_needs_logprobs(router):
    body = {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2, "max_tokens": 2}
    assert_error(post(router.base_url + "/v1/chat/completions", body), 400, "'top_logprobs'")


def test_errors_echo_the_request_id_and_the_server_keeps_serving(router):
    bad = completions(router, {**VALID, "temperature": "hot"}, headers={"X-Request-Id": "bad-1"})
    assert bad.status == 400 and bad.headers["X-Request-Id"] == "bad-1"
    good = completions(router, {**VALID, "return_token_ids": True}, headers={"X-Request-Id": "good-1"})
    assert good.status == 200 and good.headers["X-Request-Id"] == "good-1"
    assert len(good.body["choices"][0]["token_ids"]) == 4


def test_deeply_nested_json_is_a_400_not_a_crash(router):
    assert_error(completions(router, raw=b"[" * 100_000), 400, "not valid JSON")


def test_a_request_id_already_in_flight_may_come_again(tiny_model_dir, word_token_ids):
    """As vLLM (which adds random characters to every request id): two requests with one X-Request-Id in flight at
    once are both served, each under ids of its own on the nodes, and give the same tokens (one seed from one id)."""
    slow = FakeBehaviour(event_delay_s=0.1)
    with RouterHarness(tiny_model_dir, word_token_ids, decode=slow) as router:
        (first, first_text), (second, second_text) = asyncio.run(same_id_twice(router.base_url))
        decode_ids = [m.request_id for node in router.decode_nodes for m in node.received
                      if isinstance(m, DecodeRequest)]
    assert first.status == second.status == 200 and first.headers["X-Request-Id"] == "twin"
    assert first.headers["X-CoRun-Seed"] == second.headers["X-CoRun-Seed"]
    tokens = [t for line in first_text.splitlines() if line.startswith("data: {")
              for t in json.loads(line[6:])["choices"][0]["token_ids"]]
    assert tokens == json.loads(second_text)["choices"][0]["token_ids"]
    assert len(set(decode_ids)) == 2 and {without_tag(i) for i in decode_ids} == {"twin-0"}


async def same_id_twice(base_url: str) -> list:
    """A stream with id "twin", and while it runs a request with that id: -> (response, body) of each."""
    headers = {"X-Request-Id": "twin"}
    body = {**VALID, "return_token_ids": True}
    async with aiohttp.ClientSession(timeout=NO_CLIENT_TIMEOUT) as session:
        async with session.post(base_url + "/v1/completions", json={**body, "stream": True},
                                headers=headers) as first:
            first_lines = [await first.content.readline()]
            async with session.post(base_url + "/v1/completions", json=body, headers=headers) as second:
                second_text = await second.text()
            first_text = b"".join(first_lines).decode() + await first.text()
    return [(first, first_text), (second, second_text)]


def test_a_client_named_request_gets_ids_of_its_own_on_the_nodes(tiny_model_dir, word_token_ids):
    """A client may send its X-Request-Id again once the router ended the request, while the nodes may still hold
    the first (a claimed KV lease until its read ends; they refuse an id they hold): each such request's ids on the
    nodes carry a tag of their own. An id the router made is unique already and carries none. The seed an id derives
    is the client's id's, tag or not."""
    with RouterHarness(tiny_model_dir, word_token_ids) as router:
        replies = [completions(router, {**VALID, "return_token_ids": True}, headers={"X-Request-Id": "again"})
                   for _ in range(2)]
        unnamed = completions(router, VALID)
        prefill_ids = [m.request_id for m in router.prefill_nodes[0].received if isinstance(m, PrefillRequest)]
    assert [reply.status for reply in replies] == [200, 200] and unnamed.status == 200
    assert prefill_ids[0] != prefill_ids[1] and [without_tag(i) for i in prefill_ids[:2]] == ["again-0", "again-0"]
    assert prefill_ids[2] == unnamed.headers["X-Request-Id"] + "-0"  # NOTE: inverse: no tag where none is needed
    assert replies[0].headers["X-CoRun-Seed"] == replies[1].headers["X-CoRun-Seed"]
    assert replies[0].body["choices"][0]["token_ids"] == replies[1].body["choices"][0]["token_ids"]
