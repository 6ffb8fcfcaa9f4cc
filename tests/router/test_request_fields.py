"""Issue 24 at the router (fake nodes): the field policy (supported, ignored with the header, refused with a 400
naming the field), chat templates and their options, token ids and the null keys vLLM always sends, and the small
items (continuous usage in chat's first chunk, the sampled token first in top_logprobs, text offsets, coercion)."""

import re
from pathlib import Path

import pytest

from router.api.field_policy import FIELD_POLICY
from tests.router.harness import RouterHarness, post, sse_events
from tests.router.test_errors import VALID, assert_error, completions

pytestmark = pytest.mark.timeout(60)
CHAT = {"model": "corun-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "seed": 4}


@pytest.fixture(scope="module")
def trusting(tiny_model_dir, word_token_ids):
    """A router started with --trust-request-chat-template."""
    with RouterHarness(tiny_model_dir, word_token_ids, trust_request_chat_template=True) as harness:
        harness.wait_until_healthy()
        yield harness


def chat(router, body):
    return post(router.base_url + "/v1/chat/completions", body)


def tokenize(router, body):
    return post(router.base_url + "/tokenize", {"model": "corun-tiny", **body})


def prompt_ids(router, body) -> list[int]:
    """The prompt the router sent, from return_token_ids."""
    reply = chat(router, {**body, "return_token_ids": True})
    assert reply.status == 200, reply.body
    return reply.body["prompt_token_ids"]


# ---- the field policy ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint, field, value", [
    ("completions", "structural_tag", {"type": "structural_tag"}),
    ("completions", "vllm_xargs", {"a": 1}),
    ("completions", "watermarking", True),
    ("chat/completions", "spaces_between_special_tokens", False),
    ("completions", "repetition_detection", {"max_pattern_size": 4}),
    ("completions", "suffix", "tail"),
])
def test_an_output_changing_field_not_supported_is_a_400_naming_it(router, endpoint, field, value):
    base = VALID if endpoint == "completions" else CHAT
    reply = post(f"{router.base_url}/v1/{endpoint}", {**base, field: value})
    assert_error(reply, 400, f"'{field}'")
    assert reply.body["error"]["param"] == field
    no_op = {**base, field: None}  # NOTE: the inverse: null (absent) is accepted
    assert post(f"{router.base_url}/v1/{endpoint}", no_op).status == 200


def test_harmless_fields_are_ignored_and_named_even_with_strict_fields(tiny_model_dir, word_token_ids):
    harmless = {"priority": 3, "request_id": "r1", "cache_salt": "s", "session_id": "x", "user": "u",
                "kv_transfer_params": {"do_remote_decode": False}}
    with RouterHarness(tiny_model_dir, word_token_ids, strict_fields=True) as strict:
        strict.wait_until_healthy()
        plain = completions(strict, {**VALID, "return_token_ids": True})
        reply = completions(strict, {**VALID, "return_token_ids": True, **harmless})
        assert reply.status == 200 and reply.headers["X-CoRun-Ignored-Fields"] == ", ".join(sorted(harmless))
        assert reply.body["choices"][0]["token_ids"] == plain.body["choices"][0]["token_ids"]
        assert_error(completions(strict, {**VALID, "priorty": 3}), 400, "'priorty'")  # NOTE: unknown: strict


def test_the_readme_lists_every_field_of_the_policy_with_its_kind():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    table = readme[readme.index("<!-- field policy -->"):readme.index("<!-- /field policy -->")]
    for kind in ("supported", "ignored", "refused"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {kind}"))
        listed = set(re.findall(r"`([a-z_]+)`", row))
        assert listed == {name for name, rule in FIELD_POLICY.items() if rule.kind == kind}, kind


# ---- stop strings and seeds ------------------------------------------------------------------------------------


def test_five_stop_strings_and_up_to_the_documented_bound_are_accepted(router):
    assert completions(router, {**VALID, "stop": ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]}).status == 200
    assert completions(router, {**VALID, "stop": ["x"] * 128}).status == 200
    assert_error(completions(router, {**VALID, "stop": ["x"] * 129}), 400, "'stop'", "128")


def test_int64_seeds_are_accepted_and_minus_one_means_none(router):
    negative = completions(router, {**VALID, "seed": -3, "return_token_ids": True})
    assert negative.status == 200 and negative.body["seed"] == -3
    assert completions(router, {**VALID, "seed": -2**63}).status == 200
    unseeded = [completions(router, {**VALID, "seed": -1}).body["seed"] for _ in range(2)]
    assert unseeded[0] != unseeded[1] and min(unseeded) >= 0  # NOTE: as no seed: one derived per request id
    assert negative.body["choices"][0]["token_ids"] != completions(router, {**VALID, "seed": 3,
                                                                             "return_token_ids": True}).body[
        "choices"][0]["token_ids"]


# ---- token ids and the null keys -------------------------------------------------------------------------------


def test_return_token_ids_adds_the_prompt_s_and_the_output_s_ids_and_the_null_keys_are_always_there(router,
                                                                                                    tokenizer):
    plain = completions(router, VALID).body["choices"][0]
    assert plain["prompt_token_ids"] is None and plain["prompt_logprobs"] is None and plain["token_ids"] is None
    asked = completions(router, {**VALID, "return_token_ids": True}).body["choices"][0]
    assert asked["prompt_token_ids"] == tokenizer.encode("the cat") and asked["text"] == plain["text"]
    assert tokenizer.decode(asked["token_ids"]) == plain["text"] and len(asked["token_ids"]) == VALID["max_tokens"]
    stream = sse_events(completions(router, {**VALID, "return_token_ids": True, "stream": True}).body)
    assert stream[0]["choices"][0]["prompt_token_ids"] == tokenizer.encode("the cat")
    assert [t for e in stream[:-1] for t in e["choices"][0]["token_ids"]] == asked["token_ids"]
    assert all(e["choices"][0]["prompt_token_ids"] is None for e in stream[1:-1])  # NOTE: once, as vLLM's
    plain_stream = sse_events(completions(router, {**VALID, "stream": True}).body)
    assert all(e["choices"][0]["token_ids"] is None and e["choices"][0]["prompt_token_ids"] is None
               for e in plain_stream[:-1])
    chat_plain = chat(router, CHAT).body
    assert chat_plain["prompt_token_ids"] is None and chat_plain["prompt_logprobs"] is None
    assert chat_plain["choices"][0]["token_ids"] is None
    chat_asked = chat(router, {**CHAT, "return_token_ids": True}).body["choices"][0]
    assert len(chat_asked["token_ids"]) == CHAT["max_tokens"]
    plain_chat_stream = sse_events(chat(router, {**CHAT, "stream": True}).body)
    assert all(c.get("token_ids") is None for e in plain_chat_stream[:-1] for c in e["choices"])
    assert len(prompt_ids(router, CHAT)) == chat_plain["usage"]["prompt_tokens"]
    chat_stream = sse_events(chat(router, {**CHAT, "stream": True, "return_token_ids": True}).body)
    assert chat_stream[0]["prompt_token_ids"] == prompt_ids(router, CHAT)


def test_truncation_and_add_special_tokens_shape_the_prompt(router, tokenizer):
    ids = tokenizer.encode("the cat sat on the mat")
    body = {**VALID, "prompt": "the cat sat on the mat", "return_token_ids": True}
    kept = completions(router, {**body, "truncate_prompt_tokens": 2}).body["choices"][0]["prompt_token_ids"]
    first = completions(router, {**body, "truncate_prompt_tokens": 2, "truncation_side": "right"}).body
    assert kept == ids[-2:] and first["choices"][0]["prompt_token_ids"] == ids[:2]
    assert completions(router, {**body, "truncate_prompt_tokens": -1}).body["choices"][0]["prompt_token_ids"] == ids
    assert_error(completions(router, {**body, "truncate_prompt_tokens": 0}), 400, "'truncate_prompt_tokens'")
    assert_error(completions(router, {**body, "truncation_side": "middle"}), 400, "'truncation_side'")
    assert len(prompt_ids(router, {**CHAT, "truncate_prompt_tokens": 3})) == 3
    # NOTE: Qwen's tokenizer adds no BOS, so add_special_tokens changes nothing here; it is validated
    assert_error(completions(router, {**body, "add_special_tokens": "yes please"}), 400, "'add_special_tokens'")


# ---- chat templates --------------------------------------------------------------------------------------------


def test_chat_template_options_change_the_rendered_prompt(router, trusting, tokenizer):
    default = prompt_ids(router, CHAT)
    assert tokenizer.decode(default, skip_special_tokens=False).endswith("<|im_start|>assistant\n")
    without = prompt_ids(router, {**CHAT, "add_generation_prompt": False})
    assert tokenizer.decode(without, skip_special_tokens=False).endswith("hi<|im_end|>\n")
    template = "{% for m in messages %}[{{ m.role }}:{{ m.content }}{{ suffix }}]{% endfor %}"
    own = {**CHAT, "chat_template": template, "chat_template_kwargs": {"suffix": "!"}}
    assert tokenizer.decode(prompt_ids(trusting, own)) == "[user:hi!]"
    assert_error(chat(router, own), 400, "'chat_template'", "--trust-request-chat-template")  # NOTE: as vLLM
    continued = {**CHAT, "messages": [*CHAT["messages"], {"role": "assistant", "content": "the river"}],
                 "add_generation_prompt": False, "continue_final_message": True}
    assert tokenizer.decode(prompt_ids(router, continued), skip_special_tokens=False).endswith(
        "<|im_start|>assistant\nthe river")
    assert_error(chat(router, {**continued, "add_generation_prompt": True}), 400, "'continue_final_message'")
    assert_error(chat(trusting, {**CHAT, "chat_template": "{{ raise_exception('no') }}"}), 400, "no")


def test_messages_with_extra_keys_custom_roles_and_the_tool_role_reach_the_template(router, tokenizer):
    reply = {"role": "assistant", "content": "ok", "refusal": None, "annotations": None, "audio": None,
             "function_call": None, "tool_calls": None}
    messages = [*CHAT["messages"], reply, {"role": "tool", "content": "42", "tool_call_id": "c1"},
                {"role": "critic", "content": "shorter"}]
    text = tokenizer.decode(prompt_ids(router, {**CHAT, "messages": messages}), skip_special_tokens=False)
    assert "<|im_start|>tool\n42<|im_end|>" in text and "<|im_start|>critic\nshorter" in text


def test_chat_echo_puts_the_last_assistant_message_before_the_reply(router):
    messages = [*CHAT["messages"], {"role": "assistant", "content": "The river"}]
    body = {**CHAT, "messages": messages, "add_generation_prompt": False, "continue_final_message": True}
    plain = chat(router, body).body["choices"][0]["message"]["content"]
    echoed = chat(router, {**body, "echo": True}).body["choices"][0]["message"]["content"]
    assert echoed == "The river" + plain
    events = sse_events(chat(router, {**body, "echo": True, "stream": True}).body)
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"]) == echoed
    assert chat(router, {**CHAT, "echo": True}).body["choices"][0]["message"]["content"] == chat(
        router, CHAT).body["choices"][0]["message"]["content"]  # NOTE: the last message is the user's: no echo


# ---- item 6's small ones ---------------------------------------------------------------------------------------


def test_chat_continuous_usage_has_usage_in_the_first_chunk(router):
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    events = sse_events(chat(router, body).body)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[0]["usage"]["completion_tokens"] == 0 and events[0]["usage"]["prompt_tokens"] > 0
    assert all(e["usage"] is not None for e in events[:-1])


def test_the_sampled_token_is_the_first_key_of_top_logprobs(router):
    choice = completions(router, {**VALID, "logprobs": 3}).body["choices"][0]
    for token, top in zip(choice["logprobs"]["tokens"], choice["logprobs"]["top_logprobs"], strict=True):
        assert next(iter(top)) == token


def test_echo_with_token_ids_as_tokens_has_monotonic_text_offsets(router, tokenizer):
    body = {**VALID, "echo": True, "logprobs": 1, "return_tokens_as_token_ids": True}
    logprobs = completions(router, body).body["choices"][0]["logprobs"]
    assert logprobs["tokens"][0].startswith("token_id:")
    offsets = logprobs["text_offset"]
    assert offsets == sorted(offsets) and offsets[0] == 0
    as_text = completions(router, {**body, "return_tokens_as_token_ids": False}).body["choices"][0]["logprobs"]
    assert offsets == as_text["text_offset"]  # NOTE: offsets count the text either way


@pytest.mark.parametrize("value, accepted", [("true", True), ("false", True), (1, True), ("maybe", False)])
def test_chat_logprobs_is_coerced_as_pydantic_does(router, value, accepted):
    reply = chat(router, {**CHAT, "logprobs": value})
    if accepted:
        assert reply.status == 200 and (reply.body["choices"][0]["logprobs"] is not None) == (value in ("true", 1))
    else:
        assert_error(reply, 400, "'logprobs'")


def test_tokenize_honours_the_template_options_and_returns_token_strs(router, tokenizer):
    with_prompt = tokenize(router, {"messages": CHAT["messages"], "return_token_strs": True}).body
    without = tokenize(router, {"messages": CHAT["messages"], "add_generation_prompt": False}).body
    assert with_prompt["count"] > without["count"] and with_prompt["tokens"][:without["count"]] == without["tokens"]
    assert without["token_strs"] is None
    assert with_prompt["token_strs"] == [tokenizer.id_to_token(t) for t in with_prompt["tokens"]]
    assert "".join(tokenize(router, {"prompt": "the cat", "return_token_strs": True}).body["token_strs"]) == \
        "theĠcat"


def test_reasoning_effort_reaches_the_template_as_vllm_passes_it(router, trusting, tokenizer):
    template = "{{ enable_thinking }}/{{ reasoning_effort }}{% for m in messages %}{{ m.content }}{% endfor %}"
    body = {**CHAT, "chat_template": template}
    assert tokenizer.decode(prompt_ids(trusting, {**body, "reasoning_effort": "none"})) == "False/nonehi"
    assert tokenizer.decode(prompt_ids(trusting, {**body, "reasoning_effort": "low",
                                                "chat_template_kwargs": {"enable_thinking": False}})) == "False/lowhi"
    assert_error(chat(router, {**CHAT, "reasoning_effort": "extreme"}), 400, "'reasoning_effort'")


def test_logprob_token_ids_need_logprobs_and_name_the_listed_tokens(router, word_token_ids):
    chosen = word_token_ids[:3]
    assert_error(completions(router, {**VALID, "logprob_token_ids": chosen}), 400, "'logprob_token_ids'", "logprobs")
    assert_error(chat(router, {**CHAT, "logprob_token_ids": chosen}), 400, "'logprob_token_ids'")
    assert_error(completions(router, {**VALID, "logprobs": 1, "logprob_token_ids": [2**40]}), 400,
                 "'logprob_token_ids'")
    reply = completions(router, {**VALID, "logprobs": 1, "logprob_token_ids": chosen})
    assert reply.status == 200
    # NOTE: the fake nodes list the first k candidates; the router asks for len(chosen) of them, not logprobs: 1
    assert all(len(top) >= 3 for top in reply.body["choices"][0]["logprobs"]["top_logprobs"])


def test_add_special_tokens_follows_vllm_s_defaults_with_a_bos_adding_tokenizer(tiny_model_dir):
    """Qwen's tokenizer adds nothing; one with a BOS post-processor (Llama's kind) shows each endpoint's default."""
    import json

    import tokenizers
    from tokenizers.processors import TemplateProcessing

    from router.api.openai_api import ModelInfo, parse_body
    from wire.tokenizer import Tokenizer, find_chat_template

    backend = tokenizers.Tokenizer.from_file(str(Path(tiny_model_dir) / "tokenizer.json"))
    bos = backend.token_to_id("<|endoftext|>")
    backend.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    config = json.loads((Path(tiny_model_dir) / "tokenizer_config.json").read_text())
    tokenizer = Tokenizer(backend, config, find_chat_template(Path(tiny_model_dir), config), [bos])
    model = ModelInfo("corun-tiny", 256, vocab_size=2048, max_logprobs=20, max_num_prompts=8)

    def prompt(kind, **fields):
        body = {"model": "corun-tiny", "max_tokens": 2, **fields}
        return parse_body(tokenizer, json.dumps(body).encode(), kind, model).prompts[0]

    assert prompt("completion", prompt="the cat")[0] == bos  # NOTE: vLLM's completions default: true
    assert prompt("completion", prompt="the cat", add_special_tokens=False)[0] != bos
    assert prompt("chat", messages=CHAT["messages"])[0] != bos  # NOTE: chat's default: false (the template's)
    assert prompt("chat", messages=CHAT["messages"], add_special_tokens=True)[0] == bos
