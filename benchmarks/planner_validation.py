"""The planner's predictions against served runs on one device: a colocated node and 1P1D, BurstGPT- and
ShareGPT-like traffic, Poisson rates at fractions of each deployment's predicted capacity (issue 26).

    python -m benchmarks.planner_validation --device cuda --preset qwen3-8b \
        --out benchmarks/results/h200_planner_validation.json
    python -m benchmarks.planner_validation --device cpu --out /tmp/planner_validation_cpu.json  # smoke: qwen3-tiny

In one run (RUN_SHAPES: the engine every node runs and the run's size, per device):
1. Profile: profile_engine (planner/profiling.py) on that engine in this process, at few lengths: prefill points,
   decode steps and the KV hand-off (a NIXL READ between two processes). The engine is freed before any cluster.
   1P1D on one GPU is two processes time-slicing it; their stretches (profile.shared_gpu) are not something
   profile_engine measures: they come from --shared-gpu-profile (the committed H200 profile, derived from served
   runs). On CPU each 1P1D node has its compute thread: predicted as P/D with a device per node.
2. Per deployment, one LocalCluster (`corun serve --prefill 0 --decode 0 --colocated 1`, then `--prefill 1 --decode
   1` on the same device), and per workload: the deployment's predicted capacity (the highest rate at which none of
   its pools saturates), and per fraction of it a Poisson run over HTTP, cut at max_seconds (benchmarks/
   served_window.py says how TTFT p99, TPOT p99 and tok/s are measured).
3. Rows: predicted (the planner on the requests sent, at the rate their seeded arrivals realize, tok/s for the
   window the run measures it over: run_prediction) vs measured, each flagged within 25% (TTFT p99)
   and 15% (TPOT p99, tok/s); per workload the recommendation for one GPU (planner/recommend.py) and the deployment
   that measured best (the highest rate at which it met the SLO, then tok/s there).

    python -m benchmarks.planner_validation --repredict benchmarks/results/h200_planner_validation.json \
        --decode-points-from benchmarks/results/h200_planner_profile.json \
        --out benchmarks/results/h200_planner_validation_repredicted.json

predicts a committed run's rows again, offline, with the planner as it is now (repredict): a check on data already
seen, not a validation.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import scheduler_for
from benchmarks.report import emit
from benchmarks.served_window import measure_rate, wait_idle
from cli.slo_flags import add_slo_flags
from corun.models.presets import PRESETS, make_random_model_dir
from launch.cluster import ClusterConfig, free_port
from launch.local import LocalCluster
from planner.capacity_model import WorkloadStats
from planner.deployments import ClusterModel, Deployment, predict
from planner.perf_profile import PerformanceModel, PerformanceProfile
from planner.plan import DecodeConfig
from planner.plan import Workload as PlannedWorkload
from planner.profiling import profile_engine
from planner.recommend import max_meeting_rate, recommend
from planner.slo import SLO
from planner.workloads import Arrivals, Workload, make_workload
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

TOLERANCE = {"ttft_p99_s": 0.25, "tpot_p99_s": 0.15, "tok_per_s": 0.15}
"""The issue's bar: measured within this fraction of predicted."""
NO_LATENCY_TARGET = SLO(ttft_p99_s=3600.0, tpot_p99_s=3600.0)
"""NOTE: an hour each: with it only stability (no pool past 100%) limits a deployment's rate: its capacity."""
CAPACITY_SAMPLES = 2000
"""Length samples a workload's capacity is predicted over; a run sends the first rate * arrival_seconds of them."""
RESULTS = Path(__file__).parent / "results"
SHARED_GPU_PROFILE = RESULTS / "h200_planner_profile.json"
DEPLOYMENT_NAMES = ("colocated", "1p1d")


@dataclass(frozen=True)
class RunShape:
    """The engine every node runs (and the profile measures) and the size of the run, on one device."""

    preset: str
    dtype: str
    max_num_seqs: int
    max_model_len: int
    prefill_chunk_size: int
    kv_cache_mib: int
    """The profiled engine's, each decode node's and the colocated node's KV cache."""
    prefill_kv_cache_mib: int
    num_threads: int | None
    profile_lengths: tuple[int, ...]
    profile_contexts: tuple[int, ...]
    profile_rows: tuple[int, ...]
    arrival_seconds: float
    """Each run sends rate * this many requests (a run at 0.9 of capacity needs as long to build its queue as one at
    0.3); tok/s is measured over the second half of it."""
    max_seconds: float
    """Each run is cut here (what is still streaming then is cancelled, and aborted on the nodes)."""
    ttft_p99_ms: float
    tpot_p99_ms: float


RUN_SHAPES = {
    # NOTE: the front door bench's H200 engine (benchmarks/front_door.py); 12 runs of at most 18 s, 2 cluster starts
    # and the profile are meant to fit in one 10-minute device call (about 450 s estimated, not yet run)
    "cuda": RunShape("qwen3-8b", "bfloat16", 256, 6144, 4096, 60000, 16000, 1, (64, 512, 1024, 2048, 4096, 6143),
                     (128, 1024), (1, 128, 256), 15.0, 18.0, 2000.0, 100.0),
    "cpu": RunShape("qwen3-tiny", "float32", 8, 1024, 128, 64, 64, 1, (16, 128, 512, 1023), (64, 512), (1, 4, 8),
                    4.0, 6.0, 1000.0, 100.0),
}


def engine_config(shape: RunShape, model_dir: str, device: str) -> EngineConfig:
    base = SchedulerConfig(max_num_seqs=shape.max_num_seqs, max_model_len=shape.max_model_len,
                           prefill_chunk_size=shape.prefill_chunk_size)
    return EngineConfig(model=model_dir, dtype=shape.dtype, device=device, num_threads=shape.num_threads,
                        scheduler=scheduler_for(base, "fixed_shape"),
                        cache=CacheConfig(memory_budget_bytes=shape.kv_cache_mib * 2**20))


def measured_profile(engine: EngineConfig, shape: RunShape, shared_gpu_profile: str | None) -> PerformanceProfile:
    profile = profile_engine(engine, shape.profile_lengths, shape.profile_contexts, shape.profile_rows,
                             progress=lambda line: print(f"profile: {line}", flush=True))
    gc.collect()  # NOTE: the profiled engine's weights and KV leave the GPU before any node starts
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if shared_gpu_profile is None:
        return profile
    return dataclasses.replace(profile, shared_gpu=PerformanceProfile.load(shared_gpu_profile).shared_gpu)


def planned_deployments(device: str) -> dict[str, Deployment]:
    one_gpu = device.startswith("cuda")
    return {"colocated": Deployment.colocated(1),
            "1p1d": Deployment.shared_gpu(1) if one_gpu else Deployment.disaggregated(1, 1)}


def cluster_config(name: str, engine: EngineConfig, shape: RunShape) -> ClusterConfig:
    gpu = ("0",) if engine.device.startswith("cuda") else ()
    common = {"port": free_port("127.0.0.1"), "decode_kv_cache_mib": shape.kv_cache_mib, "startup_timeout_s": 600}
    if name == "colocated":
        return ClusterConfig(engine, num_prefill=0, num_decode=0, num_colocated=1, colocated_gpus=gpu, **common)
    return ClusterConfig(engine, prefill_gpus=gpu, decode_gpus=gpu, prefill_kv_cache_mib=shape.prefill_kv_cache_mib,
                         **common)


def fitting_workload(name: str, num_requests: int, node: DecodeConfig, seed: int) -> tuple[Workload, int]:
    """The named workload without the samples a node refuses (longer than max_model_len or its KV)."""
    sampled = make_workload(name, num_requests, seed)
    kept = tuple((i, o) for i, o in sampled.lengths
                 if i + o <= node.max_model_len and node.reserved_tokens(i + o) <= node.kv_capacity_tokens)
    return dataclasses.replace(sampled, lengths=kept), len(sampled.lengths) - len(kept)


def stats_of(workload: Workload, rate: float, cluster: ClusterModel) -> WorkloadStats:
    return WorkloadStats.of(PlannedWorkload(rate, workload.lengths, workload.name), cluster.performance, cluster.node)


def capacity(cluster: ClusterModel, deployment: Deployment, stats: WorkloadStats) -> float:
    """The highest rate at which the deployment's queues stay stable (none of its pools past 100%)."""
    return max_meeting_rate(cluster, deployment, stats, NO_LATENCY_TARGET, max_utilization=1.0)


def run_prediction(cluster: ClusterModel, deployment: Deployment, sent: Workload, nominal_rate: float, seed: int,
                   slo: SLO) -> dict:
    """The planner's figures for the run that sends `sent` at `nominal_rate`: at the rate its seeded Poisson arrivals
    realize (the same arrival times measure_rate sends at), with tok/s for the window the run measures it over."""
    times = Arrivals(nominal_rate, 1.0, seed).times(len(sent.lengths))
    realized = (len(times) - 1) / times[-1]
    outlook = predict(cluster, deployment, stats_of(sent, realized, cluster), slo)
    windowed = window_tok_per_s(cluster, sent, times, outlook.token_interval_s)
    return {"ttft_p99_s": finite(outlook.ttft_p99_s), "tpot_p99_s": finite(outlook.tpot_p99_s),
            "tok_per_s": finite(windowed), "steady_state_tok_per_s": finite(outlook.tok_per_s),
            "at_rate_req_per_s": round(realized, 3)}


def window_tok_per_s(cluster: ClusterModel, sent: Workload, times: tuple[float, ...], token_interval_s: float) -> float:
    """Output tokens per second the model expects in served_window's window (the second half of the arrivals) of a
    run that starts empty: each request's first token after its isolated prefill and one token interval, then one
    every interval. NOTE: queue waits, the hand-off and the prefill stretch are left out of the first token's time
    (tens to hundreds of ms against a window of seconds)."""
    if not math.isfinite(token_interval_s):
        return math.inf
    start, end = times[-1] / 2, times[-1]
    inputs, outputs = (np.array(x, dtype=float) for x in zip(*sent.lengths))
    first = np.array(times) + cluster.performance.prefill.seconds(inputs) + token_interval_s
    # NOTE: tokens at first + k * interval, k = 0 .. outputs - 1: those in [start, end) counted in closed form
    after_start = np.ceil(np.maximum(start - first, 0) / token_interval_s)
    before_end = np.minimum(outputs, np.ceil(np.maximum(end - first, 0) / token_interval_s))
    return float(np.maximum(before_end - after_start, 0).sum()) / (end - start)


def within(predicted_: dict, measured: dict) -> dict:
    """Per figure: measured / predicted and whether it is within TOLERANCE (None: a side has no number)."""
    flags = {}
    for key, tolerance in TOLERANCE.items():
        if predicted_[key] and measured[key] is not None:
            ratio = measured[key] / predicted_[key]
            flags[key] = {"ratio": round(ratio, 3), "within": abs(ratio - 1) <= tolerance}
        else:
            flags[key] = {"ratio": None, "within": False}
    return flags | {"all_within": all(flag["within"] for flag in flags.values())}


def miss_causes(row: dict) -> list[str]:
    """What the run itself shows about a miss (the row's measured detail)."""
    detail, causes = row["measured"]["detail"], []
    if detail["ttft_censored_at_cut"]:
        causes.append(f"{detail['ttft_censored_at_cut']} requests had no first token at the cut: the queue grew "
                      "(TTFT p99 is a lower bound)")
    if detail["errors"]:
        causes.append(f"{detail['errors']} requests failed: {detail['first_errors']}")
    if detail["errors"]:
        causes.append("refused requests (the router's in-flight cap) are not in the model: they neither wait nor "
                      "stream")
    ttft = row["measured"]["ttft_p99_s"]
    if ttft is not None and row["predicted"]["ttft_p99_s"] and ttft < row["predicted"]["ttft_p99_s"] * 0.75:
        causes.append(f"TTFT p99 under 0.75x the steady-state prediction: the run ({detail['seconds']:g} s, started "
                      "empty) may end before the queue reaches its steady state at this load")
    return causes


def run_deployment(name: str, deployment: Deployment, cluster: ClusterModel, engine: EngineConfig, shape: RunShape,
                   workloads: dict[str, Workload], fractions: list[float], slo: SLO, seed: int, report: dict,
                   save) -> None:
    """Every (workload, rate) row of one deployment, on one cluster started once."""
    vocab = PRESETS[shape.preset]["vocab_size"]
    started = time.perf_counter()
    with LocalCluster(cluster_config(name, engine, shape)) as served:
        report["cluster_start_s"][name] = round(time.perf_counter() - started, 1)
        for workload in workloads.values():
            full_rate = capacity(cluster, deployment, stats_of(workload, 1.0, cluster))
            report["capacity_req_per_s"].setdefault(workload.name, {})[name] = round(full_rate, 3)
            for fraction in fractions:
                rate = round(fraction * full_rate, 3)
                sent = first_samples(workload, math.ceil(rate * shape.arrival_seconds))
                measured = measure_rate(served.url, sent, vocab, rate, seed, shape.max_seconds)
                row = {"deployment": name, "planned_as": deployment.label, "workload": workload.name,
                       "load_fraction": fraction, "rate": rate,
                       "predicted": run_prediction(cluster, deployment, sent, rate, seed, slo), "measured": measured}
                row["within"] = within(row["predicted"], measured)
                row["miss_causes"] = [] if row["within"]["all_within"] else miss_causes(row)
                row["measured_meets_slo"] = meets(measured, slo)
                report["rows"].append(row)
                print(f"{name} {workload.name} {rate} req/s: predicted {row['predicted']}, measured "
                      f"{ {k: measured[k] for k in TOLERANCE} }", flush=True)
                save()
                if not wait_idle(served.url):
                    row["miss_causes"].append("the cluster still had work 30 s after the run: the next run shares it")


def first_samples(workload: Workload, count: int) -> Workload:
    """The run's requests: the workload's first samples (the same seeded sequence at every rate)."""
    if count > len(workload.lengths):
        raise ValueError(f"a run needs {count} samples of {workload.name}, more than {len(workload.lengths)}: lower "
                         "--arrival-seconds")
    return dataclasses.replace(workload, lengths=workload.lengths[:max(2, count)])


def meets(measured: dict, slo: SLO) -> bool:
    return measured["ttft_p99_s"] is not None and measured["tpot_p99_s"] is not None and \
        measured["ttft_p99_s"] <= slo.ttft_p99_s and measured["tpot_p99_s"] <= slo.tpot_p99_s


def recommendations(cluster: ClusterModel, workloads: dict[str, Workload], rows: list[dict], slo: SLO,
                    names: dict[str, Deployment]) -> dict:
    """Per workload: the planner's pick for one GPU at the lowest rate run, and the deployment that measured best."""
    label_to_name = {deployment.label: name for name, deployment in names.items()}
    result = {}
    for workload in workloads.values():
        ran = [row for row in rows if row["workload"] == workload.name]
        if not ran:
            continue
        rate = min(row["rate"] for row in ran)
        pick = recommend(cluster, stats_of(workload, rate, cluster), slo, num_gpus=1)
        best = measured_best(ran)
        chosen = label_to_name.get(pick.chosen.deployment.label, pick.chosen.deployment.label)
        result[workload.name] = {"at_rate": rate, "recommended": chosen, "recommended_meets_slo": pick.meets_slo,
                                 "candidates": [o.deployment.label for o in pick.outlooks],
                                 "summary": list(pick.summary), "measured_best": best,
                                 "agree": best["deployment"] == chosen}
    return result


def measured_best(rows: list[dict]) -> dict:
    """The deployment that met the SLO up to the highest rate (then: the most tok/s at that rate)."""
    def standing(name: str) -> tuple[float, float]:
        meeting = [row for row in rows if row["deployment"] == name and row["measured_meets_slo"]]
        top = max(meeting, key=lambda row: row["rate"], default=None)
        return (top["rate"], top["measured"]["tok_per_s"] or 0.0) if top else (0.0, 0.0)

    standings = {name: standing(name) for name in DEPLOYMENT_NAMES if any(r["deployment"] == name for r in rows)}
    best = max(standings, key=standings.get)
    return {"deployment": best, "met_slo_up_to_req_per_s": {name: s[0] for name, s in standings.items()}}


def repredict(path: str | Path, decode_points_from: str | Path | None = None) -> dict:
    """Every row of a committed validation run predicted again, offline, by the planner as it is now: from the
    profile the run measured, for the requests it sent, at the rate their arrivals realized and for tok/s over the
    run's window; against the run's stored measurements. NOTE: a check of the model against data it has already
    seen (the fixes were made looking at these rows), not a validation: that needs a fresh run."""
    run = json.loads(Path(path).read_text())
    profile = PerformanceProfile.from_dict(run["profile"])
    if decode_points_from is not None:
        profile = dataclasses.replace(profile, decode_points=PerformanceProfile.load(decode_points_from).decode_points)
    node = DecodeConfig(profile.max_num_seqs, profile.kv_capacity_tokens, profile.max_model_len, profile.block_size)
    cluster = ClusterModel.of(PerformanceModel.fit(profile), profile, node, run["prefill_token_budget"])
    shape, seed = RunShape(**run["run_shape"]), run["command"]["seed"]
    slo = SLO(**run["slo"])
    names = planned_deployments("cuda" if run["gpu"] else "cpu")
    workloads = {name: fitting_workload(name, CAPACITY_SAMPLES, node, seed)[0]
                 for name in {row["workload"] for row in run["rows"]}}
    rows = [repredicted_row(row, cluster, names[row["deployment"]], workloads[row["workload"]], shape, seed, slo)
            for row in run["rows"]]
    return {"source": str(path), "decode_points_from": str(decode_points_from or path),
            "note": repredict.__doc__.split("NOTE: ")[1].replace("\n    ", " "),
            "fit": cluster.performance.summary(), "prefill_token_budget": cluster.prefill_token_budget,
            "tolerance": TOLERANCE, "rows": rows,
            "rows_within_tolerance": {"before": sum(row["before"]["all_within"] for row in rows),
                                      "now": sum(row["now"]["all_within"] for row in rows)},
            "figures_within_tolerance": {when: {key: sum(row[when][key]["within"] for row in rows)
                                                for key in TOLERANCE} for when in ("before", "now")}}


def repredicted_row(row: dict, cluster: ClusterModel, deployment: Deployment, workload: Workload, shape: RunShape,
                    seed: int, slo: SLO) -> dict:
    sent = first_samples(workload, math.ceil(row["rate"] * shape.arrival_seconds))
    if len(sent.lengths) != row["measured"]["detail"]["requests_planned"]:
        raise ValueError(f"{row['deployment']} {row['workload']} at {row['rate']}: {len(sent.lengths)} requests "
                         f"rebuilt, the run sent {row['measured']['detail']['requests_planned']}")
    now = run_prediction(cluster, deployment, sent, row["rate"], seed, slo)
    measured = {key: row["measured"][key] for key in TOLERANCE}
    within_now = within(now, measured)
    return {"deployment": row["deployment"], "workload": row["workload"], "load_fraction": row["load_fraction"],
            "rate": row["rate"], "realized_rate_req_per_s": row["measured"]["detail"]["realized_rate_req_per_s"],
            "measured": measured, "predicted_before": row["predicted"], "predicted_now": now,
            "before": row["within"], "now": within_now,
            "misses_now": [] if within_now["all_within"] else remaining_misses(row, within_now)}


def remaining_misses(row: dict, within_now: dict) -> list[str]:
    """The figures still out of tolerance, and what the run shows that the model leaves out."""
    detail = row["measured"]["detail"]
    misses = [f"{key} measured {within_now[key]['ratio']}x the prediction" for key in TOLERANCE
              if not within_now[key]["within"]]
    if detail["errors"]:
        misses.append(f"{detail['errors']} requests refused (HTTP 429: the router's in-flight cap), which the model "
                      "does not have: they neither wait nor stream")
    return misses


def ratios_only(report: dict) -> dict:
    """A re-prediction's counts and per-row ratios (measured / predicted), without the rows' figures."""
    return {"decode_points_from": report["decode_points_from"], "fit": report["fit"],
            "rows_within_tolerance": report["rows_within_tolerance"]["now"],
            "figures_within_tolerance": report["figures_within_tolerance"]["now"],
            "ratios": [{"deployment": row["deployment"], "workload": row["workload"],
                        "load_fraction": row["load_fraction"]} |
                       {key: row["now"][key]["ratio"] for key in TOLERANCE} for row in report["rows"]]}


def finite(value: float) -> float | None:
    return round(value, 6) if math.isfinite(value) else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=sorted(RUN_SHAPES))
    parser.add_argument("--preset", default=None, choices=sorted(PRESETS), help="default: the device's RUN_SHAPES")
    parser.add_argument("--workloads", default="burstgpt,sharegpt")
    parser.add_argument("--load-fractions", default="0.3,0.6,0.9", help="rates, as fractions of each deployment's "
                        "predicted capacity")
    parser.add_argument("--arrival-seconds", type=float, default=None, help="each run sends rate * this many "
                        "requests (default: the device's RUN_SHAPES)")
    parser.add_argument("--max-seconds", type=float, default=None, help="each run is cut here (default: RUN_SHAPES)")
    add_slo_flags(parser, required=False)
    parser.add_argument("--shared-gpu-profile", default=str(SHARED_GPU_PROFILE),
                        help="cuda: the profile whose shared_gpu (1P1D on one GPU) the prediction uses")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--repredict", default=None, metavar="RESULT_JSON", help="run nothing: predict the rows of "
                        "a committed validation result again with the planner as it is now, against its "
                        "measurements (a check on data already seen, not a validation)")
    parser.add_argument("--decode-points-from", default=None, metavar="PROFILE_JSON", help="with --repredict: also "
                        "predict with this profile's decode steps in place of the run's (a diagnostic of the step "
                        "the run's profile measured)")
    return parser.parse_args(argv)


def run_shape(args: argparse.Namespace) -> RunShape:
    """The device's shape with the flags given over it."""
    overrides = {"preset": args.preset, "arrival_seconds": args.arrival_seconds, "max_seconds": args.max_seconds,
                 "ttft_p99_ms": args.ttft_p99_ms, "tpot_p99_ms": args.tpot_p99_ms}
    return dataclasses.replace(RUN_SHAPES[args.device], **{k: v for k, v in overrides.items() if v is not None})


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.repredict:
        report = repredict(args.repredict)
        if args.decode_points_from:
            report["with_other_decode_points"] = ratios_only(repredict(args.repredict, args.decode_points_from))
        emit(report, args.out)
        return
    started = time.perf_counter()
    shape = run_shape(args)
    slo = SLO.from_ms(shape.ttft_p99_ms, shape.tpot_p99_ms)
    model_dir = str(make_random_model_dir(shape.preset, tempfile.mkdtemp(prefix=f"random-{shape.preset}-")))
    engine = engine_config(shape, model_dir, args.device)
    names = planned_deployments(args.device)
    shared = args.shared_gpu_profile if any(d.kind == "shared_gpu" for d in names.values()) else None
    profile = measured_profile(engine, shape, shared)
    node = DecodeConfig(profile.max_num_seqs, profile.kv_capacity_tokens, profile.max_model_len, profile.block_size)
    cluster = ClusterModel.of(PerformanceModel.fit(profile), profile, node)
    workloads, dropped = {}, {}
    for name in args.workloads.split(","):
        workloads[name], dropped[name] = fitting_workload(name, CAPACITY_SAMPLES, node, args.seed)
    report = {"command": vars(args), "run_shape": dataclasses.asdict(shape), "slo": dataclasses.asdict(slo),
              "tolerance": TOLERANCE, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "profile": profile.to_dict(), "fit": cluster.performance.summary(),
              "prefill_token_budget": cluster.prefill_token_budget, "samples_dropped_too_long": dropped,
              "deployments": {name: d.label for name, d in names.items()}, "profile_s": None,
              "cluster_start_s": {}, "capacity_req_per_s": {}, "rows": []}
    report["profile_s"] = round(time.perf_counter() - started, 1)

    def save() -> None:  # NOTE: after every row, so a run cut by the device call's limit leaves what it measured
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=2) + "\n")

    fractions = [float(x) for x in args.load_fractions.split(",")]
    for name, deployment in names.items():
        run_deployment(name, deployment, cluster, engine, shape, workloads, fractions, slo, args.seed, report, save)
    report["recommendation_one_gpu"] = recommendations(cluster, workloads, report["rows"], slo, names)
    report["rows_within_tolerance"] = sum(row["within"]["all_within"] for row in report["rows"])
    report["runtime_s"] = round(time.perf_counter() - started, 1)
    emit(report, args.out)


if __name__ == "__main__":
    main()
