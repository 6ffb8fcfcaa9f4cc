"""`corun profile` and `corun plan`: flags -> profile, workload, SLO and decode config -> the plan (and its simulation)
as JSON."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import get_args

from planner.perf_profile import PerformanceModel, PerformanceProfile
from planner.plan import SLO, DecodeConfig, Workload, named_workload, plan, read_lengths, split_too_long
from planner.plan_sim import check_plan
from planner.profiling import profile_engine
from wire.config import CacheConfig, DType, EngineConfig, SchedulerConfig


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
    cmd.add_argument("--ttft-p99", type=float, required=True, help="TTFT p99 target, seconds")
    cmd.add_argument("--tpot", type=float, required=True, help="TPOT p99 target, milliseconds")
    add_profiling_flags(cmd)
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
                     help=f"N (default: the profile's; {SchedulerConfig.max_num_seqs} to profile)")
    cmd.add_argument("--max-model-len", type=int, default=None,
                     help=f"default: the profile's; {SchedulerConfig.max_model_len} to profile")
    cmd.add_argument("--kv-capacity-tokens", type=int, default=None, help="KV tokens per decode instance "
                     "(default: the profile's)")
    cmd.add_argument("--prefill-chunk-size", type=int, default=None,
                     help=f"default: the profile's; {SchedulerConfig.prefill_chunk_size} to profile")
    cmd.add_argument("--block-size", type=int, default=None,
                     help=f"default: the profile's; {CacheConfig.block_size} to profile")
    cmd.add_argument("--device", default=EngineConfig.device, help="profiling: device")
    cmd.add_argument("--dtype", default=EngineConfig.dtype, choices=get_args(DType))
    cmd.add_argument("--num-threads", type=int, default=None)
    cmd.add_argument("--profile-lengths", default=None, help="profiling: prompt lengths, e.g. 64,256,1024")
    cmd.add_argument("--profile-contexts", default=None, help="profiling: decode contexts, e.g. 256,1024")
    cmd.add_argument("--profile-rows", default=None, help="profiling: active decode rows, e.g. 1,16,32")


def add_profile(commands) -> None:
    cmd = commands.add_parser("profile", help="measure a fixed_shape engine's prefill and decode-step costs for `plan`")
    cmd.add_argument("--model", required=True, help="checkpoint to profile (or a random: preset)")
    cmd.add_argument("--out", dest="profile_out", required=True, help="where to write the profile JSON")
    add_profiling_flags(cmd)
    cmd.set_defaults(run=run_profile)


def run_plan(args) -> int:
    return run_plan_command(args)


def run_profile(args) -> int:
    profile = measure_profile(args)
    print(f"profile of {args.model} written to {args.profile_out} ({len(profile.prefill_points)} prefill points, "
          f"{len(profile.decode_points)} decode points)")
    return 0


def run_plan_command(args) -> int:
    """Prints the plan as JSON; 0 when feasible, 1 when no number of instances meets the SLO."""
    # NOTE: every input is checked before profiling, which may take minutes
    workload = read_workload(args)
    slo = SLO(ttft_p99_s=args.ttft_p99, tpot_p99_s=args.tpot / 1e3)
    if args.simulate_requests < 0:
        raise ValueError(f"--simulate-requests must be >= 0, got {args.simulate_requests}")
    profile = PerformanceProfile.load(args.profile) if args.profile else measure_profile(args)
    model = PerformanceModel.fit(profile)
    if args.prefill_chunk_size is not None:
        model = model.with_chunk_size(args.prefill_chunk_size)
    decode = decode_config(args, profile)
    workload, num_rejected = split_too_long(workload, decode)
    result = plan(model, workload, slo, decode, max_utilization=args.max_utilization)
    report = {"plan": result.to_dict(), "workload": workload.summary() | {"rejected_samples": num_rejected},
              "slo": dataclasses.asdict(slo), "decode_config": dataclasses.asdict(decode),
              "performance_model": model.summary(), "profile_source": profile.source}
    if args.simulate_requests and result.feasible:
        report["simulation"] = check_plan(result, model, workload, slo, decode, args.max_utilization,
                                          args.simulate_requests, args.seed)
    print(json.dumps(report, indent=2))
    return 0 if result.feasible else 1


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
    return DecodeConfig(**values)


def measure_profile(args) -> PerformanceProfile:
    block_size = CacheConfig.block_size if args.block_size is None else args.block_size
    num_blocks = None if args.kv_capacity_tokens is None else args.kv_capacity_tokens // block_size + 1
    scheduler = {"max_num_seqs": args.max_num_seqs, "max_model_len": args.max_model_len,
                 "prefill_chunk_size": args.prefill_chunk_size}
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
