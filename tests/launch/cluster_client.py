"""Helpers for end-to-end tests: start `corun serve`-style clusters and call them with the official client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import zmq

from corun import LLM, SamplingParams
from launch.local import LocalCluster, LocalClusterConfig, free_port
from router.api.responses import json_logprob, token_text
from wire import protocol
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

N = 32
MAX_MODEL_LEN = 512
CHUNK = 64
NODE_START_DEADLINE_S = 300.0
"""How long a test waits for a node or a `corun serve` started by the test (new processes importing torch and loading
the model) to answer: ~10 s on an idle host, past 90 s on a 2-core host under load (a Ray actor on a second Ray host;
`corun serve --launcher ray` past 120 s at stop 60). It only catches a start that never ends; pytest-timeout (600 s)
bounds the test."""


def engine_config(model_dir: str, **scheduler) -> EngineConfig:
    sched = {"max_num_seqs": N, "max_model_len": MAX_MODEL_LEN, "prefill_chunk_size": CHUNK, **scheduler}
    return EngineConfig(model=model_dir, scheduler=SchedulerConfig(**sched),
                        cache=CacheConfig(memory_budget_bytes=64 * 2**20))


def start_cluster(model_dir: str, num_prefill: int, num_decode: int, **settings) -> LocalCluster:
    """settings: more LocalClusterConfig fields (enable_node_pinning, api_key, ...)."""
    config = LocalClusterConfig(engine_config(model_dir), served_model_name="corun-tiny",
                                num_prefill=num_prefill, num_decode=num_decode,
                                port=free_port("127.0.0.1"), **settings)
    return LocalCluster(config).start()


def client(cluster: LocalCluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="none", timeout=120, max_retries=0)


def complete(api: openai.OpenAI, prompt: str, params: dict, headers: dict | None = None, stream: bool = False):
    """(token ids, per-step (logprob, top logprobs)) of one completion."""
    extra_body = {"ignore_eos": params.get("ignore_eos", True), "return_token_ids": True}
    args = dict(model="corun-tiny", prompt=prompt, max_tokens=params["max_tokens"], temperature=params["temperature"],
                seed=params.get("seed"), logprobs=params.get("logprobs"), extra_body=extra_body,
                extra_headers=headers or {})
    if not stream:
        choice = api.completions.create(**args).choices[0]
        return completion_record(choice.model_extra["token_ids"], choice.logprobs)
    token_ids, logprobs, tops = [], [], []
    for chunk in api.completions.create(stream=True, **args):
        for choice in chunk.choices:
            token_ids += choice.model_extra.get("token_ids") or []
            if choice.logprobs is not None:
                logprobs += choice.logprobs.token_logprobs
                tops += choice.logprobs.top_logprobs
    return token_ids, list(zip(logprobs, [sorted(t.items()) for t in tops], strict=True))


def completion_record(token_ids, logprobs):
    pairs = list(zip(logprobs.token_logprobs, [sorted(t.items()) for t in logprobs.top_logprobs], strict=True))
    return list(token_ids), pairs


def complete_all_concurrently(api, prompts, params) -> list:
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return list(pool.map(lambda p: complete(api, p, params), prompts))


def node_stats(cluster: LocalCluster, addresses: list[str] | None = None, timeout_s: float = 10.0) -> dict[str, dict]:
    """node id -> its stats right now, asked of every node (or those at addresses) directly (the router's copy can
    be a second old); timeout_s for each node's answer (a node started just now answers once it has loaded)."""
    context = zmq.Context.instance()
    stats = {}
    if addresses is None:
        addresses = [*cluster.prefill_addresses, *cluster.decode_addresses, *cluster.colocated_addresses]
    for address in addresses:
        with context.socket(zmq.DEALER) as socket:
            socket.setsockopt(zmq.LINGER, 0)
            cluster.cluster_key.connect(socket)  # NOTE: a cluster member's key: nodes admit nobody else
            socket.connect(address)
            socket.send(protocol.encode(protocol.Ping(0)))
            if not socket.poll(int(timeout_s * 1000)):
                raise TimeoutError(f"no Pong from {address}")
            pong = protocol.decode(socket.recv_multipart()[-1])
            stats[pong.node_id] = pong.stats
    return stats


def wait_for_stats(cluster: LocalCluster, done, timeout_s: float = 10.0) -> dict[str, dict]:
    """Node stats once done(stats) holds (a prefill node frees KV when the decode's notification arrives)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = node_stats(cluster)
        if done(stats) or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


def child_pids(pid: int) -> list[int]:
    output = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(line) for line in output.split()]


def wait_for_line(process: subprocess.Popen, needle: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if needle in line:
            return line
        if not line and process.poll() is not None:
            raise RuntimeError(f"corun serve exited with {process.returncode}")
    raise TimeoutError(f"no {needle!r} from corun serve in {timeout_s} s")


def descendants(pid: int) -> list[int]:
    """Every process under pid (children, their children: the router's parser workers), from /proc."""
    children_of: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children_of.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children_of.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pids: list[int]) -> list[int]:
    """The pids still running (a zombie has ended: its parent is gone, init reaps it)."""
    running = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.append(pid)
    return running


def start_serve(model_dir: str, port: int, temp_dir: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "cli.main", "serve", "--model", model_dir, "--max-num-seqs", "8",
            "--max-model-len", "256", "--kv-cache-mib", "32", "--port", str(port), "--served-model-name", "corun-tiny"]
    env = {**os.environ, "TMPDIR": str(temp_dir)}
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    wait_for_line(process, "CoRun cluster ready", timeout_s=NODE_START_DEADLINE_S)
    return process


def colocated_records(model_dir: str, prompts: list[str], params: dict) -> list:
    """Each prompt's output on the colocated engine with the nodes' settings (one CPU thread: the thread count
    changes the bits), as complete() returns a served one: (token ids, per step (logprob, sorted (token text,
    logprob) of the top alternatives and the sampled token))."""
    llm = LLM(model_dir, max_num_seqs=N, max_model_len=MAX_MODEL_LEN, prefill_chunk_size=CHUNK, num_threads=1)
    outputs = llm.generate(prompts, SamplingParams(**params, ignore_eos=True))
    return [(o.outputs[0].token_ids, [api_step(llm.tokenizer, lp, params["logprobs"]) for lp in o.outputs[0].logprobs])
            for o in outputs]


def api_step(tokenizer, logprobs, num_top: int) -> tuple:
    # NOTE: the router's (and vLLM's) dict: the sampled token first, then the top ones (a later equal text wins)
    top = {token_text(tokenizer, logprobs.token_id): logprobs.logprob,
           **{token_text(tokenizer, t): json_logprob(v) for t, v in logprobs.top[:num_top]}}
    return logprobs.logprob, sorted(top.items())


def reset_prefix_cache(cluster: LocalCluster) -> dict:
    """POST /reset_prefix_cache (vLLM's): -> the router's answer (the blocks each node freed)."""
    request = urllib.request.Request(f"{cluster.url}/reset_prefix_cache", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        return json.loads(response.read())
