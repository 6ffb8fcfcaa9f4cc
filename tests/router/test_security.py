"""Nobody unauthorized gets in, no test hook is on by default, /health tells no internals, and no single request
(a huge prompt, a huge or trickled body, trickled headers, invalid text) stalls, crashes or holds the router."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import pytest

from router.__main__ import parse_config
from router.api.errors import RequestError
from router.api.offload import Offload
from router.app import LINGER_S
from tests.router.harness import RouterHarness, get, http_request, post
from tests.router.test_errors import VALID, assert_error
from wire.protocol import DecodeRequest, PrefillRequest

pytestmark = pytest.mark.timeout(60)
KEY = "sk-corun-test-key"
CHAT = {"model": "corun-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
PROTECTED = [("POST", "/v1/completions", VALID), ("POST", "/v1/chat/completions", CHAT), ("GET", "/v1/models", None),
             ("POST", "/tokenize", {"prompt": "the cat"}), ("POST", "/detokenize", {"tokens": [5, 6]}),
             ("GET", "/admin/nodes", None), ("POST", "/admin/nodes/drain", {"address": "tcp://127.0.0.1:1"})]


def call(router, method: str, path: str, body=None, **kwargs):
    return asyncio.run(http_request(method, router.base_url + path, body, **kwargs))


@pytest.fixture(scope="module")
def keyed(tiny_model_dir, word_token_ids):
    with RouterHarness(tiny_model_dir, word_token_ids, api_key=KEY) as harness:
        harness.wait_until_healthy()
        yield harness


@pytest.mark.parametrize("method, path, body", PROTECTED)
def test_with_an_api_key_every_api_but_the_probes_needs_it(keyed, method, path, body):
    for authorization in (None, "Bearer wrong-key", KEY, f"Basic {KEY}", f"Bearer {KEY}x", "Bearer \u00e9"):
        headers = {} if authorization is None else {"Authorization": authorization}
        reply = call(keyed, method, path, body, headers=headers)
        assert_error(reply, 401, "API key")
        assert reply.headers["WWW-Authenticate"] == "Bearer"
    reply = call(keyed, method, path, body, headers={"Authorization": f"bearer {KEY}"})
    assert reply.status in (200, 404), reply.body  # NOTE: 404: the drain of a node that does not exist


def test_with_an_api_key_health_version_and_metrics_stay_open(keyed):
    assert call(keyed, *PROTECTED[0]).status == 401  # NOTE: its own refusal, so the count below holds run alone
    for path in ("/health", "/version", "/metrics"):
        assert get(keyed.base_url + path).status == 200, path
    assert 'status="401"' in get(keyed.base_url + "/metrics").body  # NOTE: refusals are counted too
    assert get(keyed.base_url + "/no/such/route").status == 401  # NOTE: what is not named open needs the key


def test_the_api_key_comes_from_the_flag_else_vllm_s_environment_variable(monkeypatch, tiny_model_dir):
    argv = ["--model", tiny_model_dir, "--prefill-address", "tcp://127.0.0.1:1", "--decode-address",
            "tcp://127.0.0.1:2"]
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert parse_config(argv).api_key is None
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert parse_config(argv).api_key == "from-env"
    assert parse_config([*argv, "--api-key", "from-flag"]).api_key == "from-flag"
    assert "from-flag" not in repr(parse_config([*argv, "--api-key", "from-flag"]))  # NOTE: never in a log line
    monkeypatch.setenv("VLLM_API_KEY", "")
    assert parse_config(argv).api_key is None  # NOTE: as vLLM: an empty variable is no key
    for bad in ("", "has space", "caf\u00e9"):
        with pytest.raises(ValueError, match="API key"):
            parse_config([*argv, "--api-key", bad])


@pytest.fixture(scope="module")
def pinning(tiny_model_dir, word_token_ids):
    with RouterHarness(tiny_model_dir, word_token_ids, enable_node_pinning=True) as harness:
        harness.wait_until_healthy()
        yield harness


def sent_to(nodes, request_id: str) -> list[str]:
    """The nodes that received a prefill or decode request of this HTTP request."""
    return [node.node_id for node in nodes
            if any(rid.startswith(request_id) for rid in [*node.request_ids(PrefillRequest),
                                                          *node.request_ids(DecodeRequest)])]


@pytest.mark.parametrize("headers", [{"X-CoRun-Prefill-Node": "fake-prefill-0"},
                                     {"X-CoRun-Decode-Node": "fake-decode-1"}])
def test_pinning_headers_are_a_400_unless_the_router_enables_them(router, headers):
    reply = post(router.base_url + "/v1/completions", VALID, headers={**headers, "X-Request-Id": "pin-off"})
    assert_error(reply, 400, *headers, "--enable-node-pinning")
    assert sent_to(router.nodes, "pin-off") == []


def test_a_pinned_request_runs_on_the_nodes_it_names(pinning):
    headers = {"X-CoRun-Prefill-Node": "fake-prefill-1", "X-CoRun-Decode-Node": pinning.decode_nodes[1].address,
               "X-Request-Id": "pinned-1"}
    reply = post(pinning.base_url + "/v1/completions", {**VALID, "max_tokens": 4}, headers=headers)
    assert reply.status == 200, reply.body
    assert sent_to(pinning.nodes, "pinned-1") == ["fake-prefill-1", "fake-decode-1"]


@pytest.mark.parametrize("headers, named", [
    ({"X-CoRun-Prefill-Node": "fake-prefill-9"}, "no prefill node 'fake-prefill-9'"),
    ({"X-CoRun-Decode-Node": "fake-decode-9"}, "no decode node 'fake-decode-9'"),
    ({"X-CoRun-Prefill-Node": "fake-prefill-0", "X-CoRun-Decode-Node": "fake-prefill-1"}, "no decode node"),
    ({"X-CoRun-Decode-Node": ""}, "X-CoRun-Decode-Node is empty"),
])
def test_an_unknown_pin_is_a_400_before_any_node_sees_the_request(pinning, headers, named):
    """Issue 12: an unknown decode pin was refused only after the prefill ran (and its KV stayed leased)."""
    request_id = f"bad-pin-{abs(hash(json.dumps(headers)))}"
    reply = post(pinning.base_url + "/v1/completions", VALID, headers={**headers, "X-Request-Id": request_id})
    assert_error(reply, 400, named)
    assert sent_to(pinning.nodes, request_id) == []


@pytest.fixture(scope="module")
def limited(tiny_model_dir, word_token_ids):
    with RouterHarness(tiny_model_dir, word_token_ids, max_request_bytes=4096, header_timeout_s=0.5,
                       body_timeout_s=0.5) as harness:
        harness.wait_until_healthy()
        yield harness


def body_of_size(size: int) -> bytes:
    body = json.dumps({**VALID, "prompt": ""}).encode()
    return body.replace(b'"prompt": ""', b'"prompt": "' + b"a" * (size - len(body)) + b'"')


def test_a_body_over_the_limit_is_a_413_with_a_json_message(limited):
    url = limited.base_url + "/v1/completions"
    assert_error(post(url, raw=body_of_size(4097)), 413, "larger than 4096 bytes", "--max-request-bytes")

    async def chunks():  # NOTE: chunked: no Content-Length to refuse it by, so the read itself stops at the limit
        for _ in range(5):
            yield b" " * 1000
    assert_error(post(url, raw=chunks()), 413, "larger than 4096 bytes")
    assert len(body_of_size(4096)) == 4096 and post(url, raw=body_of_size(4096)).status != 413
    assert post(url, VALID).status == 200  # NOTE: and the router keeps serving


def raw_connection(router) -> socket.socket:
    address = urlsplit(router.base_url)
    connection = socket.create_connection((address.hostname, address.port), timeout=5)
    connection.settimeout(0.05)
    return connection


def trickle_until_closed(connection: socket.socket, piece: bytes, limit_s: float) -> tuple[float | None, bytes]:
    """Send piece every 0.1 s until the router closes the connection: (seconds until then, or None if it never
    did within limit_s; everything the router sent)."""
    start, received = time.monotonic(), b""
    while time.monotonic() - start < limit_s:
        try:
            connection.sendall(piece)
            data = connection.recv(65536)
            if not data:
                return time.monotonic() - start, received
            received += data
        except TimeoutError:
            pass
        except OSError:  # NOTE: a reset: closed too
            return time.monotonic() - start, received
        time.sleep(0.1)
    return None, received


def test_a_connection_trickling_its_headers_is_closed_after_header_timeout_s(limited):
    with raw_connection(limited) as connection:
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: router\r\n")
        closed_after, received = trickle_until_closed(connection, b"X-Slow: 1\r\n", limit_s=5.0)
    assert closed_after is not None and closed_after < 0.5 + 1.0 and received == b""


def test_a_trickled_body_gets_a_408_and_its_connection_is_closed(limited):
    with raw_connection(limited) as connection:
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 4000\r\n\r\n{")
        closed_after, received = trickle_until_closed(connection, b" ", limit_s=10.0)
    assert received.startswith(b"HTTP/1.1 408 ") and b"did not arrive within 0.5 s" in received
    assert closed_after is not None and closed_after < 0.5 + LINGER_S + 1.0


def test_oversized_headers_are_a_400(router):
    assert get(router.base_url + "/health", headers={"X-Big": "x" * 9000}).status == 400
    assert get(router.base_url + "/health", headers={f"X-H{i}": "1" for i in range(200)}).status == 400
    assert get(router.base_url + "/health").status == 200


@pytest.mark.parametrize("path, raw, param", [
    ("/v1/completions", r'{"prompt": "\ud800abc"}', "prompt"),
    ("/v1/completions", r'{"prompt": ["fine", "\udfffx"]}', "prompt"),
    ("/v1/completions", r'{"prompt": "fine", "stop": "\ud800"}', "stop"),
    ("/v1/completions", r'{"prompt": "fine", "stop": ["ok", "x\udbff"]}', "stop"),
    ("/v1/chat/completions", r'{"messages": [{"role": "user", "content": "\ud800"}]}', "messages"),
    ("/v1/chat/completions", r'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]}',
     "messages"),
    ("/tokenize", r'{"prompt": "\ud800"}', "prompt"),
    ("/tokenize", r'{"messages": [{"role": "user", "content": "a\ud800"}]}', "messages"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field(router, path, raw, param):
    reply = post(router.base_url + path, raw=raw.encode())
    assert_error(reply, 400, "valid Unicode text")
    assert reply.body["error"]["param"] == param


def test_an_escaped_surrogate_pair_is_one_valid_character(router):
    reply = post(router.base_url + "/v1/completions", raw=rb'{"prompt": "\ud83d\ude00 the cat", "max_tokens": 2}')
    assert reply.status == 200, reply.body


def test_unknown_field_names_reach_the_header_escaped_and_counted(router):
    names = {"a\nb": 1, "\ud800": 2, **{f"extra{i:02}": i for i in range(25)}}
    reply = post(router.base_url + "/v1/completions", {**VALID, **names})
    assert reply.status == 200, reply.body
    shown = reply.headers["X-CoRun-Ignored-Fields"].split(", ")
    assert shown[:2] == ["a\\nb", "extra00"] and shown[-1] == "and 7 more" and len(shown) == 21


def unique_text(num_bytes: int) -> str:
    """Text the tokenizer's cache cannot shortcut: every word different."""
    words = "the river reads morning light because seven people ran quickly under green houses".split()
    return " ".join(f"{words[i % len(words)]}{i}" for i in range(num_bytes // 8))[:num_bytes]


def test_health_answers_at_once_while_a_long_prompt_is_tokenized(long_context):
    """Issue 12: a 20 MB prompt blocked the event loop (and /health) ~8 s. Here a 3 MB one: its tokenization
    alone holds the GIL for seconds, so on the loop or in a thread of the router's process /health waits as long;
    in a worker process it answers at once."""
    router = long_context
    results = {}

    def send_long_prompt():
        started = time.monotonic()
        results["reply"] = post(router.base_url + "/v1/completions", {**VALID, "prompt": unique_text(3 * 2**20)})
        results["seconds"] = time.monotonic() - started

    sender = threading.Thread(target=send_long_prompt)
    sender.start()
    latencies = []
    while sender.is_alive():
        started = time.monotonic()
        assert get(router.base_url + "/health").status == 200
        latencies.append(time.monotonic() - started)
        time.sleep(0.02)
    sender.join()
    assert_error(results["reply"], 400, "maximum context length")  # NOTE: a RequestError back from the worker
    assert results["seconds"] > 1.0, "the prompt tokenized too fast for this test to show anything"
    # NOTE: relative, not in ms: a probe behind a blocked loop waits about the whole tokenization, while a loaded
    # host slows both alike
    assert max(latencies) < results["seconds"] / 4, \
        f"/health took up to {max(latencies):.3f} s ({len(latencies)} probes) of {results['seconds']:.3f} s"


def test_a_large_body_parses_in_a_worker_to_exactly_what_a_small_one_gives(router):
    body = {**VALID, "prompt": list(range(10, 400)), "logprobs": 2, "stop": ["zz"]}
    small = json.dumps(body).encode()
    padded = small[:-1] + b" " * (64 * 2**10) + b"}"  # NOTE: JSON whitespace: over LARGE_BODY_BYTES, same request
    replies = [post(router.base_url + "/v1/completions", raw=raw) for raw in (small, padded)]
    assert [reply.status for reply in replies] == [200, 200], replies
    assert replies[0].body["choices"] == replies[1].body["choices"]


def exit_worker(tokenizer, body: bytes) -> None:
    os._exit(3)  # NOTE: a worker killed mid-parse (out of memory, a signal)


def echo_length(tokenizer, body: bytes) -> int:
    return len(body)


def worker_pid(tokenizer, body: bytes) -> int:
    return os.getpid()


def test_a_dead_parser_process_is_a_503_and_the_next_large_body_gets_a_fresh_one(tiny_model_dir, tokenizer):
    async def scenario():
        offload = Offload(tiny_model_dir, tokenizer, parse_timeout_s=60.0)
        try:
            large = b" " * (64 * 2**10)
            with pytest.raises(RequestError) as died:
                await offload.run(exit_worker, large)
            assert died.value.status == 503 and "died" in died.value.message
            assert await offload.run(echo_length, large) == len(large)
        finally:
            offload.close()

    asyncio.run(scenario())


ROUTER_STAND_IN = """
import asyncio, sys
from wire.tokenizer import load_tokenizer
from router.api.offload import Offload
from tests.router.test_security import worker_pid

async def main():
    offload = Offload(sys.argv[1], load_tokenizer(sys.argv[1]), 60.0)
    print(await offload.run(worker_pid, b" " * 2**16), flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_parser_processes_exit_when_the_router_is_killed(tiny_model_dir):
    """SIGKILL skips close(): the workers notice they are orphaned and leave (else they would wait forever)."""
    router = subprocess.Popen([sys.executable, "-c", ROUTER_STAND_IN, tiny_model_dir], stdout=subprocess.PIPE,
                              text=True, cwd=os.getcwd())
    try:
        pid = int(router.stdout.readline())
        assert is_running(pid)
    finally:
        router.kill()
        router.wait(10)
    deadline = time.monotonic() + 5
    try:
        while is_running(pid):
            assert time.monotonic() < deadline, f"parser process {pid} outlived its router"
            time.sleep(0.1)
    finally:
        if is_running(pid):
            os.kill(pid, signal.SIGKILL)  # NOTE: the test failed: leave no orphan behind
