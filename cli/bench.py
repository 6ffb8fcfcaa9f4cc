"""`corun bench`: the flags of the benchmark harness (benchmarks/harness.py) and its JSON report."""

from __future__ import annotations

import json
import os
import sys

from planner.workloads import DEFAULT_ARRIVALS, PAPER_WORKLOADS, Arrivals, Workload, default_workloads, make_workload
from wire.auth import API_KEY_ENV, resolve_api_key
from wire.engine_args import add_engine_args, engine_config_from_args

CUDA_MODES = ("fixed_shape", "mixed", "batch_invariant")
CPU_MODES = ("fixed_shape", "mixed")
"""NOTE: batch_invariant's Triton kernels run in Triton's interpreter on CPU: minutes per step of a real run."""


def run_url_bench(args, base, workloads: list[Workload], arrivals: Arrivals, slo) -> dict:
    from benchmarks.http_bench import run_http_bench
    from corun.models.config import ModelArchConfig

    if args.modes:
        raise ValueError("--modes: the cluster at --url runs the modes its nodes were started with")
    vocab_size = ModelArchConfig.from_dir(base.model).vocab_size
    return run_http_bench(args.url.rstrip("/"), workloads, vocab_size, base.scheduler.max_model_len,
                          arrivals=arrivals, slo=slo, seed=args.seed, max_seconds=args.max_seconds,
                          max_concurrency=args.max_concurrency, label=args.label,
                          client_processes=args.client_processes, warm_connections=args.warm_connections,
                          api_key=resolve_api_key(args.api_key, os.environ))


def chosen_workloads(args, max_model_len: int) -> list[Workload]:
    if args.workloads:
        return [make_workload(name, args.num_requests, args.seed) for name in args.workloads.split(",")]
    workloads, note = default_workloads(max_model_len, args.num_requests, args.seed)
    names = ",".join(workload.name for workload in workloads)
    print(f"corun bench: workloads {names}" + (f" ({note})" if note else ""), file=sys.stderr, flush=True)
    return workloads


def add_bench(commands) -> None:
    cmd = commands.add_parser("bench", help="throughput/TTFT/TPOT/goodput per mode on synthetic workloads (JSON)")
    add_engine_args(cmd)
    cmd.add_argument("--modes", default=None,
                     help="comma-separated mode specs: a mode, or mode:field=value:... with SchedulerConfig fields "
                          "(e.g. fixed_shape:prefill_token_budget=0) to run variants side by side (default: "
                          f"{','.join(CUDA_MODES)} on CUDA, {','.join(CPU_MODES)} on CPU; the old names corun and "
                          "standard are taken too)")
    cmd.add_argument("--workloads", default=None,
                     help="comma-separated: INxOUT (e.g. 1024x128), burstgpt, sharegpt, rl_rollout (default: those of "
                          f"{','.join(PAPER_WORKLOADS)} that fit --max-model-len, else one INxOUT sized to it)")
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
    cmd.add_argument("--out", default=None, help="write the JSON report here as well as to stdout")
    served = cmd.add_argument_group("a running cluster (vllm bench serve-like); --model names its checkpoint")
    served.add_argument("--url", default=None, help="the router, e.g. http://127.0.0.1:8000: stream every request "
                        "to it instead of running engines here")
    served.add_argument("--max-concurrency", type=int, default=None, help="--url: most requests in flight")
    served.add_argument("--client-processes", type=int, default=None,
                        help="--url: processes that send the requests, so that the client is not what is measured "
                             "(default: one per 4 cores, 1 to 8)")
    served.add_argument("--warm-connections", action="store_true",
                        help="--url: open the connections the requests will use before the run starts, as a client "
                             "mid-run holds them (an evaluation harness's session); default: each request opens its "
                             "own when it is sent")
    served.add_argument("--api-key", default=None, help=f"--url: the router's key (default: ${API_KEY_ENV})")
    served.add_argument("--label", default=None, help="--url: the mode name in the report (default served@URL)")
    cmd.set_defaults(run=run_bench_command)


def run_bench_command(args) -> int:
    # NOTE: here, not at the top: the harness imports torch (2 s), which `corun serve` and `corun scale` never need
    from benchmarks.harness import parse_goodput, run_bench

    base = engine_config_from_args(args)
    arrivals = Arrivals(args.request_rate, args.burstiness, args.seed)
    slo = parse_goodput(args.goodput)
    workloads = chosen_workloads(args, base.scheduler.max_model_len)
    if args.url:
        report = run_url_bench(args, base, workloads, arrivals, slo)
    elif base.backend == "vllm":
        # NOTE: the colocated bench reads the native engine's internals (its runner's shapes, its scheduler's queues)
        raise ValueError("corun bench runs the project's engine colocated; for --engine vllm bench a cluster with "
                         "--url (corun serve --engine vllm), or run benchmarks/vllm_backend.py in .venv-vllm")
    else:
        default_modes = CUDA_MODES if base.device.startswith("cuda") else CPU_MODES
        modes = args.modes.split(",") if args.modes else list(default_modes)
        report = run_bench(base, modes, workloads, args.out, args.max_seconds, arrivals=arrivals, slo=slo)
    report["command"] = vars(args) | {"run": None, "request_rate": arrivals.describe()["request_rate"]}
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0
