"""The structured-output and tool fields, parsed at the router (no nodes): which constraint each body sets, what is
a 400, and how model output becomes tool calls (non-streamed and streamed)."""

from __future__ import annotations

import json

import pytest

from router.api.errors import RequestError
from router.api.openai_api import ModelInfo, parse_chat_request, parse_completion_request
from router.api.tools import ToolRequest, ToolStream, chat_message, read_tools
from tests.router.fake_nodes import FakeBehaviour
from tests.router.harness import RouterHarness, post
from wire.structured import StructuredOutput, invalid_constraint

MODEL = ModelInfo("corun-tiny", 2048, vocab_size=2048, max_logprobs=20, max_num_prompts=8)
SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def completion(tokenizer, **fields):
    return parse_completion_request({"prompt": "The river", **fields}, MODEL, tokenizer)


def chat(tokenizer, **fields):
    return parse_chat_request({"messages": [{"role": "user", "content": "hi"}], **fields}, MODEL, tokenizer)


@pytest.mark.parametrize("fields, expected", [
    ({"structured_outputs": {"json": SCHEMA}}, StructuredOutput("json", json.dumps(SCHEMA))),
    ({"structured_outputs": {"json": json.dumps(SCHEMA), "disable_any_whitespace": True}},
     StructuredOutput("json", json.dumps(SCHEMA), any_whitespace=False)),
    ({"structured_outputs": {"regex": "[a-z]+"}}, StructuredOutput("regex", "[a-z]+")),
    ({"structured_outputs": {"choice": ["a", "b"]}}, StructuredOutput("choice", choices=("a", "b"))),
    ({"structured_outputs": {"grammar": 'root ::= "x"'}}, StructuredOutput("grammar", 'root ::= "x"')),
    ({"structured_outputs": {"json_object": True}}, StructuredOutput("json_object")),
    ({"response_format": {"type": "json_object"}}, StructuredOutput("json_object")),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
     StructuredOutput("json", json.dumps(SCHEMA))),
    ({"response_format": {"type": "text"}}, None),
    ({"guided_json": SCHEMA}, StructuredOutput("json", json.dumps(SCHEMA))),
    ({"guided_regex": "[0-9]+"}, StructuredOutput("regex", "[0-9]+")),
    ({"guided_choice": ["x", "y"]}, StructuredOutput("choice", choices=("x", "y"))),
    ({"guided_grammar": 'root ::= "x"', "guided_decoding_backend": "xgrammar"},
     StructuredOutput("grammar", 'root ::= "x"')),
    # NOTE: vLLM: response_format replaces structured_outputs' kind
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
     StructuredOutput("json_object")),
])
def test_each_field_sets_its_constraint_on_both_endpoints(tokenizer, fields, expected):
    assert completion(tokenizer, **fields).params.structured == expected
    assert chat(tokenizer, **fields).params.structured == expected


def test_disable_additional_properties_closes_objects(tokenizer):
    spec = completion(tokenizer, structured_outputs={"json": SCHEMA, "disable_additional_properties": True})
    assert json.loads(spec.params.structured.spec)["additionalProperties"] is False


@pytest.mark.parametrize("fields, message", [
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "exactly one"),
    ({"structured_outputs": {}}, "exactly one"),
    ({"structured_outputs": {"regex": "a", "bogus": 1}}, "unknown field"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "not supported"),
    ({"structured_outputs": {"json": "{not json"}}, "not valid JSON"),
    ({"structured_outputs": {"json": [1]}}, "JSON schema"),
    ({"structured_outputs": {"choice": []}}, "list of 1 to"),
    ({"structured_outputs": {"regex": ""}}, "non-empty"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "only one kind"),
    ({"guided_json": SCHEMA, "structured_outputs": {"regex": "a"}}, "only one kind"),
    ({"response_format": {"type": "json_schema"}}, "'schema'"),
    ({"response_format": {"type": "structural_tag"}}, "structural_tag is not supported"),
    ({"guided_whitespace_pattern": " *"}, "not supported"),
])
def test_malformed_constraints_are_400s(tokenizer, fields, message):
    with pytest.raises(RequestError, match=message) as error:
        completion(tokenizer, **fields)
    assert error.value.status == 400


def test_tool_choice_sets_vllms_schemas(tokenizer):
    named = chat(tokenizer, tools=[WEATHER, TIME],
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert json.loads(named.params.structured.spec) == WEATHER["function"]["parameters"]
    required = chat(tokenizer, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    schema = json.loads(required.params.structured.spec)
    assert schema["type"] == "array" and schema["maxItems"] == 1 and len(schema["items"]["anyOf"]) == 2
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "object", "properties": {}}
    assert chat(tokenizer, tools=[WEATHER]).params.structured is None  # auto: parsed, not forced
    assert chat(tokenizer, tools=[WEATHER], tool_choice="none").tools is None
    # NOTE: inverse: without tools the choice is refused, as is a name not among the tools
    with pytest.raises(RequestError, match="needs 'tools'"):
        chat(tokenizer, tool_choice="auto")
    with pytest.raises(RequestError, match="has not been passed"):
        chat(tokenizer, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})


def test_required_tools_definitions_move_to_the_schema_root(tokenizer):
    """vLLM's schema: a tool's "#/$defs/..." references name the root of the required-call schema."""
    unit = {"type": "string", "enum": ["c", "f"]}
    with_defs = {"type": "function", "function": {"name": "get_temp", "parameters": {
        "type": "object", "properties": {"unit": {"$ref": "#/$defs/Unit"}}, "$defs": {"Unit": unit}}}}
    required = json.loads(chat(tokenizer, tools=[with_defs, WEATHER], tool_choice="required").params.structured.spec)
    assert required["$defs"] == {"Unit": unit}
    assert "$defs" not in required["items"]["anyOf"][0]["properties"]["parameters"]
    # NOTE: inverse: without definitions the schema has none, and a named tool keeps its parameters whole
    assert "$defs" not in json.loads(chat(tokenizer, tools=[WEATHER], tool_choice="required").params.structured.spec)
    named = chat(tokenizer, tools=[with_defs], tool_choice={"type": "function", "function": {"name": "get_temp"}})
    assert json.loads(named.params.structured.spec)["$defs"] == {"Unit": unit}


def test_tool_messages_reach_the_template(tokenizer):
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "X"}'}}],
                 "refusal": None},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    request = parse_chat_request({"messages": messages, "tools": [WEATHER]}, MODEL, tokenizer)
    assert tokenizer.decode(list(request.prompts[0])).count("sunny") == 1


def tools(choice="auto", **kwargs) -> ToolRequest:
    body = {"tools": [WEATHER, TIME], "tool_choice": choice, **kwargs}
    return read_tools(body)


def test_hermes_output_becomes_tool_calls():
    text = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n' \
           '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    message, finish = chat_message(tools(), "r1", 0, text, "stop")
    assert finish == "tool_calls" and message["content"] == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == \
        [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert len({c["id"] for c in message["tool_calls"]}) == 2
    # NOTE: inverse: plain text (or a broken block) stays content, finish_reason unchanged
    for plain in ("no tools needed", "<tool_call>{broken</tool_call>"):
        message, finish = chat_message(tools(), "r1", 0, plain, "stop")
        assert finish == "stop" and message["content"] == plain and not message["tool_calls"]


def test_named_and_required_outputs():
    message, finish = chat_message(tools({"type": "function", "function": {"name": "get_weather"}}), "r", 0,
                                   '{"city": "Oslo"}', "stop")
    assert finish == "stop" and message["tool_calls"][0]["function"] == {"name": "get_weather",
                                                                          "arguments": '{"city": "Oslo"}'}
    message, finish = chat_message(tools("required"), "r", 0,
                                   '[{"name": "get_time", "parameters": {}}, {"name": "get_weather", '
                                   '"parameters": {"city": "Rome"}}]', "stop")
    assert finish == "tool_calls" and [c["function"]["name"] for c in message["tool_calls"]] == ["get_time",
                                                                                                 "get_weather"]


def stream(tool_request: ToolRequest, pieces: list[str]) -> list[dict]:
    rewriter = ToolStream(tool_request, "r", 0)
    return [rewriter.rewrite({"delta": {"content": piece}, "finish_reason": "stop" if i == len(pieces) - 1 else None})
            for i, piece in enumerate(pieces)]


def joined_calls(chunks: list[dict]) -> tuple[str, list[tuple[str, str]]]:
    """What a client accumulates: the content, and each call's name and arguments (by index)."""
    content, calls = "", {}
    for chunk in chunks:
        content += chunk["delta"].get("content", "") or ""
        for call in chunk["delta"].get("tool_calls", []):
            name, arguments = calls.get(call["index"], ("", ""))
            calls[call["index"]] = (name + call["function"].get("name", ""),
                                    arguments + call["function"].get("arguments", ""))
    return content, [calls[i] for i in sorted(calls)]


def test_streamed_tool_calls_add_up_to_the_non_streamed_ones():
    text = 'Sure.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    for cut in (1, 3, 7):
        chunks = stream(tools(), [text[i:i + cut] for i in range(0, len(text), cut)])
        content, calls = joined_calls(chunks)
        assert content == "Sure." and calls == [("get_weather", '{"city": "Paris"}')]
        assert chunks[-1]["finish_reason"] == "tool_calls"
    named = stream(tools({"type": "function", "function": {"name": "get_time"}}), ["{", "}"])
    assert joined_calls(named) == ("", [("get_time", "{}")]) and named[-1]["finish_reason"] == "stop"
    required = stream(tools("required"), ['[{"name": "get_time", ', '"parameters": {}}]'])
    assert joined_calls(required) == ("", [("get_time", "{}")]) and required[-1]["finish_reason"] == "tool_calls"
    # NOTE: inverse: text without calls streams as content, the tag's possible start held back only until it is not
    plain = stream(tools(), ["a <tool", "s are", " fine"])
    assert joined_calls(plain) == ("a <tools are fine", []) and plain[-1]["finish_reason"] == "stop"


def test_a_forced_call_cut_by_max_tokens_is_no_call():
    """As vLLM (its test_max_tokens_with_tool_choice_required): finish_reason length, no tool_calls, no content."""
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        message, finish = chat_message(tools(choice), "r", 0, '{"ci', "length")
        assert finish == "length" and "tool_calls" not in message and message["content"] == ""
    # NOTE: inverse: the same text finished by stop is a call (named)
    message, _ = chat_message(tools({"type": "function", "function": {"name": "get_weather"}}), "r", 0, '{"ci', "stop")
    assert message["tool_calls"]



BAD_SCHEMA = {"type": "nonsense"}
LIBRARY_REASON = 'Unsupported type "nonsense"'
CHAT = ("/v1/chat/completions", {"model": "corun-tiny", "messages": [{"role": "user", "content": "hi"}]})
COMPLETION = ("/v1/completions", {"model": "corun-tiny", "prompt": "The river"})


def refused_by_the_prefill_node(tiny_model_dir, word_token_ids, node_message: str, endpoint, fields: dict,
                                constraint_reason: str | None = None):
    """The replies, not streamed and streamed, when the one prefill node refuses every request with node_message
    (and constraint_reason, ErrorReply's field)."""
    refusing = FakeBehaviour(error=(400, node_message, constraint_reason))
    path, body = endpoint
    with RouterHarness(tiny_model_dir, word_token_ids, num_prefill=1, num_decode=1, prefill=refusing) as router:
        router.wait_until_healthy()
        return [post(router.base_url + path, {**body, **fields, "stream": stream}) for stream in (False, True)]


@pytest.mark.parametrize("endpoint, fields, field", [
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": BAD_SCHEMA}}},
     "response_format"),
    (COMPLETION, {"guided_json": BAD_SCHEMA}, "guided_json"),
    (COMPLETION, {"structured_outputs": {"json": BAD_SCHEMA}}, "structured_outputs"),
    (CHAT, {"tools": [WEATHER], "tool_choice": "required"}, "tools"),
])
def test_a_constraint_a_node_cannot_compile_is_a_400_naming_its_field(tiny_model_dir, word_token_ids, endpoint,
                                                                       fields, field):
    """A node's refusal of a constraint carries xgrammar's reason in ErrorReply.constraint_reason (node_core/serving.py
    refusal); the client gets the field and the reason, not the node's name nor the id."""
    node_message = f"request 0123abcd-0: {invalid_constraint('json', LIBRARY_REASON)}"
    for reply in refused_by_the_prefill_node(tiny_model_dir, word_token_ids, node_message, endpoint, fields,
                                             constraint_reason=LIBRARY_REASON):
        assert reply.status == 400 and reply.body["error"] == {
            "message": f"invalid json constraint in '{field}': {LIBRARY_REASON}", "type": "BadRequestError",
            "param": field, "code": 400}


@pytest.mark.parametrize("node_message", ["request 0123abcd-0: no room",
                                          f"request 0123abcd-0: {invalid_constraint('json', LIBRARY_REASON)}"])
def test_another_refusal_of_a_constrained_request_keeps_the_node_s_words(tiny_model_dir, word_token_ids, node_message):
    """Inverse: only a refusal that names its constraint's reason (the field, not words in the message) is
    reworded."""
    fields = {"guided_json": BAD_SCHEMA}
    for reply in refused_by_the_prefill_node(tiny_model_dir, word_token_ids, node_message, COMPLETION, fields):
        assert reply.status == 400 and reply.body["error"]["param"] is None
        assert reply.body["error"]["message"] == f"prefill node fake-prefill-0: {node_message}"


@pytest.mark.parametrize("fields, field", [
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "response_format"),
    ({"guided_regex": "[0-9]+"}, "guided_regex"),
    ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs"),
    ({"response_format": {"type": "text"}}, None),
    ({}, None),
])
def test_the_request_knows_which_field_its_constraint_came_from(tokenizer, fields, field):
    assert completion(tokenizer, **fields).constraint_field == field
