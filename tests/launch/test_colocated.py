"""`corun serve --colocated K`: nodes that prefill and decode in one process, behind the router, alone or beside a
P/D pool (CPU, float32). Their outputs are the colocated engine's and the P/D cluster's, bitwise: alone and among
concurrent requests, n samples, prompt logprobs; a lost colocated node's requests finish on the P/D path with the
same bits.
"""

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

from launch.cluster import ClusterConfig
from tests.conftest import varied_prompts
from tests.launch.cluster_client import (
    client,
    colocated_records,
    complete,
    complete_all_concurrently,
    engine_config,
    node_stats,
    start_cluster,
)
from wire.seeding import sample_seed

PARAMS = {"temperature": 0.7, "seed": 11, "max_tokens": 12, "logprobs": 3}
PROMPTS = varied_prompts(24, seed=5)


@pytest.fixture(scope="module")
def colocated_only(tiny_model_dir):
    cluster = start_cluster(tiny_model_dir, num_prefill=0, num_decode=0, num_colocated=1)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def mixed(tiny_model_dir):
    """1P1D beside one colocated node; pinning on, so each path can be asked for."""
    cluster = start_cluster(tiny_model_dir, num_prefill=1, num_decode=1, num_colocated=1, enable_node_pinning=True)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return colocated_records(tiny_model_dir, PROMPTS, PARAMS)


def test_a_colocated_node_serves_the_engine_s_bits_alone_and_among_concurrent_requests(colocated_only, engine):
    api = client(colocated_only)
    together = complete_all_concurrently(api, PROMPTS, PARAMS)
    for i, (got, want) in enumerate(zip(together, engine, strict=True)):
        assert got == want, f"prompt {i}: the colocated node differs from the engine among concurrent requests"
    assert complete(api, PROMPTS[3], PARAMS) == engine[3]  # NOTE: the needle, alone
    assert complete(api, PROMPTS[3], PARAMS, stream=True) == engine[3]
    assert complete(api, PROMPTS[3], {**PARAMS, "seed": 12}) != engine[3], \
        "inverse: another seed gives other bits, so the comparison can fail"
    stats = node_stats(colocated_only)["colocated-0"]
    assert stats["num_decoded_rows"] > stats["num_decode_steps"]  # NOTE: the requests really shared decode steps


def test_the_p_d_path_and_the_colocated_path_give_the_same_bits(mixed, engine):
    api = client(mixed)
    for i in (0, 7):
        via_pd = complete(api, PROMPTS[i], PARAMS, headers={"X-CoRun-Prefill-Node": "prefill-0"})
        via_colocated = complete(api, PROMPTS[i], PARAMS, headers={"X-CoRun-Decode-Node": "colocated-0"})
        assert via_pd == via_colocated == engine[i]
    before = node_stats(mixed)
    together = complete_all_concurrently(api, PROMPTS, PARAMS)
    assert together == engine
    after = node_stats(mixed)
    for node in ("decode-0", "colocated-0"):  # NOTE: the router chose both paths for 24 concurrent requests
        assert after[node]["num_finished"] > before[node]["num_finished"], f"{node} served none of them"


def post(cluster, body: dict, headers: dict | None = None) -> dict:
    request = urllib.request.Request(f"{cluster.url}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_n_samples_and_prompt_logprobs_are_those_of_the_p_d_path(mixed):
    body = {"model": "corun-tiny", "prompt": PROMPTS[2], "max_tokens": 6, "temperature": 0.9, "seed": 5, "n": 3,
            "logprobs": 2, "echo": True, "ignore_eos": True, "return_token_ids": True}
    via_colocated = post(mixed, body, {"X-CoRun-Decode-Node": "colocated-0"})
    via_pd = post(mixed, body, {"X-CoRun-Prefill-Node": "prefill-0"})
    assert via_colocated["choices"] == via_pd["choices"]
    assert via_colocated["choices"][0]["logprobs"]["token_logprobs"][1] is not None  # NOTE: the prompt's own
    single = post(mixed, {**body, "n": 1, "seed": sample_seed(5, 2)}, {"X-CoRun-Decode-Node": "colocated-0"})
    assert single["choices"][0]["token_ids"] == via_colocated["choices"][2]["token_ids"]
    assert via_colocated["choices"][1]["token_ids"] != via_colocated["choices"][2]["token_ids"]  # NOTE: inverse


def test_a_lost_colocated_node_s_requests_finish_on_the_p_d_path_with_the_same_bits(mixed, engine):
    long_params = {**PARAMS, "max_tokens": 200}
    expected = complete(client(mixed), PROMPTS[5], long_params, headers={"X-CoRun-Prefill-Node": "prefill-0"})
    results = []

    def stream_to_colocated():  # NOTE: unpinned: with nothing else running the router picks the colocated node
        results.append(complete(client(mixed), PROMPTS[5], long_params, stream=True))

    worker = threading.Thread(target=stream_to_colocated)
    worker.start()
    wait_for_running(mixed, "colocated-0")
    process = dict(mixed.processes)["colocated-0"]
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)
    worker.join(120)
    assert results == [expected]


def wait_for_running(cluster, node: str) -> None:
    deadline = time.monotonic() + 30
    while node_stats(cluster)[node]["num_running"] == 0:
        assert time.monotonic() < deadline, f"{node} never ran the request"
        time.sleep(0.05)


def test_a_cluster_needs_both_p_and_d_or_colocated_nodes(tiny_model_dir):
    engine_settings = engine_config(tiny_model_dir)
    with pytest.raises(ValueError, match="come together"):
        ClusterConfig(engine_settings, num_prefill=0, num_decode=1)
    with pytest.raises(ValueError, match="or a colocated one"):
        ClusterConfig(engine_settings, num_prefill=0, num_decode=0)
    assert ClusterConfig(engine_settings, num_prefill=0, num_decode=0, num_colocated=2).nodes() == [
        ("colocated", 0), ("colocated", 1)]


def test_a_request_a_colocated_node_cannot_hold_is_a_400_and_it_keeps_serving(colocated_only, engine):
    body = {"model": "corun-tiny", "prompt": PROMPTS[0], "max_tokens": 4, "n": 40, "best_of": 40}
    with pytest.raises(urllib.error.HTTPError) as refused:
        post(colocated_only, body)
    assert refused.value.code == 400 and "at most 32" in json.loads(refused.value.read())["error"]["message"]
    assert complete(client(colocated_only), PROMPTS[3], PARAMS) == engine[3]
