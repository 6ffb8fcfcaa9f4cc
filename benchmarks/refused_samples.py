"""Issue 23, finding 2: what refused `n > max_num_seqs` requests cost the prefill node's KV.

Starts a local 1P1D cluster on the tiny model (decode nodes at --max-num-seqs N), sends REQUESTS completions with
n = N + 1 (each refused), and reads the prefill node's free KV blocks (asked of the node directly) before, and
SETTLE_S after, the last refusal. Before issue 23 each refusal came after the prefill and its KV lease was held
until it expired (kv_lease_seconds, 60 s); now the router refuses before any prefill, and any refusal after one
releases the lease at once.

    python -m benchmarks.refused_samples --model models/tiny [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import zmq

from benchmarks.report import emit
from launch.local import LocalCluster, LocalClusterConfig, free_port
from wire import protocol
from wire.config import EngineConfig, SchedulerConfig

N = 4
REQUESTS = 40
SETTLE_S = 3.0
PROMPT = " ".join(["the river reads the morning light because seven people ran"] * 20)


def prefill_stats(cluster: LocalCluster) -> dict:
    """The prefill node's stats now, from a Pong it sends us (a cluster member's key)."""
    context = zmq.Context.instance()
    with context.socket(zmq.DEALER) as socket:
        socket.setsockopt(zmq.LINGER, 0)
        cluster.cluster_key.connect(socket)
        socket.connect(cluster.prefill_addresses[0])
        socket.send(protocol.encode(protocol.Ping(0)))
        if not socket.poll(30_000):
            raise TimeoutError("no Pong from the prefill node")
        return protocol.decode(socket.recv_multipart()[-1]).stats


def refuse(url: str) -> tuple[int, str]:
    body = {"model": "corun-tiny", "prompt": PROMPT, "max_tokens": 8, "n": N + 1, "seed": 1}
    request = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, ""
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()).get("error", {}).get("message", "")


def measure(model: str) -> dict:
    engine = EngineConfig(model=model, scheduler=SchedulerConfig(max_num_seqs=N, max_model_len=512))
    cluster = LocalCluster(LocalClusterConfig(engine, served_model_name="corun-tiny", num_prefill=1, num_decode=1,
                                              port=free_port("127.0.0.1"))).start()
    try:
        before = prefill_stats(cluster)["num_free_blocks"]
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(lambda _: refuse(cluster.url), range(REQUESTS)))
        seconds = time.monotonic() - started
        time.sleep(SETTLE_S)
        stats = prefill_stats(cluster)
    finally:
        cluster.stop()
    return {"max_num_seqs": N, "n": N + 1, "requests": REQUESTS, "statuses": sorted({s for s, _ in replies}),
            "message": replies[0][1], "seconds_for_all_refusals": round(seconds, 2),
            "free_blocks_before": before, f"free_blocks_{SETTLE_S:g}s_after": stats["num_free_blocks"],
            "num_prefills": stats["num_prefills"], "num_leased": stats["num_leased"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out")
    args = parser.parse_args()
    emit(measure(args.model), args.out)


if __name__ == "__main__":
    main()
