"""Issue 24's request fields through a cluster (1P1D beside a colocated node, HTTP): allowed_token_ids, bad_words,
int64 seeds and truncation give the colocated engine's bits on the P/D and the colocated path, alone and among
concurrent requests (each with an inverse); HumanEval's 5 stop strings; the agent message pattern with the openai
client."""

import concurrent.futures
import json
import urllib.request

import pytest

from corun import LLM, SamplingParams
from tests.conftest import varied_prompts
from tests.launch.cluster_client import CHUNK, MAX_MODEL_LEN, N, client, start_cluster

PROMPTS = varied_prompts(3, seed=31, max_words=40)
BASE = {"model": "corun-tiny", "max_tokens": 8, "temperature": 0.9, "logprobs": 2, "ignore_eos": True,
        "return_token_ids": True}
PATHS = ({"X-CoRun-Prefill-Node": "prefill-0", "X-CoRun-Decode-Node": "decode-0"},
         {"X-CoRun-Decode-Node": "colocated-0"})


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    cluster = start_cluster(tiny_model_dir, num_prefill=1, num_decode=1, num_colocated=1, enable_node_pinning=True)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir, max_num_seqs=N, max_model_len=MAX_MODEL_LEN, prefill_chunk_size=CHUNK, num_threads=1)


def post(cluster, path: str, body: dict, headers: dict | None = None) -> dict:
    request = urllib.request.Request(f"{cluster.url}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def record(choice) -> tuple:
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def engine_record(llm, prompt_ids, seed, **controls) -> tuple:
    params = SamplingParams(temperature=0.9, seed=seed, max_tokens=8, logprobs=2, ignore_eos=True, **controls)
    output = llm.generate(list(prompt_ids), params)[0].outputs[0]
    return list(output.token_ids), [lp.logprob for lp in output.logprobs]


def test_token_controls_and_negative_seeds_are_the_engine_s_bits_on_both_paths(cluster, llm):
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    bad = llm.tokenizer.encode(" the")[0]
    cases = [({"allowed_token_ids": list(range(100, 300)), "seed": -12}, {"allowed_token_ids": range(100, 300)}, -12),
             ({"bad_words": [" the", "and"], "seed": 9}, None, 9),
             ({"seed": -2**63}, {}, -2**63)]
    for fields, controls, seed in cases:
        for i, prompt in enumerate(PROMPTS[:2]):
            got = [record(post(cluster, "/v1/completions", {**BASE, "prompt": prompt, **fields}, h)["choices"][0])
                   for h in PATHS]
            assert got[0] == got[1], f"{fields}: the P/D and the colocated path differ"
            if controls is not None:
                want = engine_record(llm, ids[i], seed, **{k: tuple(v) for k, v in controls.items()})
                assert got[0] == want
            if "bad_words" in fields:
                assert bad not in got[0][0]
    # NOTE: the inverse: each control (and the sign of a seed) changes the tokens of the same prompt
    plain = record(post(cluster, "/v1/completions", {**BASE, "prompt": PROMPTS[0], "seed": 12})["choices"][0])
    for fields, _, _ in cases[:1] + [({"seed": -12}, None, None)]:
        other = record(post(cluster, "/v1/completions", {**BASE, "prompt": PROMPTS[0], "seed": 12, **fields})[
            "choices"][0])
        assert other[0] != plain[0]


def test_token_controls_are_the_same_among_concurrent_requests(cluster):
    bodies = [{**BASE, "prompt": p, "seed": s, "allowed_token_ids": list(range(50, 400)), "bad_words": ["a"]}
              for p in PROMPTS for s in (-1 - 2**40, 3)]
    alone = [record(post(cluster, "/v1/completions", b)["choices"][0]) for b in bodies]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        together = list(pool.map(lambda b: record(post(cluster, "/v1/completions", b)["choices"][0]), bodies * 2))
    assert together == alone * 2
    assert len({tuple(r[0]) for r in alone}) == len(alone)  # NOTE: the inverse: the records are not all one


def test_truncation_keeps_the_prompt_s_last_or_first_tokens(cluster, llm):
    ids = llm.tokenizer.encode(PROMPTS[2])
    body = {**BASE, "prompt": PROMPTS[2], "seed": 4, "truncate_prompt_tokens": 5, "return_token_ids": True}
    left = post(cluster, "/v1/completions", body)["choices"][0]
    right = post(cluster, "/v1/completions", {**body, "truncation_side": "right"})["choices"][0]
    assert left["prompt_token_ids"] == ids[-5:] and right["prompt_token_ids"] == ids[:5]
    assert record(left) == engine_record(llm, ids[-5:], 4)
    assert record(left) != record(right)  # NOTE: the inverse


def test_humaneval_s_five_stop_strings_end_the_completion(cluster):
    stops = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]
    plain = post(cluster, "/v1/completions", {**BASE, "prompt": PROMPTS[0], "seed": 3, "max_tokens": 40})
    text = plain["choices"][0]["text"]
    body = {**BASE, "prompt": PROMPTS[0], "seed": 3, "max_tokens": 40, "stop": stops + [text[5:8]]}
    with pytest.raises(urllib.error.HTTPError):  # NOTE: HumanEval's 5 plus one is fine; 129 is not
        post(cluster, "/v1/completions", {**body, "stop": ["x"] * 129})
    stopped = post(cluster, "/v1/completions", body)["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == text[5:8]
    assert text.startswith(stopped["text"]) and len(stopped["text"]) < len(text)


def test_the_agent_message_pattern_with_the_openai_client(cluster):
    api = client(cluster)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "name a river"}]
    first = api.chat.completions.create(model="corun-tiny", messages=messages, max_tokens=6, seed=1)
    messages.append(first.choices[0].message.model_dump())  # NOTE: refusal, annotations, tool_calls, ...: null
    messages.append({"role": "user", "content": "another"})
    second = api.chat.completions.create(model="corun-tiny", messages=messages, max_tokens=6, seed=1)
    assert second.choices[0].message.content is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens
    assert first.prompt_logprobs is None and first.prompt_token_ids is None  # NOTE: vLLM's keys, null


def test_chat_prompt_logprobs_are_the_completion_s_for_the_same_prompt_on_both_paths(cluster):
    messages = [{"role": "user", "content": PROMPTS[1]}]
    chat = {"model": "corun-tiny", "messages": messages, "max_tokens": 4, "seed": 2, "prompt_logprobs": 2,
            "return_token_ids": True}
    replies = [post(cluster, "/v1/chat/completions", chat, h) for h in PATHS]
    assert replies[0]["prompt_logprobs"] == replies[1]["prompt_logprobs"]
    ids = replies[0]["prompt_token_ids"]
    assert len(replies[0]["prompt_logprobs"]) == len(ids) and replies[0]["prompt_logprobs"][0] is None
    completion = post(cluster, "/v1/completions", {"model": "corun-tiny", "prompt": ids, "max_tokens": 4, "seed": 2,
                                                   "prompt_logprobs": 2})["choices"][0]
    assert completion["prompt_logprobs"] == replies[0]["prompt_logprobs"]
    assert [next(iter(entry)) for entry in replies[0]["prompt_logprobs"][1:]] == [str(t) for t in ids[1:]]
    # NOTE: the inverse: another prompt has other logprobs
    other = post(cluster, "/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": PROMPTS[2]}]})
    assert other["prompt_logprobs"] != replies[0]["prompt_logprobs"]
    assert post(cluster, "/v1/chat/completions", {**chat, "prompt_logprobs": None})["prompt_logprobs"] is None


def test_logprob_token_ids_are_the_engine_s_on_both_paths(cluster, llm):
    chosen = [5, 700, 42]
    body = {**BASE, "prompt": PROMPTS[0], "seed": 6, "logprobs": 1, "logprob_token_ids": chosen,
            "return_tokens_as_token_ids": True}
    replies = [post(cluster, "/v1/completions", body, h)["choices"][0] for h in PATHS]
    assert replies[0]["logprobs"] == replies[1]["logprobs"]
    params = SamplingParams(temperature=0.9, seed=6, max_tokens=8, logprobs=3, logprob_token_ids=tuple(chosen),
                            ignore_eos=True)
    expected = llm.generate(list(llm.tokenizer.encode(PROMPTS[0])), params)[0].outputs[0]
    for top, lp in zip(replies[0]["logprobs"]["top_logprobs"], expected.logprobs, strict=True):
        named = {f"token_id:{t}": v for t, v in lp.top}
        assert list(named) == [f"token_id:{t}" for t in chosen]
        assert {k: top[k] for k in named} == named


def test_bad_words_are_the_engine_s_on_both_paths_and_change_the_output(cluster, llm):
    from router.api.openai_api import bad_words_token_ids

    body = {**BASE, "prompt": PROMPTS[1], "seed": 9}
    plain = record(post(cluster, "/v1/completions", body)["choices"][0])
    word = llm.tokenizer.decode([plain[0][2]])  # NOTE: the plain output's third token, as a word
    got = [record(post(cluster, "/v1/completions", {**body, "bad_words": [word]}, h)["choices"][0]) for h in PATHS]
    assert got[0] == got[1]
    sequences = bad_words_token_ids([word], llm.tokenizer)
    assert got[0] == engine_record(llm, llm.tokenizer.encode(PROMPTS[1]), 9, bad_words_token_ids=sequences)
    assert got[0][0] != plain[0]  # NOTE: the inverse: the ban acted
    assert not {seq[0] for seq in sequences if len(seq) == 1} & set(got[0][0])
