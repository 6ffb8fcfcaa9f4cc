"""`corun serve`'s control port under hostile clients: idle connections cost no thread and are closed after the
timeout, connections past the cap are turned away at once, the API key is checked before anything else, a bad
Content-Length is a 400, and a legitimate command still runs on the serve loop's thread."""

import http.client
import json
import re
import socket
import threading
import time

import pytest

from launch import scaling
from launch.cluster import ClusterConfig, free_port
from launch.removals import Removals
from launch.restarts import RestartPolicy
from launch.routers import RouterGroup
from launch.scaling import ScaleControl
from wire.config import EngineConfig

API_KEY = "sk-control-test"
TIMEOUT_S = 1.0
MAX_CONNECTIONS = 4
NUM_IDLE = 60
DEADLINE_S = 30.0
"""Generous: a loaded host."""


class FakeCluster:
    """What the serve loop's commands reach: it records the thread that ran them."""

    def __init__(self):
        self.threads: list[str] = []
        self.removals = Removals(timeout_s=1.0, api_key=API_KEY)

    def add_node(self, role: str) -> str:
        self.threads.append(threading.current_thread().name)
        return f"{role}-1"

    def node_address(self, node_id: str) -> str | None:
        return None


def start(api_key: str | None = API_KEY):
    config = ClusterConfig(EngineConfig(model="unused"), admin_port=free_port("127.0.0.1"), api_key=api_key,
                           admin_timeout_s=TIMEOUT_S, admin_max_connections=MAX_CONNECTIONS)
    control, cluster, stop = ScaleControl(config), FakeCluster(), threading.Event()

    def serve_loop():
        while not stop.is_set():
            control.run_pending(cluster)
            time.sleep(0.05)

    threading.Thread(target=serve_loop, name="serve loop", daemon=True).start()
    return config, control, cluster, stop


def request(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE_S)
    try:
        connection.request(method, path, body, headers or {})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed the connection (EOF, or a reset) rather than leaving it open."""
    sock.settimeout(DEADLINE_S)
    try:
        while sock.recv(4096):  # NOTE: a turned-away one gets its 503 first
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def test_idle_connections_cost_no_thread_and_are_closed():
    config, control, cluster, stop = start()
    try:
        before = threading.active_count()
        idle = [socket.create_connection(("127.0.0.1", config.admin_port)) for _ in range(NUM_IDLE)]
        time.sleep(0.5)
        threads = threading.active_count() - before
        print(f"{NUM_IDLE} idle connections: {threads} more threads")
        assert threads <= 1, f"{threads} threads for {NUM_IDLE} idle connections"
        assert all(closed_by_server(sock) for sock in idle)  # NOTE: the turned away at once, the rest reaped
        for sock in idle:
            sock.close()
        auth = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
        assert request(config.admin_port, "POST", "/nodes", b'{"role": "decode"}', auth) == (
            200, {"node_id": "decode-1", "done": "add_node"})
        assert cluster.threads == ["serve loop"]
    finally:
        stop.set()
        control.close()


def test_the_key_is_checked_first_and_bad_requests_get_an_answer():
    config, control, cluster, stop = start()
    try:
        status, body = request(config.admin_port, "POST", "/nodes", b'{"role": "decode"}')
        assert status == 401 and "API key is required" in body["error"]
        status, body = request(config.admin_port, "POST", "/nodes", None,
                               {"Authorization": f"Bearer {API_KEY}", "Content-Length": "abc"})
        assert status == 400 and "Content-Length" in body["error"]
        status, body = request(config.admin_port, "GET", "/nodes/decode-0", None,
                               {"Authorization": f"Bearer {API_KEY}"})
        assert status == 404 and "no node 'decode-0'" in body["error"]
        assert cluster.threads == []
    finally:
        stop.set()
        control.close()


def test_an_added_node_serves_once_every_router_has_it_answering(monkeypatch):
    """RouterGroup.node_state, what GET /nodes/ID says of an added node (`corun scale add` waits for serving)."""
    group = RouterGroup(ClusterConfig(EngineConfig(model="unused"), num_routers=2), None, RestartPolicy())
    node = {"address": "tcp://10.0.0.5:7000", "healthy": True, "given_up": False}
    listings = {url: [node] for url in group.admin_urls}
    monkeypatch.setattr(scaling, "router_admin", lambda url, method, api_key=None: {"nodes": listings[url]})
    assert group.node_state(node["address"]) == "serving"
    first, second = group.admin_urls
    listings[second] = [{**node, "healthy": False}]  # NOTE: one router has not had its Pong yet
    assert group.node_state(node["address"]) == "starting"
    listings[second] = []  # NOTE: or has not listed it yet
    assert group.node_state(node["address"]) == "starting"
    listings[first] = [{**node, "healthy": False, "given_up": True}]
    assert group.node_state(node["address"]) == "given_up"


class ScriptedRouters:
    """RouterGroup.node_state's answers, one per call: a state, or an exception to raise."""

    def __init__(self, answers: list):
        self.answers = answers

    def node_state(self, address: str) -> str:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.mark.parametrize("answers, outcome", [
    ([OSError("router restarting"), "starting", "serving"], None),
    (["starting", "given_up"], "decode-1 was started but is given_up"),
    ([OSError("router gone")], "did not answer within 0.5 s (its state could not be read: router gone)"),
])
def test_corun_scale_add_waits_through_unreadable_states_until_serving_or_refused(answers, outcome):
    from cli.scale import wait_until_serving

    config, control, cluster, stop = start()
    cluster.routers = ScriptedRouters(answers)
    cluster.node_address = lambda node_id: "tcp://127.0.0.1:9" if node_id == "decode-1" else None
    try:
        url, headers = f"http://127.0.0.1:{config.admin_port}", {"Authorization": f"Bearer {API_KEY}"}
        if outcome is None:
            wait_until_serving(url, headers, "decode-1", timeout_s=DEADLINE_S)
        else:
            with pytest.raises(ValueError, match=re.escape(outcome)):
                wait_until_serving(url, headers, "decode-1", timeout_s=0.5)
    finally:
        stop.set()
        control.close()
