"""`python -m benchmarks.node_intake --model DIR --out FILE`: what taking a burst in costs a colocated node's host.

A ColocatedServer in this process on the model receives --num-requests GenerateRequests of --min-len to --max-len
random token ids (multiple choice's contexts), all waiting on its socket, in one receive: the seconds per request
(decode, check, queue), the least of --repeats nodes. Nodes take these in while a forward runs (handled_during_forward,
node_core/liveness.py): before, the loop took them in between forwards, with the GPU idle for this long.
"""

from __future__ import annotations

import argparse
import random
import shlex
import sys
import time

from benchmarks.cpu_usage import host_facts
from benchmarks.report import emit
from colocated_node.server import ColocatedServer
from launch.local import free_port
from tests.node_sockets import router_socket
from wire import protocol
from wire.config import CacheConfig, EngineConfig, NodeConfig, SchedulerConfig
from wire.sampling_params import SamplingParams


def receive_seconds(model: str, messages: list[bytes]) -> float:
    """Seconds one receive takes to take in messages, all waiting on a fresh node's socket."""
    engine = EngineConfig(model=model, num_threads=1, cache=CacheConfig(num_blocks=20000),
                          scheduler=SchedulerConfig(max_num_seqs=256, max_model_len=1024, prefill_chunk_size=32))
    node = ColocatedServer(NodeConfig("colocated", "colocated-intake", engine, port=free_port("127.0.0.1")))
    try:
        with router_socket(node.config.address) as router:
            for message in messages:
                router.send(message)
            if not node.sockets.server.poll(30_000):
                raise RuntimeError("no request reached the node in 30 s")
            time.sleep(1.0)  # NOTE: the rest of the burst crosses loopback TCP (checked below: all taken in)
            started = time.perf_counter()
            node.receive(timeout_ms=0)
            seconds = time.perf_counter() - started
            if len(node.scheduler.waiting) != len(messages):
                raise RuntimeError(f"{len(node.scheduler.waiting)} of {len(messages)} requests taken in")
            return seconds
    finally:
        node.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.node_intake", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--min-len", type=int, default=404)
    parser.add_argument("--max-len", type=int, default=724)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=1, seed=1)
    messages = [protocol.encode(protocol.GenerateRequest(
        f"r{i}", [rng.randrange(1000) for _ in range(rng.randint(args.min_len, args.max_len))], params))
        for i in range(args.num_requests)]
    seconds = min(receive_seconds(args.model, messages) for _ in range(args.repeats))
    emit({"benchmark": "node_intake",
          "command": shlex.join(["python", "-m", "benchmarks.node_intake", *sys.argv[1:]]), "host": host_facts(),
          "num_requests": args.num_requests,
          "prompt_tokens": [args.min_len, args.max_len], "repeats": args.repeats,
          "receive_ms": round(seconds * 1e3, 2), "us_per_request": round(seconds / args.num_requests * 1e6, 1)},
         args.out)


if __name__ == "__main__":
    main()
