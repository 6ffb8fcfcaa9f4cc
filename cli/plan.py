"""`corun profile` and `corun plan`: flags -> profile, workload, SLO (milliseconds: cli/slo_flags.py) and decode config
-> the P:D plan (and its simulation), the recommended deployment on the GPUs given, as JSON, a summary and a plot."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import get_args

from cli.slo_flags import add_slo_flags
from planner.capacity_model import WorkloadStats
from planner.deployments import ClusterModel
from planner.perf_profile import PerformanceModel, PerformanceProfile
from planner.plan import DecodeConfig, Workload, named_workload, plan, read_lengths, split_too_long
from planner.plan_sim import check_plan
from planner.plot import rate_sweep, write_plot
from planner.recommend import Recommendation, recommend
from planner.slo import SLO
from wire.config import (
    CPU_MAX_NUM_SEQS,
    GPU_MAX_NUM_SEQS,
    CacheConfig,
    EngineConfig,
    EngineDType,
    SchedulerConfig,
)


def add_plan(commands) -> None:
    cmd = commands.add_parser("plan", help="prefill and decode instances for a workload under TTFT/TPOT targets")
    source = cmd.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", help="performance profile JSON (from --profile-out, or "
                        "benchmarks/derive_h200_profile.py)")
    source.add_argument("--model", help="checkpoint to profile now, on the native engine (fixed_shape mode) built "
                        "from the flags below")
    workload = cmd.add_mutually_exclusive_group(required=True)
    workload.add_argument("--workload", help="named workload of `corun bench` (1024x128, ..., burstgpt)")
    workload.add_argument("--lengths", help="(input, output) samples: JSON [[in, out], ...] or lines 'in,out'")
    cmd.add_argument("--rate", type=float, required=True, help="arrivals per second (Poisson)")
    cmd.add_argument("--num-samples", type=int, default=2000, help="samples drawn from a named workload")
    add_slo_flags(cmd)
    cmd.add_argument("--gpus", type=int, default=None, help="GPUs to deploy on: recommend colocated nodes or P:D "
                     "on at most this many (default: as many as the P:D plan needs)")
    cmd.add_argument("--plot", default=None, metavar="FILE.png", help="write predicted TTFT p99, TPOT p99 and "
                     "goodput against the rate for the recommended deployment and the best of each other kind")
    add_profiling_flags(cmd)
    cmd.add_argument("--swap-kv-tokens", type=int, default=None, help="KV tokens a decode or colocated instance's "
                     "swap space holds in host memory (default: the profile's; 0: whole sequences reserved in the KV)")
    cmd.add_argument("--max-utilization", type=float, default=0.9, help="busiest a pool may be planned")
    cmd.add_argument("--simulate-requests", type=int, default=20000,
                     help="requests in the simulation that checks the plan (0: no simulation)")
    cmd.add_argument("--seed", type=int, default=0, help="seed of the named workload's samples and the simulation")
    cmd.add_argument("--profile-out", default=None, help="profiling: save the measured profile here")
    cmd.set_defaults(run=run_plan)


def add_profiling_flags(cmd) -> None:
    """The engine a profile is measured on (and, for `plan --profile`, overrides of the profile's config)."""
    # NOTE: None: the profile's value; profiling takes the engine's defaults (named here, written in wire.config)
    cmd.add_argument("--max-num-seqs", type=int, default=None,
                     help=f"N (default: the profile's; to profile, {CPU_MAX_NUM_SEQS} on CPU and "
                          f"{GPU_MAX_NUM_SEQS} on CUDA)")
    cmd.add_argument("--max-model-len", type=int, default=None,
                     help=f"default: the profile's; {SchedulerConfig.max_model_len} to profile")
    cmd.add_argument("--kv-capacity-tokens", type=int, default=None, help="KV tokens per decode instance "
                     "(default: the profile's)")
    cmd.add_argument("--prefill-chunk-size", type=int, default=None,
                     help="default: the profile's; the device's default (auto) to profile")
    cmd.add_argument("--block-size", type=int, default=None,
                     help=f"default: the profile's; {CacheConfig.block_size} to profile")
    cmd.add_argument("--prefill-token-budget", type=int, default=None, help="prompt tokens a colocated node "
                     "prefills between two decode steps (default: the profile's; the engine's auto to profile)")
    cmd.add_argument("--device", default=EngineConfig.device, help="profiling: device")
    cmd.add_argument("--dtype", default=EngineConfig.dtype, choices=get_args(EngineDType),
                     help="the profiled engine's dtype (auto: the checkpoint's, bf16 where the GPU has it)")
    cmd.add_argument("--num-threads", type=int, default=None, help="CPU compute threads (default: torch's)")
    cmd.add_argument("--profile-lengths", default=None, help="profiling: prompt lengths, e.g. 64,256,1024")
    cmd.add_argument("--profile-contexts", default=None, help="profiling: decode contexts, e.g. 256,1024")
    cmd.add_argument("--profile-rows", default=None, help="profiling: active decode rows, e.g. 1,16,32")


def add_profile(commands) -> None:
    cmd = commands.add_parser("profile", help="measure a fixed_shape engine's prefill and decode-step costs and the KV "
                              "hand-off (a NIXL READ between two processes on --device) for `plan`")
    cmd.add_argument("--model", required=True, help="checkpoint to profile (or a random: preset)")
    cmd.add_argument("--out", dest="profile_out", required=True, help="where to write the profile JSON")
    add_profiling_flags(cmd)
    cmd.set_defaults(run=run_profile)


def run_plan(args) -> int:
    return run_plan_command(args)


def run_profile(args) -> int:
    profile = measure_profile(args)
    handoff = profile.kv_handoff
    print(f"profile of {args.model} written to {args.profile_out} ({len(profile.prefill_points)} prefill points, "
          f"{len(profile.decode_points)} decode points; KV hand-off {1e3 * handoff.per_request_s:.3g} ms + "
          f"{1e6 * handoff.per_token_s:.3g} us per prompt token, {handoff.source})")
    return 0


def run_plan_command(args) -> int:
    """Prints the plan as JSON (stdout) and its summary in a few lines (stderr); 0 when the recommendation (or,
    with none, the P:D plan) meets the SLO, 1 when not."""
    # NOTE: every input is checked before profiling, which may take minutes
    workload = read_workload(args)
    slo = SLO.from_ms(args.ttft_p99_ms, args.tpot_p99_ms)
    if args.simulate_requests < 0:
        raise ValueError(f"--simulate-requests must be >= 0, got {args.simulate_requests}")
    if args.gpus is not None and args.gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {args.gpus}")
    profile = PerformanceProfile.load(args.profile) if args.profile else measure_profile(args)
    model = PerformanceModel.fit(profile)
    if args.prefill_chunk_size is not None:
        model = model.with_chunk_size(args.prefill_chunk_size)
    decode = decode_config(args, profile)
    workload, num_rejected = split_too_long(workload, decode)
    result = plan(model, workload, slo, decode, max_utilization=args.max_utilization, kv_handoff=profile.kv_handoff)
    report = {"plan": result.to_dict(), "workload": workload.summary() | {"rejected_samples": num_rejected},
              "slo": dataclasses.asdict(slo), "decode_config": dataclasses.asdict(decode),
              "performance_model": model.summary(), "kv_handoff": dataclasses.asdict(profile.kv_handoff),
              "profile_source": profile.source}
    num_gpus = args.gpus or (result.num_prefill + result.num_decode if result.feasible else None)
    recommendation, summary = None, []
    if num_gpus is not None:
        cluster = ClusterModel.of(model, profile, decode, args.prefill_token_budget)
        recommendation, summary = recommend_deployment(args, cluster, workload, slo, num_gpus, report)
    elif args.plot:
        summary.append("No plot: no deployment to compare (pass --gpus).")
    summary.append(f"P:D sizing with no GPU limit: {result.reason}.")
    if args.simulate_requests and result.feasible:
        report["simulation"] = check_plan(result, model, workload, slo, decode, args.max_utilization,
                                          args.simulate_requests, args.seed)
    print("\n".join(summary), file=sys.stderr)
    print(json.dumps(report, indent=2))
    return 0 if (recommendation.meets_slo if recommendation else result.feasible) else 1


def recommend_deployment(args, cluster: ClusterModel, workload: Workload, slo: SLO, num_gpus: int,
                         report: dict) -> tuple[Recommendation, list[str]]:
    """The recommendation on num_gpus GPUs (into report) and its summary lines; the plot when --plot asks."""
    stats = WorkloadStats.of(workload, cluster.performance, cluster.node)
    recommendation = recommend(cluster, stats, slo, num_gpus, args.max_utilization)
    report["recommendation"] = recommendation.to_dict() | {"prefill_token_budget": cluster.prefill_token_budget}
    summary = list(recommendation.summary)
    if args.plot:
        write_plot(args.plot, rate_sweep(cluster, stats, slo, recommendation), slo, recommendation,
                   f"{workload.name}: {slo.describe_ms()}, {num_gpus} GPU(s) (predicted)")
        report["plot"] = args.plot
        summary.append(f"Plot: {args.plot}")
    return recommendation, summary


def read_workload(args) -> Workload:
    if args.workload:
        return named_workload(args.workload, args.rate, args.num_samples, args.seed)
    return Workload(args.rate, read_lengths(args.lengths), name=args.lengths)


def decode_config(args, profile: PerformanceProfile) -> DecodeConfig:
    # NOTE: a flag given overrides the profile; N must still match the profile's (plan() checks)
    values = {name: getattr(profile, name) if getattr(args, name) is None else getattr(args, name)
              for name in ("max_num_seqs", "kv_capacity_tokens", "max_model_len", "block_size")}
    missing = [name for name, value in values.items() if value is None]
    if missing:
        raise ValueError(f"the profile does not give {', '.join(missing)}: pass --{missing[0].replace('_', '-')}")
    swap_tokens = args.swap_kv_tokens if args.swap_kv_tokens is not None else profile.swap_capacity_tokens or 0
    return DecodeConfig(**values, swap_tokens=swap_tokens)


def measure_profile(args) -> PerformanceProfile:
    from planner.profiling import profile_engine  # NOTE: here, not at the top: it imports torch (as cli/bench.py)

    block_size = CacheConfig.block_size if args.block_size is None else args.block_size
    num_blocks = None if args.kv_capacity_tokens is None else args.kv_capacity_tokens // block_size + 1
    scheduler = {"max_num_seqs": args.max_num_seqs, "max_model_len": args.max_model_len,
                 "prefill_chunk_size": args.prefill_chunk_size, "prefill_token_budget": args.prefill_token_budget}
    config = EngineConfig(
        model=args.model, dtype=args.dtype, device=args.device, num_threads=args.num_threads,
        scheduler=SchedulerConfig(mode="fixed_shape", **{k: v for k, v in scheduler.items() if v is not None}),
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks))
    profile = profile_engine(config, int_list(args.profile_lengths), int_list(args.profile_contexts),
                             int_list(args.profile_rows),
                             progress=lambda line: print(f"corun {args.command}: {line}", file=sys.stderr, flush=True))
    if args.profile_out:
        profile.save(args.profile_out)
    return profile


def int_list(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
