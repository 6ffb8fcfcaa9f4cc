"""Scaling a running cluster: a node added at run time takes requests; a node removed is drained first (no new
requests; what it holds finishes, its KV leases read) and then stopped; nothing is lost and every output stays
what it was. Local launcher, `corun scale` against `corun serve`, and Ray with two nodes on one host."""

import concurrent.futures
import os
import subprocess
import sys
import time

import pytest
import ray

from launch import scaling
from launch.cluster import ClusterConfig, free_port
from launch.local import LocalCluster
from launch.ray_cluster import RayCluster, RayClusterConfig
from tests.conftest import varied_prompts
from tests.launch.cluster_client import child_pids, client, complete, engine_config, node_stats, wait_for_line

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


def wait_until_healthy(api_url: str, api_key: str | None = None, timeout_s: float = 60) -> None:
    """Until every node of the router's pool answers (an added node takes requests from then on)."""
    deadline = time.monotonic() + timeout_s
    while not all(n["healthy"] for n in scaling.router_admin(api_url, "GET", api_key=api_key)["nodes"]):
        assert time.monotonic() < deadline, "the added node never answered"
        time.sleep(0.1)


def start_1p1d(tiny_model_dir) -> LocalCluster:
    return LocalCluster(ClusterConfig(engine_config(tiny_model_dir), port=free_port("127.0.0.1"))).start()


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
    wait_until_healthy(local_cluster.url)
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
                              "--port", str(port), "--admin-port", str(admin)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=with_key)
    control = f"http://127.0.0.1:{admin}"

    def scale(*argv, env=with_key) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cli.main", "scale", "--control", control, *argv],
                              capture_output=True, text=True, timeout=120, env=env)

    try:
        wait_for_line(serve, "CoRun cluster ready", timeout_s=120)
        without_key = {name: value for name, value in os.environ.items() if name != "VLLM_API_KEY"}
        unauthorized = scale("add", "decode", env=without_key)
        assert unauthorized.returncode == 2 and "API key is required" in unauthorized.stderr
        added = scale("add", "decode")
        assert added.returncode == 0 and added.stdout.strip() == "decode-1 added"
        # NOTE: an added node takes requests once it answers (LocalCluster.add_node), which `corun scale` does not
        # wait for: removing the only node that answers before then would leave no decode node serving
        wait_until_healthy(f"http://127.0.0.1:{port}", API_KEY)
        removed = scale("remove", "decode-0")
        assert removed.returncode == 0 and removed.stdout.strip() == "decode-0 removed"
        refused = scale("remove", "decode-1")
        assert refused.returncode == 2 and "last decode node" in refused.stderr
        api_url = f"http://127.0.0.1:{port}"
        with pytest.raises(ValueError, match="API key is required"):
            scaling.router_admin(api_url, "GET")
        nodes = scaling.router_admin(api_url, "GET", api_key=API_KEY)["nodes"]
        assert [n["node_id"] for n in nodes if n["role"] == "decode"] == ["decode-1"]
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
        config = RayClusterConfig(ClusterConfig(engine_config(tiny_model_dir), port=free_port("127.0.0.1")),
                                  address=hosts.address)
        cluster = RayCluster(config).start()
        before = outputs(cluster, PROMPTS[:6])
        assert cluster.add_node("decode") == "decode-1"
        wait_until_healthy(cluster.url)
        during = outputs(cluster, PROMPTS[:6], while_running=lambda: cluster.remove_node("decode-0"))
        assert during == before
        assert roles_in_pool(cluster) == [("decode", "decode-1"), ("prefill", "prefill-0")]
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
