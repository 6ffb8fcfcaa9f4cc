"""The prefix cache through the cluster (issue 25; CPU, float32): a prompt gives the cold engine's bits cold, warm
(after others with its prefix), on another prefill node, on a colocated node and after POST /reset_prefix_cache;
usage.prompt_tokens_details.cached_tokens says what was served from a cache; vLLM's prefix cache counters count it;
no KV block stays held once the requests end. And SGLang's radix-cache determinism check through HTTP: 64 random
token ids, 100 tokens, the prefix cached and after a reset: one unique sample.
"""

import json
import random
import urllib.request

import pytest

from corun import LLM, SamplingParams
from launch.local import LocalCluster, LocalClusterConfig, free_port
from tests.launch.cluster_client import (
    MAX_MODEL_LEN,
    N,
    api_step,
    client,
    completion_record,
    engine_config,
    node_stats,
    reset_prefix_cache,
    wait_for_stats,
)

# NOTE: not marked numerics: the cluster runs the engine's kernels, whose chunk-boundary bits
# tests/corun/test_prefix_cache.py checks under the other CPU capability too; this module adds routing, nodes and
# resets, which rounding does not change

CHUNK = 16
PARAMS = {"temperature": 0.7, "seed": 11, "max_tokens": 10, "logprobs": 3}
rng = random.Random(25)
SHARED = [rng.randrange(100, 2000) for _ in range(50)]
PROMPTS = [SHARED + [rng.randrange(100, 2000) for _ in range(rng.randint(1, 40))] for _ in range(4)]


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    config = LocalClusterConfig(engine_config(tiny_model_dir, prefill_chunk_size=CHUNK), served_model_name="corun-tiny",
                                num_prefill=2, num_decode=1,
                                num_colocated=1, enable_node_pinning=True, enable_prompt_tokens_details=True,
                                port=free_port("127.0.0.1"))
    cluster = LocalCluster(config).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def cold(tiny_model_dir):
    """Each prompt on the colocated engine with the cache off (the nodes' settings, one CPU thread)."""
    llm = LLM(tiny_model_dir, max_num_seqs=N, max_model_len=MAX_MODEL_LEN, prefill_chunk_size=CHUNK, num_threads=1,
              enable_prefix_caching=False)
    records = []
    for prompt in PROMPTS:
        [out] = llm.generate([prompt], SamplingParams(**PARAMS, ignore_eos=True))
        records.append((out.outputs[0].token_ids,
                        [api_step(llm.tokenizer, lp, PARAMS["logprobs"]) for lp in out.outputs[0].logprobs]))
    return records


def complete_ids(api, prompt: list[int], node: str, params: dict = PARAMS, **extra):
    """(token ids, per step (logprob, sorted top)), cached prompt tokens, the choice; node: the prefill node to
    pin, or colocated-0."""
    header = "X-CoRun-Decode-Node" if node.startswith("colocated") else "X-CoRun-Prefill-Node"
    response = api.completions.create(model="corun-tiny", prompt=prompt, max_tokens=params["max_tokens"],
                                      temperature=params["temperature"], seed=params["seed"],
                                      logprobs=params["logprobs"],
                                      extra_body={"ignore_eos": True, "return_token_ids": True, **extra},
                                      extra_headers={header: node})
    choice = response.choices[0]
    details = response.usage.prompt_tokens_details
    cached = 0 if details is None else details.cached_tokens
    return completion_record(choice.model_extra["token_ids"], choice.logprobs), cached, choice


def assert_nothing_held(cluster) -> None:
    """Once the decode node read the leases, every prefill and colocated block is free or an unheld cached one."""
    stats = wait_for_stats(cluster, lambda s: all(s[n]["num_leased"] == 0 for n in ("prefill-0", "prefill-1")))
    for node in ("prefill-0", "prefill-1", "colocated-0", "decode-0"):
        assert stats[node]["kv_cache_usage_perc"] == 0, f"{node} still holds KV blocks: {stats[node]}"


def test_cold_warm_other_node_colocated_and_after_reset_are_bitwise_cold(cluster, cold):
    api = client(cluster)
    got, cached, _ = complete_ids(api, PROMPTS[0], "prefill-0")
    assert got == cold[0] and cached == 0
    for i in (1, 2, 3):  # NOTE: warm: the 48 tokens of the shared prefix's whole chunks come from prefill-0's cache
        got, cached, _ = complete_ids(api, PROMPTS[i], "prefill-0")
        assert got == cold[i] and cached == 48, f"prompt {i} warm"
    got, cached, _ = complete_ids(api, PROMPTS[2], "prefill-1")  # NOTE: another prefill node: cold there
    assert got == cold[2] and cached == 0
    got, cached, _ = complete_ids(api, PROMPTS[3], "prefill-1")
    assert got == cold[3] and cached == 48
    for i, expected_cached in ((1, 0), (1, CHUNK * ((len(PROMPTS[1]) - 1) // CHUNK))):
        got, cached, _ = complete_ids(api, PROMPTS[i], "colocated-0")
        assert got == cold[i] and cached == expected_cached, "colocated"
    freed = reset_prefix_cache(cluster)["nodes"]
    assert set(freed) == {"prefill-0", "prefill-1", "colocated-0"} and all(n > 0 for n in freed.values())
    for i, node in ((0, "prefill-0"), (3, "colocated-0")):
        got, cached, _ = complete_ids(api, PROMPTS[i], node)
        assert got == cold[i] and cached == 0, f"prompt {i} after the reset on {node}"
    assert_nothing_held(cluster)


def test_prompt_logprobs_are_served_with_their_chunks_and_the_counters_count_tokens(cluster, cold):
    api = client(cluster)
    complete_ids(api, PROMPTS[1], "prefill-0")
    before = node_stats(cluster)["prefill-0"]
    # NOTE: the chunks cached without prompt logprobs serve none to a request asking them: it computes them (and
    # leaves them with the chunks), the next one asking the same is served them
    got, cached, choice = complete_ids(api, PROMPTS[1], "prefill-0", prompt_logprobs=2)
    assert got == cold[1] and cached == 0 and len(choice.model_extra["prompt_logprobs"]) == len(PROMPTS[1])
    got_again, cached_again, choice_again = complete_ids(api, PROMPTS[1], "prefill-0", prompt_logprobs=2)
    assert got_again == cold[1] and cached_again > 0
    assert choice_again.model_extra["prompt_logprobs"] == choice.model_extra["prompt_logprobs"]
    after = node_stats(cluster)["prefill-0"]
    # NOTE: vLLM's counts, in prompt tokens
    assert after["prefix_cache_queries"] - before["prefix_cache_queries"] == 2 * len(PROMPTS[1])
    assert after["prefix_cache_hits"] - before["prefix_cache_hits"] == cached_again
    with urllib.request.urlopen(f"{cluster.url}/metrics", timeout=30) as response:
        metrics = response.read().decode()
    hits = [line for line in metrics.splitlines() if line.startswith("vllm:prefix_cache_hits_total")]
    assert hits and float(hits[0].split()[-1]) > 0
    assert 'enable_prefix_caching="True"' in metrics
    assert_nothing_held(cluster)


def test_sglang_radix_cache_check_one_unique_sample(cluster):
    """SGLang's test_deterministic radix-cache check: 64 random token ids, 100 tokens sampled; then the same
    request with its prefix cached (by itself, and by a longer prompt resending it with the output, as a chat turn
    does), and after a cache reset: every sample identical."""
    api = client(cluster)
    prompt = [random.Random(64).randrange(100, 2000) for _ in range(64)]
    params = {"temperature": 1.0, "seed": 1234, "max_tokens": 100, "logprobs": 1}
    samples, cached_counts = [], []
    for node in ("prefill-0", "prefill-0", "colocated-0", "colocated-0"):
        record, cached, _ = complete_ids(api, prompt, node, params)
        samples.append(record)
        cached_counts.append(cached)
        complete_ids(api, prompt + record[0], node, {**params, "max_tokens": 4})  # NOTE: the next chat turn
    reset_prefix_cache(cluster)
    for node in ("prefill-0", "colocated-0"):
        record, cached, _ = complete_ids(api, prompt, node, params)
        samples.append(record)
        cached_counts.append(cached)
    assert len({json.dumps(s) for s in samples}) == 1
    assert cached_counts == [0, 48, 0, 48, 0, 0]
    assert_nothing_held(cluster)
