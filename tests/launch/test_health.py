"""/health answers whether the cluster can serve: a node the launcher gave up on leaves it "degraded" (200) while
the others serve, "unavailable" (503) once no node of a role serves, and 200 again once `add_node` restored the
capacity; /admin/nodes names the given-up nodes."""

import json
import os
import signal
import time
import urllib.error
import urllib.request

from launch import scaling
from launch.local import LocalCluster, LocalClusterConfig, free_port
from tests.launch.cluster_client import client, complete, engine_config

DEADLINE_S = 60.0
"""Generous (a loaded 2-core host)."""
PARAMS = {"temperature": 0.5, "seed": 11, "max_tokens": 8, "logprobs": 1}


def health(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def kill_until_given_up(cluster: LocalCluster, node_id: str) -> None:
    """SIGKILL the node, then tend the cluster as `corun serve` does until every router lists it as given up."""
    [process] = [p for name, p in cluster.processes if name == node_id]
    os.kill(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + DEADLINE_S
    while not given_up(cluster, node_id):
        assert time.monotonic() < deadline, f"{node_id} not given up within {DEADLINE_S} s"
        cluster.restart_dead_nodes()
        time.sleep(0.2)


def given_up(cluster: LocalCluster, node_id: str) -> bool:
    address = cluster.node_addresses[node_id]
    return any(n["address"] == address and n["given_up"] for n in scaling.router_admin(cluster.url, "GET")["nodes"])


def wait_for_health(url: str, status: str) -> dict:
    deadline = time.monotonic() + DEADLINE_S
    while (reply := health(url))[1]["status"] != status:
        assert time.monotonic() < deadline, f"/health never said {status!r}: {reply}"
        time.sleep(0.2)
    return reply


def test_a_given_up_node_leaves_health_degraded_while_the_cluster_serves(tiny_model_dir):
    config = LocalClusterConfig(engine_config(tiny_model_dir), served_model_name="corun-tiny",
                                num_decode=2, port=free_port("127.0.0.1"))
    cluster = LocalCluster(config).start()
    # NOTE: every death counts as a failure to start, and the first is the last: the launcher gives up at once
    cluster.restarts.quick_exit_s, cluster.restarts.max_quick_exits = float("inf"), 1
    api = client(cluster)
    try:
        assert health(cluster.url) == (200, wait_for_health(cluster.url, "ok")[1])
        kill_until_given_up(cluster, "decode-1")
        code, body = wait_for_health(cluster.url, "degraded")
        assert code == 200
        assert [n["healthy"] for n in body["nodes"] if n["role"] == "decode"] == [True, False]
        assert complete(api, "still serving", PARAMS)
        kill_until_given_up(cluster, "decode-0")
        assert wait_for_health(cluster.url, "unavailable")[0] == 503  # NOTE: no decode node serves
        cluster.add_node("decode")
        assert wait_for_health(cluster.url, "degraded")[0] == 200  # NOTE: capacity back; two nodes given up
        assert complete(api, "capacity restored", PARAMS)
        nodes = scaling.router_admin(cluster.url, "GET")["nodes"]
        assert sorted((n["node_id"], n["given_up"]) for n in nodes if n["role"] == "decode") == [
            ("decode-0", True), ("decode-1", True), ("decode-2", False)]
    finally:
        cluster.stop()
