"""What lm-eval's loglikelihood tasks send through the cluster (echo with logprobs, max_tokens 0), and vLLM's
prompt_logprobs: the prompt's logprobs from its isolated prefill node, bitwise those of the colocated engine,
alone or among concurrent requests."""

import concurrent.futures
import json
import urllib.error
import urllib.request

import pytest

from corun import LLM, SamplingParams
from tests.conftest import varied_prompts
from tests.launch.cluster_client import CHUNK, MAX_MODEL_LEN, N, start_cluster

PROMPTS = varied_prompts(6, seed=11, max_words=80)  # NOTE: some longer than a chunk


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    cluster = start_cluster(tiny_model_dir, 1, 1)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def colocated(tiny_model_dir):
    """Each prompt's token ids and prompt logprobs on the colocated engine with the nodes' settings."""
    llm = LLM(tiny_model_dir, max_num_seqs=N, max_model_len=MAX_MODEL_LEN, prefill_chunk_size=CHUNK, num_threads=1)
    outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1))
    return [(o.prompt_token_ids, o.prompt_logprobs) for o in outputs]


def post(cluster, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{cluster.url}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def loglikelihood(cluster, prompt: str, **fields) -> dict:
    """lm-eval's request (fields: more of them)."""
    status, body = post(cluster, {"model": "corun-tiny", "prompt": prompt, "echo": True, "logprobs": 1,
                                  "max_tokens": 0, "temperature": 0.0, **fields})
    assert status == 200, body
    return body


def test_echo_with_max_tokens_0_returns_the_prompt_and_its_logprobs(cluster, colocated):
    for prompt, (ids, expected) in zip(PROMPTS, colocated, strict=True):
        body = loglikelihood(cluster, prompt)
        choice = body["choices"][0]
        assert choice["text"] == prompt and choice["token_ids"] is None and body["usage"]["completion_tokens"] == 0
        assert loglikelihood(cluster, prompt, return_token_ids=True)["choices"][0]["token_ids"] == []
        logprobs = choice["logprobs"]
        assert len(logprobs["tokens"]) == len(ids) and logprobs["token_logprobs"][0] is None
        assert logprobs["top_logprobs"][0] is None and logprobs["text_offset"][0] == 0
        assert logprobs["token_logprobs"][1:] == [lp.logprob for lp in expected[1:]]  # NOTE: bitwise


def test_the_same_alone_and_among_concurrent_requests(cluster):
    alone = [loglikelihood(cluster, prompt)["choices"][0]["logprobs"] for prompt in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS) * 2) as pool:
        together = list(pool.map(lambda p: loglikelihood(cluster, p)["choices"][0]["logprobs"], PROMPTS * 2))
    assert together == alone * 2


def test_vllm_s_prompt_logprobs_field_leaves_the_completion_as_it_was(cluster):
    base = {"model": "corun-tiny", "prompt": PROMPTS[1], "max_tokens": 5, "temperature": 0.7, "seed": 3,
            "ignore_eos": True, "return_token_ids": True}
    _, plain = post(cluster, base)
    _, asked = post(cluster, {**base, "prompt_logprobs": 2})
    choice = asked["choices"][0]
    assert choice["token_ids"] == plain["choices"][0]["token_ids"] and choice["text"] == plain["choices"][0]["text"]
    entries = choice["prompt_logprobs"]
    assert entries[0] is None and all(2 <= len(entry) <= 3 for entry in entries[1:])
    assert plain["choices"][0]["prompt_logprobs"] is None  # NOTE: vLLM sends the key, null


def test_a_streamed_echo_opens_with_the_prompt(cluster):
    body = {"model": "corun-tiny", "prompt": PROMPTS[0], "echo": True, "max_tokens": 3, "stream": True,
            "ignore_eos": True, "seed": 1}
    request = urllib.request.Request(f"{cluster.url}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        events = [json.loads(line[6:]) for line in response.read().decode().split("\n\n")
                  if line.startswith("data: {")]
    text = "".join(choice["text"] for event in events for choice in event["choices"])
    assert events[0]["choices"][0]["text"].startswith(PROMPTS[0]) and len(text) > len(PROMPTS[0])


def test_max_tokens_0_without_echo_is_a_400(cluster):
    status, body = post(cluster, {"model": "corun-tiny", "prompt": "hi", "max_tokens": 0})
    assert status == 400 and "'max_tokens' must be an integer >= 1" in body["error"]["message"]


def test_the_openai_client_sends_echo_and_the_new_fields(cluster, colocated):
    from tests.launch.cluster_client import client

    api = client(cluster)
    echoed = api.completions.create(model="corun-tiny", prompt=PROMPTS[2], echo=True, logprobs=1, max_tokens=0,
                                    temperature=0.0)
    choice = echoed.choices[0]
    assert choice.text == PROMPTS[2] and choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.token_logprobs[1:] == [lp.logprob for lp in colocated[2][1][1:]]
    named = api.completions.create(model="corun-tiny", prompt=PROMPTS[2], max_tokens=3, logprobs=1, seed=2,
                                   extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True,
                                               "return_token_ids": True, "unknown_field": 1})
    assert named.choices[0].logprobs.tokens == [f"token_id:{t}" for t in named.choices[0].model_extra["token_ids"]]
    assert named.choices[0].model_extra["stop_reason"] is None
