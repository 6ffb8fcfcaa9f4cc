"""What a slow grammar compile does to the other requests of a cluster (stop 60: compiles moved off the node loops).

Starts a local 1P1D cluster on the tiny model. A ticker thread streams one unconstrained completion after another
(TICK_TOKENS each) and records each one's time to first token, its largest gap between two streamed chunks and any
error. Once it runs, one request arrives with a JSON schema whose compile takes seconds (--depth: nested objects of
email-pattern strings, ~1.6 s at depth 2 and ~10 s at depth 3 on this repository's 2-core host; the first compile
of each node process also loads the tokenizer). Both nodes compile it, the prefill node first.

With the compile inside a node's loop, that node runs nothing and answers no ping while it compiles: the ticker's
requests stall for as long, and past the router's health window (3 s) they fail. With it on a worker thread
(node_core/grammar_waits.py) they stream on.

    python -m benchmarks.grammar_compile_stall --model models/tiny --depth 3 [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.error
import urllib.request

from benchmarks.report import emit
from launch.local import LocalCluster, LocalClusterConfig, free_port
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

TICK_TOKENS = 64
SETTLE_S = 2.0
"""The ticker runs this long before the slow request and after its end."""


def nested_schema(depth: int) -> dict:
    leaf = {"type": "string", "pattern": "^[a-z0-9]{3,40}@[a-z]{2,9}\\.(com|org|net)$"}
    keys = [f"k{i}" for i in range(6)]
    return {"type": "object", "properties": {k: nested_schema(depth - 1) if depth else leaf for k in keys},
            "required": keys}


def post(url: str, body: dict, timeout_s: float = 600.0):
    request = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=timeout_s)


def streamed_once(url: str, seed: int) -> dict:
    """One streamed unconstrained completion: its TTFT, largest gap between chunks, or its error."""
    body = {"model": "corun-tiny", "prompt": "the river reads the morning light", "max_tokens": TICK_TOKENS,
            "seed": seed, "ignore_eos": True, "stream": True}
    started = time.monotonic()
    times = []
    try:
        with post(url, body) as reply:
            for line in reply:
                if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                    times.append(time.monotonic())
    except (urllib.error.URLError, OSError) as error:
        return {"started": started, "error": str(error)[:200]}
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return {"started": started, "ttft_s": times[0] - started if times else None, "max_gap_s": max(gaps, default=0.0),
            "chunks": len(times)}


def slow_request(url: str, depth: int) -> dict:
    body = {"model": "corun-tiny", "prompt": "Give the addresses", "max_tokens": 16, "seed": 3,
            "structured_outputs": {"json": nested_schema(depth)}}
    started = time.monotonic()
    try:
        with post(url, body) as reply:
            status = reply.status
    except urllib.error.HTTPError as error:
        status = error.code
    return {"status": status, "seconds": round(time.monotonic() - started, 3), "started": started}


def measure(model: str, depth: int) -> dict:
    engine = EngineConfig(model=model, scheduler=SchedulerConfig(max_num_seqs=8, max_model_len=512),
                          cache=CacheConfig(memory_budget_bytes=64 * 2**20))
    cluster = LocalCluster(LocalClusterConfig(engine, served_model_name="corun-tiny", num_prefill=1, num_decode=1,
                                              port=free_port("127.0.0.1"))).start()
    ticks: list[dict] = []
    stop = threading.Event()

    def ticker():
        seed = 0
        while not stop.is_set():
            ticks.append(streamed_once(cluster.url, seed))
            seed += 1

    try:
        streamed_once(cluster.url, -1)  # NOTE: warm both nodes' first forwards
        thread = threading.Thread(target=ticker)
        thread.start()
        time.sleep(SETTLE_S)
        slow = slow_request(cluster.url, depth)
        time.sleep(SETTLE_S)
        stop.set()
        thread.join()
    finally:
        cluster.stop()
    during = [t for t in ticks if t["started"] >= slow["started"] - 1.0 and
              t["started"] <= slow["started"] + slow["seconds"]]
    done = [t for t in during if "error" not in t]
    return {"benchmark": "grammar_compile_stall", "model": model, "schema_depth": depth,
            "schema_chars": len(json.dumps(nested_schema(depth))), "tick_tokens": TICK_TOKENS,
            "slow_request": {"status": slow["status"], "seconds": slow["seconds"]},
            "ticks_during_slow_request": len(during), "ticks_failed": len(during) - len(done),
            "errors": sorted({t["error"] for t in during if "error" in t}),
            "tick_ttft_max_s": round(max((t["ttft_s"] for t in done if t["ttft_s"] is not None), default=0.0), 3),
            "tick_max_gap_s": round(max((t["max_gap_s"] for t in done), default=0.0), 3),
            "ticks_before": sum(t["started"] < slow["started"] - 1.0 for t in ticks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    emit(measure(args.model, args.depth), args.out)


if __name__ == "__main__":
    main()
