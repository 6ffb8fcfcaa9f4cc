"""`corun bench`: the flags of the benchmark harness (benchmarks/harness.py) and its JSON report."""

from __future__ import annotations

import json

from benchmarks.harness import DEFAULT_ARRIVALS, parse_goodput, run_bench
from corun.engine_args import add_engine_args, engine_config_from_args
from planner.workloads import Arrivals, make_workload


def add_bench(commands) -> None:
    cmd = commands.add_parser("bench", help="throughput/TTFT/TPOT/goodput per mode on synthetic workloads (JSON)")
    add_engine_args(cmd)
    cmd.add_argument("--modes", default="corun,standard,batch_invariant",
                     help="comma-separated mode specs: a mode, or mode:field=value:... with SchedulerConfig fields "
                          "(e.g. corun:prefill_buckets=default) to run variants side by side")
    cmd.add_argument("--workloads", default="1024x128,1024x2048,4096x128,4096x2048,burstgpt",
                     help="comma-separated: 1024x128, 1024x2048, 4096x128, 4096x2048, burstgpt, sharegpt, rl_rollout")
    cmd.add_argument("--num-requests", type=int, default=None,
                     help="requests per workload (default: the workload's own, 256; rl_rollout 512)")
    cmd.add_argument("--seed", type=int, default=DEFAULT_ARRIVALS.seed, help="seeds workload lengths and arrivals")
    cmd.add_argument("--request-rate", type=float, default=DEFAULT_ARRIVALS.request_rate,
                     help="requests/s with Poisson (gamma) arrivals; inf (default): every request at t=0")
    cmd.add_argument("--burstiness", type=float, default=DEFAULT_ARRIVALS.burstiness,
                     help="gamma shape of the arrival gaps: 1 Poisson, < 1 burstier, > 1 more even")
    cmd.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                     help="SLO targets for goodput, e.g. --goodput ttft:500 tpot:50")
    cmd.add_argument("--max-seconds", type=float, default=None,
                     help="cut each (mode, workload) run after this long; its result is marked truncated")
    cmd.add_argument("--out", default=None)
    cmd.set_defaults(run=run_bench_command)


def run_bench_command(args) -> int:
    base = engine_config_from_args(args)
    arrivals = Arrivals(args.request_rate, args.burstiness, args.seed)
    slo = parse_goodput(args.goodput)
    workloads = [make_workload(name, args.num_requests, args.seed) for name in args.workloads.split(",")]
    report = run_bench(base, args.modes.split(","), workloads, args.out, args.max_seconds, arrivals=arrivals, slo=slo)
    report["command"] = vars(args) | {"run": None, "request_rate": arrivals.describe()["request_rate"]}
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0
