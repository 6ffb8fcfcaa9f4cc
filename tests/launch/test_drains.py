"""A drain never holds up `corun serve`: while `corun scale remove` drains a node that still streams, a killed node
is restarted and SIGTERM stops everything, without waiting for the stream; and a drain that times out ends in a
stated state (the node back in service, nothing lost), not draining forever."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from launch import scaling
from launch.local import LocalCluster, LocalClusterConfig, free_port
from tests.launch.cluster_client import (
    NODE_START_DEADLINE_S,
    alive,
    complete,
    descendants,
    engine_config,
    wait_for_line,
)

LONG_TOKENS = 1900
"""A stream that outlasts a node's restart on any host: seconds of decoding at N = 32."""
DEADLINE_S = 120.0
"""Generous (a loaded 2-core host)."""


def node_pids(serve_pid: int, node_id: str) -> list[int]:
    """The running processes of corun serve that are node_id."""
    pids = []
    for pid in alive(descendants(serve_pid)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if node_id.encode() in argv and b"--node-id" in argv:
            pids.append(pid)
    return pids


class LongStream(threading.Thread):
    """One long stream pinned to a node; counts its tokens, notes how it ended."""

    def __init__(self, url: str, decode_node: str):
        super().__init__(daemon=True)
        self.api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=DEADLINE_S, max_retries=0)
        self.decode_node, self.num_tokens, self.ended, self.error = decode_node, 0, threading.Event(), None
        self.hang_up = threading.Event()
        """Set: the client closes the stream at its next chunk (the router then aborts it on the node)."""

    def run(self) -> None:
        try:
            with self.api.completions.create(
                    model="corun-tiny", prompt="the river", max_tokens=LONG_TOKENS, temperature=0.9, seed=5,
                    stream=True, extra_body={"ignore_eos": True, "return_token_ids": True},
                    extra_headers={"X-CoRun-Decode-Node": self.decode_node}) as chunks:
                for chunk in chunks:
                    self.num_tokens += sum(len(c.model_extra.get("token_ids") or []) for c in chunk.choices)
                    if self.hang_up.is_set():
                        break
        except openai.APIError as error:
            self.error = error
        finally:
            self.ended.set()


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {what}"
        time.sleep(0.1)


def removed_when_idle(cluster: LocalCluster, node_id: str) -> bool:
    """Whether a drain of the node ended (False: it timed out and the node is back: the hung-up stream's abort had
    not reached it yet)."""
    try:
        cluster.remove_node(node_id)
    except ValueError as error:
        if "returned to service" not in str(error):
            raise
        return False
    return True


def draining(url: str, node_id: str) -> bool:
    with urllib.request.urlopen(f"{url}/admin/nodes", timeout=10) as response:
        return any(n["node_id"] == node_id and n["draining"] for n in json.loads(response.read())["nodes"])


@pytest.mark.timeout(600)
def test_a_drain_blocks_neither_restarts_nor_sigterm(tiny_model_dir):
    port, admin = free_port("127.0.0.1"), free_port("127.0.0.1")
    serve = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--model", tiny_model_dir, "--prefill", "2",
                              "--decode", "2", "--max-num-seqs", "32", "--max-model-len", "2048", "--kv-cache-mib",
                              "64", "--port", str(port), "--admin-port", str(admin), "--enable-node-pinning",
                              "--served-model-name", "corun-tiny"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    url, remover, started = f"http://127.0.0.1:{port}", None, []
    try:
        wait_for_line(serve, "CoRun cluster ready", timeout_s=NODE_START_DEADLINE_S)
        started = descendants(serve.pid)
        stream = LongStream(url, "decode-0")
        stream.start()
        wait_until(lambda: stream.num_tokens > 0, "the long stream's first tokens")
        remover = subprocess.Popen([sys.executable, "-m", "cli.main", "scale", "--control",
                                    f"http://127.0.0.1:{admin}", "remove", "decode-0"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: draining(url, "decode-0"), "decode-0 draining")
        [victim] = node_pids(serve.pid, "prefill-1")
        os.kill(victim, signal.SIGKILL)  # NOTE: while decode-0 drains: corun serve must restart it meanwhile
        killed_at = time.monotonic()
        wait_until(lambda: [pid for pid in node_pids(serve.pid, "prefill-1") if pid != victim], "prefill-1 restarted")
        restarted_s = time.monotonic() - killed_at
        assert not stream.ended.is_set(), "prefill-1 came back only after the drain ended"
        assert draining(url, "decode-0")
        serve.send_signal(signal.SIGTERM)
        terminated_at = time.monotonic()
        assert serve.wait(timeout=DEADLINE_S) == 0
        stopped_s = time.monotonic() - terminated_at
        stream.ended.wait(DEADLINE_S)
        print(f"during a drain: prefill-1 restarted {restarted_s:.1f} s after its SIGKILL; corun serve stopped "
              f"{stopped_s:.1f} s after SIGTERM, the drained node's stream at {stream.num_tokens} of {LONG_TOKENS} "
              "tokens")
        assert stream.num_tokens < LONG_TOKENS, "SIGTERM waited for the drain to end"
        assert stream.error is not None  # NOTE: cut visibly (an error event or a closed connection), never silently
    finally:
        started += descendants(serve.pid)  # NOTE: restarted nodes too
        for process in (serve, remover):
            if process is not None and process.poll() is None:
                process.kill()
        for pid in alive(started):  # NOTE: whatever this test left running, it ends
            os.kill(pid, signal.SIGKILL)


def test_a_drain_that_times_out_returns_the_node_to_service(tiny_model_dir):
    config = LocalClusterConfig(engine_config(tiny_model_dir, max_model_len=2048), served_model_name="corun-tiny",
                                num_decode=2,
                                port=free_port("127.0.0.1"), enable_node_pinning=True, drain_timeout_s=1.0)
    cluster = LocalCluster(config).start()
    try:
        stream = LongStream(cluster.url, "decode-0")
        stream.start()
        wait_until(lambda: stream.num_tokens > 0, "the long stream's first tokens")
        with pytest.raises(ValueError, match="returned to service"):
            cluster.remove_node("decode-0")
        assert cluster.removals.by_node_id["decode-0"].state == "returned"
        [entry] = [n for n in scaling.router_admin(cluster.url, "GET")["nodes"] if n["node_id"] == "decode-0"]
        assert not entry["draining"] and entry["healthy"]
        api = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="none", timeout=DEADLINE_S, max_retries=0)
        params = {"temperature": 0.5, "seed": 3, "max_tokens": 8, "logprobs": 1}
        assert complete(api, "back in service", params, {"X-CoRun-Decode-Node": "decode-0"})  # NOTE: it serves
        streamed = stream.num_tokens  # NOTE: and the stream it kept goes on; the rest of it proves nothing more
        wait_until(lambda: stream.num_tokens > streamed + 32 or stream.ended.is_set(), "the kept stream's tokens")
        stream.hang_up.set()
        assert stream.ended.wait(DEADLINE_S) and stream.error is None and stream.num_tokens > streamed
        wait_until(lambda: removed_when_idle(cluster, "decode-0"), "the drain of the idle node")
        assert "decode-0" not in cluster.node_addresses
    finally:
        cluster.stop()
