"""`corun serve --routers 2`: two full routers on one port (SO_REUSEPORT) in front of 1P1D (CPU, float32).

Both take connections and serve the colocated engine's bits; the port's /metrics sums both; a pool change reaches
both (through the launcher, never one router's public /admin); a killed router leaves the other serving and is
started again.
"""

import json
import os
import signal
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.api.handlers import node_request_id
from tests.conftest import varied_prompts
from tests.launch.cluster_client import (
    client,
    colocated_records,
    complete,
    complete_all_concurrently,
    start_cluster,
)
from wire.config import RouterConfig

PARAMS = {"temperature": 0.8, "seed": 7, "max_tokens": 12, "logprobs": 3}
PROMPTS = varied_prompts(24, seed=3)


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    cluster = start_cluster(tiny_model_dir, num_prefill=1, num_decode=1, num_routers=2)
    yield cluster
    cluster.stop()


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def samples(url: str, name: str) -> list:
    """The samples of a series in the /metrics at url."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == name]


def metric(url: str, name: str) -> float:
    return sum(sample.value for sample in samples(url, name))


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_two_routers_serve_the_colocated_engine_s_bits_and_both_take_connections(cluster, tiny_model_dir):
    served = complete_all_concurrently(client(cluster), PROMPTS, PARAMS)
    expected = colocated_records(tiny_model_dir, PROMPTS, PARAMS)
    for i, (got, want) in enumerate(zip(served, expected, strict=True)):
        assert got == want, f"prompt {i}: two routers serve other bits than the colocated engine"
    other_seed = complete(client(cluster), PROMPTS[0], {**PARAMS, "seed": 8})
    assert other_seed != served[0], "inverse: another seed gives other bits, so the comparison can fail"
    own = [metric(url, "vllm:generation_tokens_total") for url in cluster.routers.admin_urls]
    assert all(tokens > 0 for tokens in own), f"a router took no connection of 24 concurrent requests: {own}"


def test_the_port_s_metrics_sum_every_router_s_series(cluster):
    complete(client(cluster), PROMPTS[1], PARAMS)
    time.sleep(0.6)  # NOTE: each router writes its CPU time for the others every 0.5 s
    own = [metric(url, "vllm:generation_tokens_total") for url in cluster.routers.admin_urls]
    assert metric(cluster.url, "vllm:generation_tokens_total") == sum(own)
    cpu = {sample.labels.get("pid", ""): sample.value
           for sample in samples(cluster.url, "corun_router_process_cpu_seconds")}
    assert len(cpu) >= 2 and all(value > 0 for value in cpu.values()), f"one CPU series per router: {cpu}"


def test_a_pool_change_reaches_every_router_and_never_one_router_s_public_admin(cluster):
    status, body = get_json(f"{cluster.url}/admin/nodes")
    assert status == 409 and "corun scale" in body["error"]["message"]
    node_id = cluster.add_node("decode")
    try:
        def every_router_lists(wanted: int) -> bool:
            return all(len(get_json(f"{url}/admin/nodes")[1]["nodes"]) == wanted for url in cluster.routers.admin_urls)
        assert every_router_lists(3)
        wait_until(cluster.healthy, 120, "the added decode node to answer every router")
    finally:
        cluster.remove_node(node_id)
    assert every_router_lists(2)


def test_a_killed_router_leaves_the_other_serving_and_is_started_again(cluster):
    victim = cluster.routers.processes["router-0"]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(10)
    api = client(cluster)
    expected = complete(api, PROMPTS[2], PARAMS)
    for _ in range(8):  # NOTE: each on a fresh connection (a new client), which only the survivor can take
        assert complete(client(cluster), PROMPTS[2], PARAMS) == expected
    def restarted() -> bool:
        cluster.restart_dead_nodes()  # NOTE: what `corun serve`'s loop does every half second
        return cluster.routers.num_restarts >= 1
    # NOTE: on a slow host the kill can come within RestartPolicy.quick_exit_s of the start: a backoff wait first
    wait_until(restarted, 10, "the killed router to be started again")
    assert cluster.routers.num_restarts == 1
    wait_until(cluster.healthy, 60, "the restarted router to be healthy")
    assert complete(client(cluster), PROMPTS[2], PARAMS) == expected


def test_two_routers_never_send_a_node_the_same_request_id():
    """A client's X-Request-Id is unique only per router: the nodes see it behind each router's instance name."""
    config = RouterConfig("m", ("tcp://p:1",), ("tcp://d:1",))
    names = {node_request_id(RouterConfig("m", ("tcp://p:1",), ("tcp://d:1",), instance_name=name), "abc", 0)
             for name in ("r0", "r1")}
    assert len(names) == 2 and node_request_id(config, "abc", 0) == "abc-0"
    with pytest.raises(ValueError, match="instance_name"):
        RouterConfig("m", ("tcp://p:1",), ("tcp://d:1",), instance_name="r0/x")


def test_the_served_name_is_the_model_as_given_unless_one_is_named():
    """As vLLM names it: clients send --model's value (an HF id, a path) unless --served-model-name says otherwise."""
    from launch.cluster import ClusterConfig, router_config
    from wire.config import EngineConfig

    assert RouterConfig("models/tiny", ("tcp://p:1",), ("tcp://d:1",)).served_model_name == "models/tiny"
    assert RouterConfig("m", ("tcp://p:1",), ("tcp://d:1",), served_model_name="x").served_model_name == "x"
    cluster = ClusterConfig(EngineConfig(model="models/tiny"))
    assert router_config(cluster, ["tcp://p:1"], ["tcp://d:1"]).served_model_name == "models/tiny"
    named = ClusterConfig(EngineConfig(model="models/tiny"), served_model_name="qwen")
    assert router_config(named, ["tcp://p:1"], ["tcp://d:1"]).served_model_name == "qwen"


def test_client_limits_with_several_routers_are_warned_of_as_each_router_s_own():
    from launch.cluster import ClusterConfig
    from launch.routers import warn_of_limits_per_router
    from wire.config import EngineConfig

    engine = EngineConfig(model="models/tiny")
    warning = warn_of_limits_per_router(ClusterConfig(engine, num_routers=2, max_client_decode_slots=8))
    assert "--max-client-decode-slots 8 hold in each of the 2 routers" in warning and "up to 2 times" in warning
    # NOTE: inverse: one router, or no limit, is nothing to warn of
    assert warn_of_limits_per_router(ClusterConfig(engine, num_routers=1, max_client_decode_slots=8)) is None
    assert warn_of_limits_per_router(ClusterConfig(engine, num_routers=2)) is None
