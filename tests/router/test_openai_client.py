"""The router through the official openai client, against fake nodes whose exact outputs are known."""

import re

import pytest
from openai import OpenAI

from tests.router.fake_nodes import expected_token_ids
from tests.router.harness import get
from wire.sampling_params import SamplingParams
from wire.seeding import sample_seed, seed_from_request_id

pytestmark = pytest.mark.timeout(30)
MODEL = "corun-tiny"
FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")
IDS = {"return_token_ids": True}
"""vLLM's field: the choices' token_ids (null unless asked), which these tests compare."""


@pytest.fixture(scope="module")
def client(router):
    with OpenAI(base_url=router.base_url + "/v1", api_key="unused", max_retries=0, timeout=10) as openai_client:
        yield openai_client


def expected(word_token_ids, tokenizer, prompt, seed, **params) -> list[int]:
    prompt_ids = tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    return expected_token_ids(word_token_ids, prompt_ids, seed, SamplingParams(**params))


def test_completion_returns_the_nodes_tokens_and_their_text(client, tokenizer, word_token_ids):
    response = client.completions.create(model=MODEL, prompt="the cat sat on the mat", max_tokens=10, seed=7,
                                         extra_body=IDS)
    choice = response.choices[0]
    assert choice.token_ids == expected(word_token_ids, tokenizer, "the cat sat on the mat", 7, max_tokens=10)
    assert choice.text == tokenizer.decode(choice.token_ids)
    assert choice.finish_reason == "length"
    assert response.id.startswith("cmpl-") and response.seed == 7
    assert FINGERPRINT.match(response.system_fingerprint)
    prompt_len = len(tokenizer.encode("the cat sat on the mat"))
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (prompt_len, 10)
    assert response.usage.total_tokens == prompt_len + 10


def test_a_prompt_gives_the_same_output_alone_or_in_a_list(client):
    prompts = ["one small step", "the river runs", "seven numbers people"]
    batch = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, seed=11, extra_body=IDS)
    assert [c.index for c in batch.choices] == [0, 1, 2]
    for prompt, choice in zip(prompts, batch.choices, strict=True):
        alone = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, seed=11, extra_body=IDS).choices[0]
        assert (choice.text, choice.token_ids) == (alone.text, alone.token_ids)


def test_token_id_prompts(client, tokenizer, word_token_ids):
    ids = tokenizer.encode("a blue house")
    single = client.completions.create(model=MODEL, prompt=ids, max_tokens=5, seed=3, extra_body=IDS)
    assert single.choices[0].token_ids == expected(word_token_ids, tokenizer, ids, 3, max_tokens=5)
    double = client.completions.create(model=MODEL, prompt=[ids, ids[:2]], max_tokens=5, seed=3, extra_body=IDS)
    assert double.choices[0].token_ids == single.choices[0].token_ids
    assert double.choices[1].token_ids == expected(word_token_ids, tokenizer, ids[:2], 3, max_tokens=5)
    assert double.usage.prompt_tokens == len(ids) + 2


def test_streaming_equals_non_streaming_for_every_prompt(client):
    kwargs = dict(model=MODEL, prompt=["light and sound", "water reads"], max_tokens=12, seed=5, logprobs=2,
                  extra_body=IDS)
    full = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    for choice in full.choices:
        parts = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert "".join(p.text for p in parts) == choice.text
        assert [t for p in parts for t in p.token_ids] == choice.token_ids
        assert [t for p in parts for t in p.logprobs.tokens] == choice.logprobs.tokens
        assert [o for p in parts for o in p.logprobs.text_offset] == choice.logprobs.text_offset
        assert parts[-1].finish_reason == choice.finish_reason == "length"
    assert all(c.seed == 5 and c.system_fingerprint == full.system_fingerprint for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24


def test_completion_logprobs_shape(client):
    response = client.completions.create(model=MODEL, prompt="the answer", max_tokens=4, seed=1, logprobs=3)
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 4
    assert "".join(logprobs.tokens) == response.choices[0].text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(4)]
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert top[token] == logprob and 3 <= len(top) <= 4


def test_chat_completion_and_its_stream(client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why is the river blue"}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, seed=9, logprobs=True,
                                          top_logprobs=2, extra_body=IDS)
    choice = full.choices[0]
    assert full.id.startswith("chatcmpl-") and choice.message.role == "assistant"
    assert len(choice.token_ids) == 8 and choice.finish_reason == "length"
    entry = choice.logprobs.content[0]
    assert len(choice.logprobs.content) == 8 and len(entry.top_logprobs) == 2
    assert entry.bytes == list(entry.token.encode())
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, seed=9,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.object == "chat.completion.chunk" and c.seed == 9 for c in chunks)


def test_chat_content_parts_render_like_a_string(client):
    as_parts = [{"role": "user", "content": [{"type": "text", "text": "the dog"}, {"type": "text", "text": "ran"}]}]
    as_text = [{"role": "user", "content": "the dog\nran"}]
    first = client.chat.completions.create(model=MODEL, messages=as_parts, max_tokens=4, seed=2, extra_body=IDS)
    second = client.chat.completions.create(model=MODEL, messages=as_text, max_tokens=4, seed=2, extra_body=IDS)
    assert first.choices[0].token_ids == second.choices[0].token_ids
    assert first.usage.prompt_tokens == second.usage.prompt_tokens


def test_request_id_is_echoed_and_seeds_the_request(client):
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="morning light", max_tokens=6,
                                                      extra_headers={"X-Request-Id": "req-abc"}, extra_body=IDS)
    response = raw.parse()
    derived = seed_from_request_id("req-abc", 0)
    assert raw.headers["X-Request-Id"] == "req-abc" and response.id == "cmpl-req-abc"
    assert int(raw.headers["X-CoRun-Seed"]) == response.seed == derived
    with_seed = client.completions.create(model=MODEL, prompt="morning light", max_tokens=6, seed=derived,
                                          extra_body=IDS)
    assert with_seed.choices[0].token_ids == response.choices[0].token_ids


def test_a_generated_request_id_also_derives_the_seed(client):
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="night", max_tokens=2)
    request_id = raw.headers["X-Request-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", request_id)
    assert raw.parse().seed == int(raw.headers["X-CoRun-Seed"]) == seed_from_request_id(request_id, 0)


def test_stop_token_ids_end_the_output_with_that_token(client, tokenizer, word_token_ids):
    reference = client.completions.create(model=MODEL, prompt="people city", max_tokens=10, seed=4, extra_body=IDS)
    stop_id = reference.choices[0].token_ids[3]
    stopped = client.completions.create(model=MODEL, prompt="people city", max_tokens=10, seed=4,
                                        extra_body={"stop_token_ids": [stop_id], **IDS})
    cut = reference.choices[0].token_ids.index(stop_id) + 1
    assert stopped.choices[0].token_ids == reference.choices[0].token_ids[:cut]
    assert stopped.choices[0].finish_reason == "stop"


def test_models_lists_the_served_model(client):
    assert [model.id for model in client.models.list()] == [MODEL]


def test_health_and_metrics_list_every_node_without_addresses(router):
    reply = get(router.base_url + "/health")
    assert reply.status == 200 and reply.body["status"] == "ok"
    assert sorted(node["node_id"] for node in reply.body["nodes"]) == [
        "fake-decode-0", "fake-decode-1", "fake-prefill-0", "fake-prefill-1"]
    assert all(node.keys() == {"node_id", "role", "healthy"} and node["healthy"] for node in reply.body["nodes"])
    assert "tcp://" not in str(reply.body)
    assert "tcp://" not in get(router.base_url + "/metrics").body  # NOTE: open too, so no addresses either


def test_the_admin_api_lists_addresses_and_stats(router):
    nodes = get(router.base_url + "/admin/nodes").body["nodes"]
    assert sorted(node["address"] for node in nodes) == sorted(node.address for node in router.nodes)
    assert all(node["stats"]["kv_usage"] == 0.25 for node in nodes)


def test_metrics_export_requests_latencies_and_node_stats(client, router):
    client.completions.create(model=MODEL, prompt="metrics please", max_tokens=3, seed=1)
    text = get(router.base_url + "/metrics").body
    assert 'corun_router_requests_total{endpoint="/v1/completions",status="200"}' in text
    # NOTE: vLLM's names and types for what a request saw
    assert "vllm:time_to_first_token_seconds_bucket" in text and "vllm:inter_token_latency_seconds_count" in text
    assert "vllm:e2e_request_latency_seconds_count" in text
    # NOTE: the fake prefill reports 7 ms in its queue: within vLLM's first request-latency bucket (0.3 s)
    assert re.search(r'vllm:request_queue_time_seconds_bucket\{le="0.3",model_name="corun-tiny"\} [1-9]', text)
    assert "vllm:request_time_per_output_token_seconds_count" in text
    assert "vllm:generation_tokens_total" in text and "vllm:prompt_tokens_total" in text
    assert 'vllm:request_success_total{finished_reason="length",model_name="corun-tiny"}' in text
    assert "vllm:num_requests_running" in text and "vllm:num_requests_waiting" in text
    assert "corun_router_requests_in_flight 0.0" in text
    for node_id, role in [("fake-prefill-0", "prefill"), ("fake-decode-1", "decode")]:
        assert re.search(rf'corun_node_kv_usage\{{[^}}]*node_id="{node_id}"[^}}]*\}} 0.25', text)
        assert re.search(rf'corun_node_num_requests_received\{{[^}}]*role="{role}"', text)
    assert "corun_node_engine" not in text


def test_n_choices_streamed_and_not_are_the_same_and_carry_their_seeds(client):
    messages = [{"role": "user", "content": "three ways"}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=5, seed=4, n=3,
                                          temperature=0.8)
    assert [c.index for c in full.choices] == [0, 1, 2]
    assert [c.model_extra["seed"] for c in full.choices] == [sample_seed(4, i) for i in range(3)]
    streamed: dict[int, str] = {}
    roles = []
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=5, seed=4,
                                                n=3, temperature=0.8, stream=True):
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.index)
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert sorted(roles) == [0, 1, 2]
    assert streamed == {c.index: c.message.content for c in full.choices}
    assert full.usage.completion_tokens == 15
    # NOTE: the inverse: samples with other seeds are other texts
    assert len({c.message.content for c in full.choices}) > 1


def test_chat_length_limits(client):
    messages = [{"role": "user", "content": "count"}]
    limited = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=3, seed=1,
                                             extra_body=IDS)
    assert len(limited.choices[0].token_ids) == 3
    unlimited = client.chat.completions.create(model=MODEL, messages=messages, seed=1)
    assert unlimited.usage.prompt_tokens + unlimited.usage.completion_tokens == 1024
