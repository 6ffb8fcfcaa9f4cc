"""Structured outputs and tool calls through the cluster (tiny model, CPU): the prefill node samples token 1 under the
constraint, the decode node rebuilds the grammar state from it and goes on; the P/D path, the colocated path and
the engine give the same bits, alone and among concurrent requests. A spec the grammar engine refuses is a 400."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from corun import LLM, SamplingParams
from corun.structured import Grammars
from launch.local import LocalCluster, LocalClusterConfig, free_port
from tests.launch.cluster_client import CHUNK, MAX_MODEL_LEN, client, engine_config
from wire.structured import StructuredOutput
from wire.tokenizer import load_tokenizer

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,10}$"},
          "days": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["city", "days"],
          "additionalProperties": False}
STRUCTURED = {"json": SCHEMA, "disable_any_whitespace": True}
PARAMS = {"temperature": 0.8, "seed": 21, "max_tokens": 48, "logprobs": 2}
PROMPT = "Plan a trip"
PD = {"X-CoRun-Prefill-Node": "prefill-0"}
COLOCATED = {"X-CoRun-Decode-Node": "colocated-0"}
VOCAB_SIZE = 2048
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}


N = 8
"""Decode rows: fewer than the other cluster tests' 32, so that three nodes start quickly on a loaded host."""


@pytest.fixture(scope="module")
def mixed(tiny_model_dir):
    """1P1D beside one colocated node; pinning on, so each path can be asked for."""
    config = LocalClusterConfig(engine_config(tiny_model_dir, max_num_seqs=N), served_model_name="corun-tiny",
                                num_prefill=1, num_decode=1,
                                num_colocated=1, enable_node_pinning=True, port=free_port("127.0.0.1"))
    cluster = LocalCluster(config).start()
    yield cluster
    cluster.stop()


def complete(api: openai.OpenAI, extra: dict, headers: dict | None = None, prompt: str = PROMPT, **params):
    choice = api.completions.create(model="corun-tiny", prompt=prompt, extra_body={**extra, "return_token_ids": True},
                                    extra_headers=headers or {}, **{**PARAMS, **params}).choices[0]
    return choice.text, choice.model_extra["token_ids"], choice.logprobs.token_logprobs, choice.finish_reason


def test_p_d_colocated_and_engine_give_the_same_constrained_bits(mixed, tiny_model_dir):
    api = client(mixed)
    via_pd = complete(api, {"structured_outputs": STRUCTURED}, PD)
    via_colocated = complete(api, {"structured_outputs": STRUCTURED}, COLOCATED)
    assert via_pd == via_colocated
    text, token_ids, _, finish_reason = via_pd
    assert finish_reason == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)
    llm = LLM(tiny_model_dir, max_num_seqs=N, max_model_len=MAX_MODEL_LEN, prefill_chunk_size=CHUNK, num_threads=1)
    spec = StructuredOutput("json", json.dumps(SCHEMA), any_whitespace=False)
    engine = llm.generate(PROMPT, SamplingParams(**PARAMS, structured=spec))[0].outputs[0]
    assert engine.token_ids == token_ids and [lp.logprob for lp in engine.logprobs] == via_pd[2]
    # NOTE: inverse: unconstrained, the same request is other tokens, and not JSON
    free_text, free_ids, _, _ = complete(api, {}, PD)
    assert free_ids != token_ids
    with pytest.raises(ValueError):
        json.loads(free_text)


def test_n_samples_and_streams_keep_the_constraint_and_the_bits(mixed):
    """n = 2: the prefill node samples both first tokens from one matcher state, the decode node continues each."""
    api = client(mixed)
    args = dict(model="corun-tiny", prompt=PROMPT, n=2, extra_body={"structured_outputs": STRUCTURED,
                                                                    "return_token_ids": True}, **PARAMS)
    via_pd = api.completions.create(**args, extra_headers=PD).choices
    via_colocated = api.completions.create(**args, extra_headers=COLOCATED).choices
    assert [c.model_extra["token_ids"] for c in via_pd] == [c.model_extra["token_ids"] for c in via_colocated]
    for choice in via_pd:
        jsonschema.validate(json.loads(choice.text), SCHEMA)
    assert via_pd[0].model_extra["token_ids"] != via_pd[1].model_extra["token_ids"]
    streamed = {0: [], 1: []}
    for chunk in api.completions.create(**args, stream=True, extra_headers=PD):
        for choice in chunk.choices:
            streamed[choice.index] += choice.model_extra.get("token_ids") or []
    assert [streamed[0], streamed[1]] == [c.model_extra["token_ids"] for c in via_pd]


def test_constrained_requests_among_concurrent_ones_keep_their_bits(mixed):
    api = client(mixed)
    alone = [complete(api, {"structured_outputs": STRUCTURED}, prompt=f"Trip number {i}") for i in range(3)]
    jobs = [({"structured_outputs": STRUCTURED}, f"Trip number {i}") for i in range(3)] + \
        [({}, f"Other words {i}") for i in range(5)] + [({"structured_outputs": {"regex": "[0-9]{3,30}"}}, "Digits")]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        together = list(pool.map(lambda job: complete(api, job[0], prompt=job[1]), jobs))
    assert together[:3] == alone
    assert together[-1][0].isdigit()


def follows(model_dir: str, spec: StructuredOutput, token_ids: list[int]) -> bool:
    """Every token is one the constraint allows after the ones before it (a truncated output too)."""
    import xgrammar

    matcher = xgrammar.GrammarMatcher(Grammars(model_dir).compile(spec, VOCAB_SIZE))
    return all(matcher.accept_token(t) for t in token_ids)


def test_response_format_on_both_endpoints(mixed, tiny_model_dir):
    """response_format allows any whitespace (vLLM's default), on which the random model may spend max_tokens: the
    check is that every token follows the schema's grammar, and a finished output validates."""
    api = client(mixed)
    response_format = {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}}
    _, completion_ids, _, completion_finish = complete(api, {"response_format": response_format}, max_tokens=64)
    chat = api.chat.completions.create(model="corun-tiny", messages=[{"role": "user", "content": "trip?"}],
                                       response_format=response_format, max_tokens=64, seed=3,
                                       extra_body={"return_token_ids": True})
    chat_ids, chat_finish = chat.choices[0].model_extra["token_ids"], chat.choices[0].finish_reason
    spec = StructuredOutput("json", json.dumps(SCHEMA))
    for token_ids, finish_reason in ((completion_ids, completion_finish), (chat_ids, chat_finish)):
        assert follows(tiny_model_dir, spec, token_ids)
        if finish_reason == "stop":
            jsonschema.validate(json.loads(load_tokenizer(tiny_model_dir).decode(token_ids)), SCHEMA)
    free_ids = complete(api, {}, max_tokens=64)[1]
    assert not follows(tiny_model_dir, spec, free_ids), "inverse: unconstrained output does not follow it"


@pytest.mark.parametrize("extra, param, message", [
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs", "invalid regex constraint"),
    ({"guided_grammar": "root ::= undefined_rule"}, "guided_grammar", "invalid grammar constraint"),
    ({"structured_outputs": {"json": {"type": "no-such-type"}}}, "structured_outputs", "invalid json constraint"),
])
@pytest.mark.parametrize("headers", [PD, COLOCATED])
def test_a_spec_the_nodes_cannot_compile_is_a_400_naming_its_field(mixed, extra, param, message, headers):
    """The grammar library's reason and the field, not the node that refused it nor the request's id there."""
    with pytest.raises(openai.BadRequestError, match=f"^Error code: 400 - .*{message} in '{param}': ") as refused:
        complete(client(mixed), extra, headers)
    assert refused.value.body["param"] == param
    assert "node" not in refused.value.body["message"] and "request" not in refused.value.body["message"]


def test_named_tool_choice_gives_a_valid_call_streamed_and_not(mixed):
    api = client(mixed)
    args = dict(model="corun-tiny", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER],
                tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=64, seed=4)
    choice = api.chat.completions.create(**args).choices[0]
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and choice.finish_reason == "stop"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    name, arguments, finish_reason = "", "", None
    for chunk in api.chat.completions.create(stream=True, **args):
        for streamed in chunk.choices:
            for delta_call in streamed.delta.tool_calls or []:
                name += delta_call.function.name or ""
                arguments += delta_call.function.arguments or ""
            finish_reason = streamed.finish_reason or finish_reason
    assert (name, arguments, finish_reason) == ("get_weather", call.function.arguments, "stop")
    # NOTE: the agent pattern: the reply goes back as a message, with the tool's answer
    messages = [*args["messages"], choice.message.model_dump(),
                {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    follow_up = api.chat.completions.create(**{**args, "messages": messages, "tool_choice": "required"})
    assert follow_up.choices[0].finish_reason in ("tool_calls", "length")
    if follow_up.choices[0].finish_reason == "tool_calls":
        assert all(c.function.name == "get_weather" for c in follow_up.choices[0].message.tool_calls)


def test_auto_tool_choice_parses_hermes_calls_streamed_and_not(mixed):
    """tool_choice auto: the output is parsed for <tool_call> blocks. The random model writes none of its own, so a
    choice constraint makes it write one: the parse (not the model) is what is checked."""
    api = client(mixed)
    block = '<tool_call>{"name": "get_weather", "arguments": {"city": "oslo", "days": 3}}</tool_call>'
    args = dict(model="corun-tiny", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER],
                max_tokens=300, seed=4, extra_body={"structured_outputs": {"choice": [f"Checking. {block}"]}})
    choice = api.chat.completions.create(**args).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking. "
    [call] = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "oslo", "days": 3})
    content, calls, finish_reason = "", [], None
    for chunk in api.chat.completions.create(stream=True, **args):
        for streamed in chunk.choices:
            content += streamed.delta.content or ""
            calls += [(c.function.name, c.function.arguments) for c in streamed.delta.tool_calls or []]
            finish_reason = streamed.finish_reason or finish_reason
    assert (content, calls, finish_reason) == ("Checking. ", [("get_weather", call.function.arguments)], "tool_calls")
    # NOTE: inverse: without tools the same output is plain content
    plain = api.chat.completions.create(**{**args, "tools": None}).choices[0]
    assert plain.message.content == f"Checking. {block}" and not plain.message.tool_calls
