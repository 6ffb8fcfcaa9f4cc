"""Fields as vLLM treats them: unknown ones ignored with a warning (named in X-CoRun-Ignored-Fields) unless
--strict-fields; stream_options.continuous_usage_stats; max_completion_tokens on both endpoints; the chat fields
clients send by default accepted where they change nothing and a 400 where they would."""

import pytest

from tests.router.harness import post, sse_events
from tests.router.test_errors import VALID, assert_error, completions

pytestmark = pytest.mark.timeout(30)
CHAT = {"model": "corun-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "seed": 4,
        "return_token_ids": True}


def chat(router, body):
    return post(router.base_url + "/v1/chat/completions", body)


def test_unknown_fields_are_ignored_named_in_a_header_and_change_nothing(router):
    plain = completions(router, {**VALID, "return_token_ids": True})
    extra = completions(router, {**VALID, "return_token_ids": True, "temprature": 1, "foo": {"bar": 2}})
    assert extra.status == 200 and extra.headers["X-CoRun-Ignored-Fields"] == "foo, temprature"
    assert extra.body["choices"][0]["token_ids"] == plain.body["choices"][0]["token_ids"]
    assert "X-CoRun-Ignored-Fields" not in plain.headers  # NOTE: the inverse: nothing to name, no header


def test_guidellm_s_stream_options_give_usage_in_every_chunk(router):
    body = {**VALID, "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    reply = post(router.base_url + "/v1/completions", body)
    assert reply.status == 200 and "X-CoRun-Ignored-Fields" not in reply.headers
    events = sse_events(reply.body)
    token_chunks = [e for e in events[:-1] if e["choices"]]
    so_far = [e["usage"]["completion_tokens"] for e in token_chunks]
    assert so_far == sorted(so_far) and so_far[-1] == 5 and all(e["usage"]["prompt_tokens"] for e in token_chunks)
    assert events[-2]["usage"]["completion_tokens"] == 5 and events[-1] == "[DONE]"
    without = sse_events(post(router.base_url + "/v1/completions", {**body, "stream_options": {
        "include_usage": True}}).body)
    assert all(e["usage"] is None for e in without[:-2])  # NOTE: only the final usage chunk without the option


def test_an_unknown_stream_option_is_ignored_and_named(router):
    reply = completions(router, {**VALID, "stream": True, "stream_options": {"include_usage": True, "x": 1}})
    assert reply.status == 200 and reply.headers["X-CoRun-Ignored-Fields"] == "stream_options.x"


def test_max_completion_tokens_on_completions_wins_over_max_tokens(router):
    reply = completions(router, {**VALID, "max_tokens": 8, "max_completion_tokens": 3, "return_token_ids": True})
    assert reply.status == 200 and len(reply.body["choices"][0]["token_ids"]) == 3
    assert_error(completions(router, {**VALID, "max_completion_tokens": 0}), 400, "'max_completion_tokens'")


def test_the_developer_role_is_the_system_role(router):
    system = chat(router, {**CHAT, "messages": [{"role": "system", "content": "be brief"}, *CHAT["messages"]]})
    developer = chat(router, {**CHAT, "messages": [{"role": "developer", "content": "be brief"}, *CHAT["messages"]]})
    assert developer.status == system.status == 200
    assert developer.body["choices"][0]["token_ids"] == system.body["choices"][0]["token_ids"]
    assert developer.body["usage"]["prompt_tokens"] == system.body["usage"]["prompt_tokens"]


@pytest.mark.parametrize("field, value, accepted", [
    ("response_format", {"type": "text"}, True),
    ("tool_choice", "none", True),
    ("tools", [], True),
    ("parallel_tool_calls", False, True),
])
def test_default_chat_fields_are_accepted_where_they_change_nothing(router, field, value, accepted):
    reply = chat(router, {**CHAT, field: value})
    if accepted:
        assert reply.status == 200 and reply.body["choices"][0]["token_ids"] == chat(router, CHAT).body[
            "choices"][0]["token_ids"]
    else:
        assert_error(reply, 400, f"'{field}'", "not supported")
