"""Scaling a running cluster: a node added at run time takes requests; a node removed is drained first (no new
requests; what it holds finishes, its KV leases read) and then stopped; nothing is lost and every output stays
what it was. Local launcher, `corun scale` against `corun serve`, and Ray with two nodes on one host."""

import concurrent.futures
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
import ray

from launch import scaling
from launch.cluster import ClusterConfig, free_port
from launch.local import LocalCluster
from launch.ray_cluster import RayCluster, RayClusterConfig
from tests.conftest import varied_prompts
from tests.launch.cluster_client import (
    NODE_START_DEADLINE_S,
    child_pids,
    client,
    complete,
    engine_config,
    node_stats,
    wait_for_line,
)
from wire.auth import bearer_headers

PARAMS = {"temperature": 0.7, "seed": 9, "max_tokens": 24, "logprobs": 2}
PROMPTS = varied_prompts(12, seed=3, max_words=60)
API_KEY = "sk-scale-test"


def outputs(cluster, prompts=PROMPTS, while_running=None) -> list:
    """Every prompt's (token ids, logprobs) streamed concurrently; while_running() runs meanwhile."""
    api = client(cluster)
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(complete, api, prompt, PARAMS, None, True) for prompt in prompts]
        if while_running is not None:
            time.sleep(0.3)  # NOTE: the streams are under way
            while_running()
        return [future.result(timeout=120) for future in futures]


def roles_in_pool(cluster) -> list[tuple[str, str]]:
    return sorted((n["role"], n["node_id"]) for n in scaling.router_admin(cluster.url, "GET")["nodes"])


def wait_until_healthy(api_url: str, api_key: str | None = None, timeout_s: float = NODE_START_DEADLINE_S) -> None:
    """Until every node of the router's pool answers (an added node takes requests from then on)."""
    deadline = time.monotonic() + timeout_s
    while not all(n["healthy"] for n in scaling.router_admin(api_url, "GET", api_key=api_key)["nodes"]):
        assert time.monotonic() < deadline, "the added node never answered"
        time.sleep(0.1)


def control_state(control_url: str, node_id: str) -> str:
    """corun serve's control port: GET /nodes/ID's state."""
    request = urllib.request.Request(f"{control_url}/nodes/{node_id}", headers=bearer_headers(API_KEY))
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["state"]


def answering(api_url: str, node_id: str) -> bool:
    """Whether the router lists node_id answering (a node that has not answered yet has no id in the listing)."""
    nodes = scaling.router_admin(api_url, "GET", api_key=API_KEY)["nodes"]
    return any(n["node_id"] == node_id and n["healthy"] for n in nodes)


def wait_until_serving(cluster, node_id: str, timeout_s: float = NODE_START_DEADLINE_S) -> None:
    """Until the launcher says the node serves (what `corun scale add` waits for: GET /nodes/ID)."""
    deadline = time.monotonic() + timeout_s
    while (state := scaling.node_state(cluster, node_id)) != (200, {"node_id": node_id, "state": "serving",
                                                                    "message": ""}):
        assert state[1]["state"] == "starting" and time.monotonic() < deadline, state
        time.sleep(0.1)


def start_1p1d(tiny_model_dir) -> LocalCluster:
    return LocalCluster(ClusterConfig(engine_config(tiny_model_dir), served_model_name="corun-tiny",
                                      port=free_port("127.0.0.1"))).start()


@pytest.fixture
def local_cluster(tiny_model_dir):
    """A 1P1D cluster of the test's own: the test scales it."""
    cluster = start_1p1d(tiny_model_dir)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def unscaled_cluster(tiny_model_dir):
    """A 1P1D cluster the tests of refusals share: each checks that what it asked left the pool as it was."""
    cluster = start_1p1d(tiny_model_dir)
    yield cluster
    cluster.stop()


def test_an_added_decode_node_takes_requests_and_outputs_stay_the_same(local_cluster):
    before = outputs(local_cluster)
    assert local_cluster.add_node("decode") == "decode-1"
    wait_until_serving(local_cluster, "decode-1")
    after = outputs(local_cluster)
    assert after == before
    assert node_stats(local_cluster)["decode-1"]["num_finished"] > 0  # NOTE: it really served some


def test_removing_nodes_drains_them_while_they_stream_and_loses_nothing(local_cluster):
    before = outputs(local_cluster)
    local_cluster.add_node("decode")
    local_cluster.add_node("prefill")
    wait_until_healthy(local_cluster.url)
    during = outputs(local_cluster, while_running=lambda: (local_cluster.remove_node("decode-0"),
                                                           local_cluster.remove_node("prefill-0")))
    assert during == before  # NOTE: every stream finished, bitwise, though its nodes were removed under it
    assert roles_in_pool(local_cluster) == [("decode", "decode-1"), ("prefill", "prefill-1")]
    assert {name for name, _ in local_cluster.processes} == {"decode-1", "prefill-1"}
    assert all(process.poll() is None for process in local_cluster.routers.processes.values())
    assert outputs(local_cluster, PROMPTS[:3]) == before[:3]


def test_the_last_node_of_a_role_cannot_be_drained(unscaled_cluster):
    with pytest.raises(ValueError, match="last decode node that takes requests"):
        unscaled_cluster.remove_node("decode-0")
    with pytest.raises(ValueError, match="no running node 'decode-7'"):
        unscaled_cluster.remove_node("decode-7")
    assert outputs(unscaled_cluster, PROMPTS[:2])  # NOTE: the refused drain left it serving
    assert roles_in_pool(unscaled_cluster) == [("decode", "decode-0"), ("prefill", "prefill-0")]


def test_corun_scale_adds_and_removes_nodes_of_corun_serve(tiny_model_dir):
    """With an API key from the environment (as vLLM's VLLM_API_KEY): the control port and the router's admin API
    need it, the launcher's own admin calls send it, and no process shows it on its command line."""
    port, admin = free_port("127.0.0.1"), free_port("127.0.0.1")
    with_key = {**os.environ, "VLLM_API_KEY": API_KEY}
    serve = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--model", tiny_model_dir,
                              "--max-num-seqs", "8", "--max-model-len", "512", "--kv-cache-mib", "32",
                              "--port", str(port), "--admin-port", str(admin), "--served-model-name", "corun-tiny"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=with_key)
    control = f"http://127.0.0.1:{admin}"

    def scale(*argv, env=with_key) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cli.main", "scale", "--control", control, *argv],
                              capture_output=True, text=True, timeout=120, env=env)

    try:
        wait_for_line(serve, "CoRun cluster ready", timeout_s=NODE_START_DEADLINE_S)
        without_key = {name: value for name, value in os.environ.items() if name != "VLLM_API_KEY"}
        unauthorized = scale("add", "decode", env=without_key)
        assert unauthorized.returncode == 2 and "API key is required" in unauthorized.stderr
        api_url = f"http://127.0.0.1:{port}"
        # NOTE: the inverse of the wait below: a node takes requests only once it answers, seconds after its start
        # (it loads torch and the model), and --no-wait returns before that
        started = scale("add", "decode", "--no-wait")
        assert started.returncode == 0 and started.stdout.strip() == "decode-1 started"
        assert control_state(control, "decode-1") == "starting"
        assert not answering(api_url, "decode-1")
        added = scale("add", "decode")
        assert added.returncode == 0 and added.stdout.strip() == "decode-2 added"
        assert control_state(control, "decode-2") == "serving" and answering(api_url, "decode-2")
        wait_until_healthy(api_url, API_KEY)
        for node_id in ("decode-0", "decode-1"):
            removed = scale("remove", node_id)
            assert removed.returncode == 0 and removed.stdout.strip() == f"{node_id} removed"
        refused = scale("remove", "decode-2")
        assert refused.returncode == 2 and "last decode node" in refused.stderr
        with pytest.raises(ValueError, match="API key is required"):
            scaling.router_admin(api_url, "GET")
        nodes = scaling.router_admin(api_url, "GET", api_key=API_KEY)["nodes"]
        assert [n["node_id"] for n in nodes if n["role"] == "decode"] == ["decode-2"]
        for pid in [serve.pid, *child_pids(serve.pid)]:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                assert API_KEY.encode() not in cmdline.read()
    finally:
        serve.terminate()
        serve.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # NOTE: one Ray cluster on the host at a time
def test_ray_with_two_nodes_on_one_host_scales_out_and_in(tiny_model_dir):
    from ray.cluster_utils import Cluster

    hosts = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    hosts.add_node(num_cpus=2)
    cluster = None
    try:
        config = RayClusterConfig(ClusterConfig(engine_config(tiny_model_dir), served_model_name="corun-tiny",
                                               port=free_port("127.0.0.1")),
                                  address=hosts.address)
        cluster = RayCluster(config).start()
        before = outputs(cluster, PROMPTS[:6])
        assert cluster.add_node("decode") == "decode-1"
        wait_until_serving(cluster, "decode-1")
        during = outputs(cluster, PROMPTS[:6], while_running=lambda: cluster.remove_node("decode-0"))
        assert during == before
        assert roles_in_pool(cluster) == [("decode", "decode-1"), ("prefill", "prefill-0")]
        assert scaling.node_state(cluster, "decode-0")[1]["state"] == "removed"
        assert len({node.placement_group is None for node in cluster.nodes}) == 2  # NOTE: decode-1 has its own
    finally:
        if cluster is not None:
            cluster.stop()
        if ray.is_initialized():
            ray.shutdown()
        hosts.shutdown()


def test_the_admin_api_refuses_what_it_cannot_do_with_a_clear_message(unscaled_cluster):
    url, decode = unscaled_cluster.url, unscaled_cluster.node_addresses["decode-0"]
    cases = [("POST", {"role": "router", "address": "tcp://127.0.0.1:1"},
              "role must be one of prefill, decode, colocated"),
             ("POST", {"role": "decode", "address": "127.0.0.1:1"}, "address must be tcp://HOST:PORT"),
             ("POST", {"role": "decode", "address": decode}, "already a node of this pool"),
             ("DRAIN", {"address": "tcp://127.0.0.1:1"}, "no node at"),
             ("DELETE", {"address": decode}, "is not drained yet"),
             ("POST", {"role": "decode"}, "the body must be a JSON object with role, address")]
    for method, body, message in cases:
        with pytest.raises(ValueError, match=message):
            scaling.router_admin(url, method, body)
    assert roles_in_pool(unscaled_cluster) == [("decode", "decode-0"), ("prefill", "prefill-0")]
