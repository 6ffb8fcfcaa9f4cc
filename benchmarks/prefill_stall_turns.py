"""`python -m benchmarks.prefill_stall_turns --model DIR`: what a prefill node's loop costs while its waiting prompts
find every KV block leased (they wait for the decode side to read, release or let a lease expire).

A PrefillServer in this process on the tiny model (64 blocks), sent 30 distinct 80-token prompts with leases that
outlive the run: about 12 fit, the rest wait. Its loop then turns for --seconds; prints one JSON object: turns, the
process's CPU seconds, and the loop's schedule seconds over that window.
"""

from __future__ import annotations

import argparse
import json
import time

from launch.local import free_port
from prefill_node.server import PrefillServer
from tests.node_sockets import router_socket, small_engine
from wire import protocol
from wire.config import NodeConfig
from wire.sampling_params import SamplingParams


def stalled(node: PrefillServer) -> bool:
    """Prompts wait, none is being prefilled, and the free blocks hold none of them (5 blocks each)."""
    return bool(node.waiting) and not node.prefilling and node.block_manager.num_free_blocks < 5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="models/tiny")
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    node = PrefillServer(NodeConfig("prefill", "prefill-stall", small_engine(args.model),
                                    port=free_port("127.0.0.1"), kv_lease_seconds=600))
    params = SamplingParams(temperature=0.6, seed=3, max_tokens=8, ignore_eos=True)
    try:
        with router_socket(node.config.address) as router:
            for i in range(30):
                router.send(protocol.encode(protocol.PrefillRequest(f"p{i}", list(range(10 + i, 90 + i)), params)))
            deadline = time.monotonic() + 60
            while not stalled(node) and time.monotonic() < deadline:
                node.step()
            forwards_before = node.runner.num_prefill_forwards
            schedule_before = node.loop_seconds["schedule"]
            start, cpu_start, turns = time.perf_counter(), time.process_time(), 0
            while time.perf_counter() - start < args.seconds:
                node.step()
                turns += 1
            print(json.dumps({"seconds": args.seconds, "waiting": len(node.waiting),
                              "leases": len(node.transport.leases), "turns": turns,
                              "cpu_s": round(time.process_time() - cpu_start, 3),
                              "schedule_s": round(node.loop_seconds["schedule"] - schedule_before, 3),
                              "forwards": node.runner.num_prefill_forwards - forwards_before}))
    finally:
        node.close()


if __name__ == "__main__":
    main()
