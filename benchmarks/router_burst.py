"""`python -m benchmarks.router_burst --out FILE`: how long the front door takes to take in a burst, with no model.

A workload's requests all sent at t = 0 (corun bench --url's client, benchmarks/http_bench.py) through K routers to
fake prefill and decode nodes (benchmarks/fake_nodes.py) that answer at once: what a client's TTFT holds beyond the
nodes' work is the clients' sending and the routers' intake. Each run gives the client's TTFT and the routers' own
mean TTFT (server_means: from a handler's start to its first token), whose difference is the time before a router's
handler starts (the client's send, the connection, the HTTP parse backlog). Issue 25 asks multiple choice through
HTTP for TTFT p50 <= 0.4x cache-off: once the node's work is small, this is what is left. --connections warm opens
the clients' connections before the burst, as an evaluation harness's session holds them; fresh (the default) opens
each with its request.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile

from benchmarks.child_processes import stop_child
from benchmarks.cpu_usage import host_facts, listen_overflows
from benchmarks.harness import DEFAULT_ARRIVALS, SLOTargets
from benchmarks.http_bench import run_http_bench
from benchmarks.router_throughput import read_vocab_size, start_fake_node, start_router, wait_until_healthy
from launch.cluster import free_port
from planner.workloads import make_workload
from wire.config import RouterSettings

FAKE_STEP_MS = 20.0
CONNECTIONS = ("fresh", "warm")
"""fresh: each request opens its connection at t = 0; warm: the clients open them before the run (an evaluation
harness's session holds its connections: benchmarks/http_clients.py, open_connections)."""
MAX_MODEL_LEN = 2048


def one_run(args: argparse.Namespace, num_routers: int, client_processes: int, vocab_size: int,
            listen_backlog: int, connections: str = "fresh") -> dict:
    log_dir = tempfile.mkdtemp(prefix="router-burst-")
    prefill = start_fake_node("prefill", vocab_size, FAKE_STEP_MS, log_dir)
    decode = start_fake_node("decode", vocab_size, FAKE_STEP_MS, log_dir)
    port, metrics_dir = free_port("127.0.0.1"), tempfile.mkdtemp(prefix="router-burst-metrics-")
    # NOTE: streams: start_router's admission
    settings = argparse.Namespace(model=args.model, streams=[args.num_requests], listen_backlog=listen_backlog)
    routers = [start_router(i, num_routers, port, metrics_dir, settings, prefill, decode, log_dir)
               for i in range(num_routers)]
    try:
        for router in routers:
            wait_until_healthy(router)
        workload = make_workload(args.workload, args.num_requests)
        overflows_before = listen_overflows()
        report = run_http_bench(f"http://127.0.0.1:{port}", [workload], vocab_size, MAX_MODEL_LEN,
                                arrivals=DEFAULT_ARRIVALS, slo=SLOTargets(), client_processes=client_processes,
                                warm_connections=connections == "warm")
        run = next(iter(report["modes"].values()))[workload.name]
        overflows_after = listen_overflows()
        return {"routers": num_routers, "client_processes": client_processes, "listen_backlog": listen_backlog,
                "connections": connections, "workload": workload.name,
                "num_requests": run["num_requests"], "ttft_s": run["ttft_s"],
                "server_means": run.get("server_means"), "router_cpu_us_per_token": run.get("router_cpu_us_per_token"),
                # NOTE: the whole host's count: another program's overflows meanwhile would show here too
                "host_listen_overflows": None if overflows_before is None else overflows_after - overflows_before}
    finally:
        for router in routers:
            stop_child(router.process)
        stop_child(prefill.process)
        stop_child(decode.process)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.router_burst", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/tiny", help="the routers' tokenizer files (and vocab size)")
    parser.add_argument("--workload", default="multiple_choice")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--routers", default="1,2", help="router counts, comma-separated")
    parser.add_argument("--client-processes", default="1,2", help="client process counts, comma-separated")
    parser.add_argument("--listen-backlogs", default=str(RouterSettings.listen_backlog),
                        help="the routers' --listen-backlog, comma-separated (a run for each)")
    parser.add_argument("--connections", default="fresh", help="fresh, warm or both (comma-separated): a run each")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    connection_kinds = args.connections.split(",")
    if any(kind not in CONNECTIONS for kind in connection_kinds):
        parser.error(f"--connections takes {', '.join(CONNECTIONS)}")
    vocab_size = read_vocab_size(args.model)
    runs = []
    for backlog in (int(b) for b in args.listen_backlogs.split(",")):
        for num_routers in (int(k) for k in args.routers.split(",")):
            for clients in (int(c) for c in args.client_processes.split(",")):
                for kind in connection_kinds:
                    runs.append(one_run(args, num_routers, clients, vocab_size, backlog, kind))
                    print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    report = {"benchmark": "router_burst", "command": shlex.join(["python", "-m", "benchmarks.router_burst",
                                                                   *sys.argv[1:]]),
              "host": host_facts(), "runs": runs}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
