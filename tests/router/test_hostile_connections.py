"""Issue 23, finding 8 (the router's part): what a client can make the router log or leak.

- Out of file descriptors, asyncio retried accept() and logged a traceback per retry (59-76 MB in ~40 s): now
  the first with its traceback, then a line per REPEAT_LOG_S at most; and the router serves again once
  descriptors are free.
- A malformed request (`Content-Length: abc`) logged a traceback: now it is a 400 and one warning line.
- A client that hangs up mid-body was logged as an internal error with a traceback.
- Node addresses reached client-facing error bodies: now the node is named by its id, never its address.
"""

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

import pytest

from router.loop_errors import REPEAT_LOG_S, RepeatLimit
from tests.router.fake_nodes import FakeBehaviour
from tests.router.harness import RouterHarness, get, post
from tests.router.test_errors import VALID

pytestmark = pytest.mark.timeout(90)
KEY = "sk-hostile-test"
ACCEPT_FAILED = "socket.accept() out of system resource"

ROUTER_WITH_FEW_DESCRIPTORS = """
import os, resource, sys, time
from tests.router.harness import RouterHarness
from tests.router.fake_nodes import FakeBehaviour
ids = list(range(100, 400))
with RouterHarness(sys.argv[1], ids) as router:
    router.wait_until_healthy()
    num_open = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (num_open + 8, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    print(router.base_url, flush=True)
    time.sleep(3600)
"""


def open_connections(url: str, num: int) -> list[socket.socket]:
    address = urlsplit(url)
    return [socket.create_connection((address.hostname, address.port), timeout=10) for _ in range(num)]


def test_out_of_descriptors_the_router_logs_each_kind_of_accept_failure_once_and_recovers(tiny_model_dir, tmp_path):
    log_path = tmp_path / "router.log"
    with open(log_path, "wb") as log:
        router = subprocess.Popen([sys.executable, "-c", ROUTER_WITH_FEW_DESCRIPTORS, tiny_model_dir],
                                  stdout=subprocess.PIPE, stderr=log, text=True, cwd=os.getcwd())
    try:
        url = router.stdout.readline().strip()
        connections = open_connections(url, 64)  # NOTE: the kernel queues them: the router cannot accept them all
        while ACCEPT_FAILED not in log_path.read_text():  # NOTE: pytest-timeout bounds the wait
            time.sleep(0.05)
        time.sleep(2.0)  # NOTE: ~2 s of retries: asyncio's every 1 s, 128 accepts each
        for connection in connections:
            connection.close()
        assert get(url + "/health").status == 200  # NOTE: it accepts again once descriptors are free
    finally:
        router.send_signal(signal.SIGKILL)
        router.wait(10)
    text = log_path.read_text()
    assert 1 <= text.count(ACCEPT_FAILED) <= 2 and text.count("Traceback") <= 1, text[-3000:]


def test_repeats_of_a_kind_are_counted_not_logged():
    now = [0.0]
    limit = RepeatLimit(clock=lambda: now[0])
    assert limit.admit("a") == 0 and limit.admit("b") == 0
    assert [limit.admit("a") for _ in range(1000)] == [None] * 1000
    now[0] = REPEAT_LOG_S
    assert limit.admit("a") == 1000 and limit.admit("a") is None


@pytest.fixture(scope="module")
def keyed(tiny_model_dir, word_token_ids):
    with RouterHarness(tiny_model_dir, word_token_ids, api_key=KEY) as harness:
        harness.wait_until_healthy()
        yield harness


def send_raw(router, request: bytes, read: bool = True) -> bytes:
    address = urlsplit(router.base_url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as connection:
        connection.sendall(request)
        return connection.recv(4096) if read else b""


@pytest.mark.parametrize("value", [b"abc", b"-5", b"1e3"])
def test_a_malformed_content_length_is_a_400_and_one_line_of_log(keyed, caplog, value):
    caplog.set_level(logging.INFO)
    reply = send_raw(keyed, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                     + b"\r\nContent-Length: " + value + b"\r\n\r\n{}")
    assert reply.split(b"\r\n")[0].split()[1] == b"400"
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []
    assert get(keyed.base_url + "/health").status == 200


def test_a_client_that_hangs_up_mid_body_is_no_internal_error(keyed, caplog):
    caplog.set_level(logging.INFO)
    send_raw(keyed, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
             + b"\r\nContent-Length: 100\r\n\r\n{", read=False)
    deadline = time.monotonic() + 30
    while not any("went away" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        time.sleep(0.05)
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("role, behaviour", [
    ("decode", FakeBehaviour(error=(503, "KV read from tcp://127.0.0.1:7001 (10.1.2.3:7002, node-7.local:7003) "
                                         "failed"))),
    ("decode", FakeBehaviour(silent=True)),
    ("prefill", FakeBehaviour(error=(400, "bad request"))),
])
def test_no_error_body_names_a_node_address(tiny_model_dir, word_token_ids, role, behaviour):
    with RouterHarness(tiny_model_dir, word_token_ids, request_timeout_s=0.3, **{role: behaviour}) as router:
        router.wait_until_healthy()
        for stream in (False, True):
            reply = post(router.base_url + "/v1/completions", {**VALID, "stream": stream})
            text = str(reply.body)
            assert "error" in text and f"{role} node fake-{role}-" in text, text
            for leak in ("tcp://", "127.0.0.1", "10.1.2.3", "node-7.local"):
                assert leak not in text, text


def test_the_admin_api_has_the_router_s_body_timeout(tiny_model_dir, word_token_ids):
    """The router's admin endpoint is its own aiohttp app's route: a trickled admin body gets the 408 every route
    gets (and the header timeout is the site's, router.app.start_site)."""
    with RouterHarness(tiny_model_dir, word_token_ids, api_key=KEY, body_timeout_s=0.5) as router:
        reply = send_raw(router, b"POST /admin/nodes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                         + b"\r\nContent-Length: 100\r\n\r\n{")
        assert reply.split(b"\r\n")[0].split()[1] == b"408"
