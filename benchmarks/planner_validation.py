"""The capacity planner's 1P1D predictions against a real 1P1D cluster on this host.

    python -m benchmarks.planner_validation --out benchmarks/results/planner_validation_cpu.json

1. Profile: `profile_engine` on the engine config every cluster node runs (tests/launch/cluster_client.py's
   engine_config: N = 32, max_model_len 512, chunk 64, 64 MiB of KV; one compute thread, as LocalCluster gives
   each node), in this process, with nothing else running.
2. Workload: (input, output) lengths uniform in [50, 400] x [16, 64] (seeded), Poisson arrivals at rates set as
   fractions of the profiled single prefill server's capacity 1 / E[prefill] (default 0.3, 0.65 and 1.3: two
   that the plan serves with 1P1D under the SLO, one that it needs more prefill for).
3. Per rate: the planner's analytic prediction for P = 1, D = 1 (Planner.feasible(1, 1): TTFT/TPOT p99; the p50
   is the same formulas solved at quantile 0.5), the discrete-event simulation of 1P1D (planner/plan_sim.py) in
   steady state (20000 requests, warm-up dropped) and replaying exactly the trace sent to the cluster (no
   warm-up dropped, as measured), and the plan's recommended P:D. Then a fresh LocalCluster (router + 1 prefill
   + 1 decode process), a short sequential warm-up, sequential requests on the idle cluster (what the path
   outside the profiled prefill and step costs), and the trace over HTTP: streaming, token-id prompts,
   ignore_eos; TTFT = first streamed token - send, TPOT = (last token - first token) / (tokens - 1).
   CPU seconds of each cluster process and of this client process come from /proc.
4. JSON: profile and fit, per rate predicted vs measured, SLO met or not in each, host facts and caveats.

Caveat: this host has few cores and the router, both nodes and the client share them, while the profile was
measured alone; the planner also takes KV transfer and the HTTP/router path as free.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import platform
import random
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import torch

from benchmarks.report import emit
from cli.slo_flags import add_slo_flags
from corun.models.tiny import make_tiny_model
from launch.local import LocalCluster, LocalClusterConfig, free_port
from planner import capacity_model
from planner.capacity_model import WorkloadStats
from planner.perf_profile import PerformanceModel
from planner.plan import SLO, DecodeConfig, Planner, Workload, plan
from planner.plan_sim import ClusterSim, make_requests, simulate
from planner.profiling import profile_engine
from tests.launch.cluster_client import engine_config, node_stats

INPUT_RANGE = (50, 400)
OUTPUT_RANGE = (16, 64)
PROFILE_LENGTHS = [16, 64, 128, 256, 384, 511]
PROFILE_CONTEXTS = [64, 256, 448]
SIM_REQUESTS = 20000
CLK_TCK = os.sysconf("SC_CLK_TCK")


def sample_lengths(num: int, seed: int) -> tuple[tuple[int, int], ...]:
    rng = random.Random(seed)
    return tuple((rng.randint(*INPUT_RANGE), rng.randint(*OUTPUT_RANGE)) for _ in range(num))


def quantiles(samples) -> dict:
    values = np.asarray(samples, dtype=float)
    return {"p50": float(np.quantile(values, 0.5)), "p99": float(np.quantile(values, 0.99)),
            "mean": float(values.mean()), "max": float(values.max()), "n": int(values.size)}


@contextlib.contextmanager
def solved_at(quantile: float):
    """The analytic model's formulas solved at another quantile (they read capacity_model.QUANTILE)."""
    saved = capacity_model.QUANTILE
    capacity_model.QUANTILE = quantile
    try:
        yield
    finally:
        capacity_model.QUANTILE = saved


def analytic(model, workload, slo, decode, num_prefill: int, num_decode: int) -> dict:
    """Planner's prediction for a fixed P:D (whether or not it meets the SLO)."""
    def predict():
        planner = Planner(model, WorkloadStats.of(workload, model, decode), slo, decode, 0.9, 1024)
        return planner.feasible(num_prefill, num_decode).prediction

    p99 = predict()
    with solved_at(0.5):
        p50 = predict()
    stable = math.isfinite(p99.ttft_p99_s) and math.isfinite(p99.tpot_p99_s)
    return {"stable": stable, "ttft_p50_s": p50.ttft_p99_s, "ttft_p99_s": p99.ttft_p99_s,
            "tpot_p50_s": p50.tpot_p99_s, "tpot_p99_s": p99.tpot_p99_s, "mean_step_s": p99.mean_step_s,
            "prefill_utilization": p99.prefill_utilization, "decode_slot_utilization": p99.decode_slot_utilization,
            "decode_kv_utilization": p99.decode_kv_utilization, "usable_slots_per_decode": p99.usable_slots_per_decode,
            "meets_slo": stable and p99.ttft_p99_s <= slo.ttft_p99_s and p99.tpot_p99_s <= slo.tpot_p99_s}


def replay(model, decode, requests, num_prefill: int, num_decode: int, warmup_s: float = 0.0) -> dict:
    """Per-request TTFT/TPOT of the event simulation over `requests` (those arriving after warmup_s)."""
    ClusterSim(model, decode, num_prefill, num_decode).run(requests)
    measured = [r for r in requests if r.arrival >= warmup_s]
    return {"ttft_s": quantiles([r.first_token - r.arrival for r in measured]),
            "tpot_s": quantiles([(r.last_token - r.first_token) / (r.num_output - 1)
                                 for r in measured if r.num_output > 1]),
            "makespan_s": max(r.last_token for r in requests)}


def simulated(model, workload, slo, decode, num_prefill: int, num_decode: int, seed: int) -> dict:
    """plan_sim.simulate (steady state) plus the p50s of the same run."""
    result = simulate(model, workload, decode, num_prefill, num_decode, SIM_REQUESTS, seed)
    again = replay(model, decode, make_requests(model, workload, decode, SIM_REQUESTS, seed), num_prefill,
                   num_decode, result.warmup_s)
    return result.to_dict(slo) | {"ttft_p50_s": again["ttft_s"]["p50"], "tpot_p50_s": again["tpot_s"]["p50"]}


def trace_replay(model, workload, slo, decode, num_requests: int, seed: int) -> dict:
    """The simulation of exactly the trace sent to the cluster, every request counted (as measured)."""
    requests = make_requests(model, workload, decode, num_requests, seed)
    result = replay(model, decode, requests, 1, 1)
    return {"completed_req_per_s": num_requests / result["makespan_s"],
            "output_tok_per_s": sum(r.num_output for r in requests) / result["makespan_s"],
            "ttft_p50_s": result["ttft_s"]["p50"], "ttft_p99_s": result["ttft_s"]["p99"],
            "tpot_p50_s": result["tpot_s"]["p50"], "tpot_p99_s": result["tpot_s"]["p99"],
            "makespan_s": result["makespan_s"],
            "meets_slo": result["ttft_s"]["p99"] <= slo.ttft_p99_s and result["tpot_s"]["p99"] <= slo.tpot_p99_s}


# --- the real cluster --------------------------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cluster_cpu(cluster: LocalCluster) -> dict[str, float]:
    return {name: cpu_seconds(process.pid) for name, process in cluster.processes} | {"client": time.process_time()}


async def send_one(session, url: str, prompt: list[int], max_tokens: int, seed: int) -> dict:
    body = {"model": "corun-tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.6, "seed": seed,
            "ignore_eos": True, "stream": True, "return_token_ids": True}
    start = time.perf_counter()
    first = last = None
    num_tokens = 0
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            return {"error": f"HTTP {response.status}: {await response.text()}"}
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return {"error": str(chunk["error"])}
            tokens = sum(len(c.get("token_ids") or []) for c in chunk["choices"])
            if tokens:
                last = time.perf_counter()
                first = first or last
                num_tokens += tokens
    return {"start": start, "first": first, "last": last, "num_tokens": num_tokens}


async def send_trace(url: str, trace, prompts: list[list[int]]) -> tuple[list[dict], float, float]:
    """Each request sent at its Poisson arrival time after t0; (results, t0, end)."""
    async def at(session, t0, index, request):
        delay = t0 + request.arrival - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        result = await send_one(session, url, prompts[index], request.num_output, index)
        return result | {"index": index, "late_s": result.get("start", t0) - t0 - request.arrival}

    connector = aiohttp.TCPConnector(limit=0)  # NOTE: no client-side cap on concurrent requests
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=900)) as session:
        await send_one(session, url, prompts[0][:8], 2, 0)  # NOTE: opens the connection pool
        t0 = time.perf_counter() + 0.2
        results = await asyncio.gather(*(at(session, t0, i, r) for i, r in enumerate(trace)))
        return results, t0, time.perf_counter()


async def sequential(url: str, prompts: list[list[int]], num: int, max_tokens: int) -> list[dict]:
    async with aiohttp.ClientSession() as session:
        return [await send_one(session, url, prompts[i % len(prompts)], max_tokens, 10_000 + i) | {
            "prompt_len": len(prompts[i % len(prompts)])} for i in range(num)]


def idle_path(model, results: list[dict]) -> dict:
    """One request at a time on the idle cluster: TTFT over the profiled prefill of its prompt (the rest is the
    path the planner takes as free: HTTP, router, ZMQ hops, KV claim and transfer, admission), and TPOT over the
    profiled one-row step."""
    ok = [r for r in results if "error" not in r]
    ttft_over = [r["first"] - r["start"] - float(model.prefill.seconds(r["prompt_len"])) for r in ok]
    tpot = [(r["last"] - r["first"]) / (r["num_tokens"] - 1) for r in ok if r["num_tokens"] > 1]
    step = [float(model.decode.seconds(r["prompt_len"] + r["num_tokens"] / 2)) for r in ok if r["num_tokens"] > 1]
    return {"num_requests": len(ok), "ttft_minus_profiled_prefill_s": quantiles(ttft_over),
            "tpot_s": quantiles(tpot), "profiled_one_row_step_s": quantiles(step)}


def measure(config: LocalClusterConfig, model, trace, prompts, slo: SLO, num_warmup: int, num_idle: int) -> dict:
    with LocalCluster(config) as cluster:
        asyncio.run(sequential(cluster.url, prompts, num_warmup, 16))
        idle = idle_path(model, asyncio.run(sequential(cluster.url, prompts[::-1], num_idle, 16)))
        stats_before, cpu_before = node_stats(cluster), cluster_cpu(cluster)
        results, t0, end = asyncio.run(send_trace(cluster.url, trace, prompts))
        stats_after, cpu_after = node_stats(cluster), cluster_cpu(cluster)
    wall = end - t0
    ok = [r for r in results if "error" not in r]
    ttfts = [r["first"] - r["start"] for r in ok]
    tpots = [(r["last"] - r["first"]) / (r["num_tokens"] - 1) for r in ok if r["num_tokens"] > 1]
    cpu = {name: round(cpu_after[name] - cpu_before[name], 3) for name in cpu_after}
    decode_steps = stats_after["decode-0"]["num_decode_steps"] - stats_before["decode-0"]["num_decode_steps"]
    report = {
        "idle_one_at_a_time": idle,
        "num_requests": len(results), "num_errors": len(results) - len(ok),
        "errors": sorted({r["error"] for r in results if "error" in r})[:3],
        "ttft_s": quantiles(ttfts), "tpot_s": quantiles(tpots),
        "output_tokens": sum(r["num_tokens"] for r in ok),
        "wall_s": wall, "output_tok_per_s": sum(r["num_tokens"] for r in ok) / wall,
        "completed_req_per_s": len(ok) / wall,
        "offered_req_per_s": len(trace) / trace[-1].arrival,
        "send_lateness_s": quantiles([r["late_s"] for r in results]),
        "cpu_seconds": cpu, "cpu_cores_busy": round(sum(cpu.values()) / wall, 3),
        "cpu_busy_fraction": {name: round(seconds / wall, 3) for name, seconds in cpu.items()},
        "prefill_cpu_per_request_s": cpu["prefill-0"] / len(results),
        "profiled_mean_prefill_s": float(model.prefill.seconds([r.num_input for r in trace]).mean()),
        "decode_steps": decode_steps,
        "wall_per_decode_step_s": wall / decode_steps if decode_steps else None,
        "decode_cpu_per_step_s": cpu["decode-0"] / decode_steps if decode_steps else None,
    }
    report["meets_slo"] = bool(ok) and not report["num_errors"] and \
        report["ttft_s"]["p99"] <= slo.ttft_p99_s and report["tpot_s"]["p99"] <= slo.tpot_p99_s
    return report


def make_prompts(trace, vocab_size: int, special_ids: set[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    ordinary = [t for t in range(vocab_size) if t not in special_ids]
    return [[rng.choice(ordinary) for _ in range(r.num_input)] for r in trace]


# --- report ------------------------------------------------------------------------------------------------------

def comparison(predicted: dict, simulated_trace: dict, measured: dict) -> dict:
    """measured / predicted ratios of the headline numbers."""
    def ratio(a, b):
        return None if not (b and math.isfinite(b)) else round(a / b, 3)

    rows = {}
    for key, field in (("ttft_p50", "ttft_s"), ("ttft_p99", "ttft_s"), ("tpot_p50", "tpot_s"),
                       ("tpot_p99", "tpot_s")):
        value = measured[field][key.split("_")[1]]
        rows[key] = {"measured_s": round(value, 5), "analytic_s": predicted[f"{key}_s"],
                     "sim_trace_s": round(simulated_trace[f"{key}_s"], 5),
                     "measured_over_analytic": ratio(value, predicted[f"{key}_s"]),
                     "measured_over_sim_trace": ratio(value, simulated_trace[f"{key}_s"])}
    rows["completed_req_per_s"] = {"measured": round(measured["completed_req_per_s"], 3),
                                   "sim_trace": round(simulated_trace["completed_req_per_s"], 3),
                                   "measured_over_sim_trace": ratio(measured["completed_req_per_s"],
                                                                    simulated_trace["completed_req_per_s"])}
    return rows


def finite(value):
    """JSON without Infinity/NaN: non-finite floats become None (an unstable queue's p99), floats rounded."""
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def host_facts() -> dict:
    return {"nproc": os.cpu_count(), "affinity_cpus": len(os.sched_getaffinity(0)), "machine": platform.machine(),
            "processor": platform.processor() or None, "python": platform.python_version(), "torch": torch.__version__,
            "processes_sharing_the_cores": "router, prefill-0, decode-0 (1 compute thread each) and this client"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-fractions", default="0.3,0.65,1.3",
                        help="arrival rates as fractions of one prefill server's profiled capacity 1/E[prefill]")
    parser.add_argument("--num-requests", type=int, default=300, help="requests sent per rate")
    add_slo_flags(parser, required=False, ttft_default=250.0, tpot_default=20.0)
    parser.add_argument("--num-warmup", type=int, default=8, help="sequential requests before each timed run")
    parser.add_argument("--num-idle", type=int, default=20, help="then sequential requests timed on the idle cluster")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    slo = SLO.from_ms(args.ttft_p99_ms, args.tpot_p99_ms)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(make_tiny_model(tmp))
        engine = dataclasses.replace(engine_config(model_dir), num_threads=1)  # NOTE: as the nodes run
        profile_started = time.perf_counter()
        profile = profile_engine(engine, PROFILE_LENGTHS, PROFILE_CONTEXTS, seed=args.seed)
        profile_s = time.perf_counter() - profile_started
        model = PerformanceModel.fit(profile)
        decode = DecodeConfig(profile.max_num_seqs, profile.kv_capacity_tokens, profile.max_model_len,
                              profile.block_size)
        lengths = sample_lengths(2000, args.seed)
        capacity = 1.0 / float(model.prefill.seconds([i for i, _ in lengths]).mean())
        config_json = json.loads(Path(model_dir, "config.json").read_text())
        tokenizer_json = json.loads(Path(model_dir, "tokenizer.json").read_text())
        special_ids = {token["id"] for token in tokenizer_json["added_tokens"]}
        report = {
            "args": vars(args), "host": host_facts(),
            "engine": {"max_num_seqs": engine.scheduler.max_num_seqs, "max_model_len": engine.scheduler.max_model_len,
                       "prefill_chunk_size": engine.scheduler.prefill_chunk_size, "num_threads": engine.num_threads,
                       "kv_capacity_tokens": profile.kv_capacity_tokens, "dtype": engine.dtype, "model": "tiny"},
            "profile": profile.to_dict() | {"source": "profile_engine: tiny model, float32, cpu, 1 thread",
                                            "seconds": profile_s},
            "fit": model.summary(),
            "workload": {"input_uniform": INPUT_RANGE, "output_uniform": OUTPUT_RANGE, "seed": args.seed}
            | {k: v for k, v in Workload(1.0, lengths).summary().items() if k != "rate_per_s"},
            "one_prefill_capacity_req_per_s": capacity,
            "slo": dataclasses.asdict(slo),
            "rates": [],
        }
        for fraction in (float(x) for x in args.load_fractions.split(",")):
            rate = round(fraction * capacity, 2)
            workload = Workload(rate, lengths, f"uniform {INPUT_RANGE} x {OUTPUT_RANGE}")
            print(f"rate {rate}/s ({fraction} of one prefill server's capacity)", flush=True)
            recommended = plan(model, workload, slo, decode)
            predicted = analytic(model, workload, slo, decode, 1, 1)
            steady = simulated(model, workload, slo, decode, 1, 1, args.seed)
            trace_seed = args.seed + 1000 + len(report["rates"])
            trace = make_requests(model, workload, decode, args.num_requests, trace_seed)
            on_trace = trace_replay(model, workload, slo, decode, args.num_requests, trace_seed)
            prompts = make_prompts(trace, config_json["vocab_size"], special_ids, trace_seed)
            cluster = LocalClusterConfig(engine_config(model_dir), port=free_port("127.0.0.1"),
                                         max_pending_requests=4 * args.num_requests)
            measured = measure(cluster, model, trace, prompts, slo, args.num_warmup, args.num_idle)
            report["rates"].append({
                "load_fraction": fraction, "rate_req_per_s": rate,
                "plan": {"feasible": recommended.feasible, "num_prefill": recommended.num_prefill,
                         "num_decode": recommended.num_decode, "ratio": recommended.ratio,
                         "instances": f"{recommended.num_prefill}P{recommended.num_decode}D"
                         if recommended.feasible else None,
                         "reason": recommended.reason},
                "predicted_1p1d": {"analytic": predicted, "simulated_steady_state": steady,
                                   "simulated_on_sent_trace": on_trace},
                "measured_1p1d": measured,
                "comparison": comparison(predicted, on_trace, measured),
                "slo_met": {"analytic": predicted["meets_slo"], "simulated_steady_state": steady["meets_slo"],
                            "simulated_on_sent_trace": on_trace["meets_slo"], "measured": measured["meets_slo"]},
            })
            print(json.dumps(finite(report["rates"][-1]["comparison"])), flush=True)
    report["runtime_s"] = time.perf_counter() - started
    report["caveats"] = [
        f"{os.cpu_count()} cores shared by the router, the prefill node, the decode node (one compute thread each) "
        "and this client; the profile was measured alone in this process, so contention is not in it.",
        "The planner takes KV transfer (NIXL READ prefill -> decode) and the HTTP/router path (request parsing, "
        "ZMQ hops, detokenization, SSE) as free; the measurement includes them.",
        "Analytic and steady-state simulated figures are for an endless Poisson stream (warm-up dropped); "
        "'simulated_on_sent_trace' replays exactly the requests sent, counted as the measurement counts them.",
        "Above one prefill server's capacity the queue grows without bound: the analytic p99 is null (infinite) "
        "and the simulated/measured TTFT depends on how many requests were sent.",
        "Analytic p50s are the planner's formulas solved at quantile 0.5; the planner itself only targets p99.",
    ]
    emit(finite(report), args.out)


if __name__ == "__main__":
    main()
