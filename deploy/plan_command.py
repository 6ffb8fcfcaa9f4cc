"""`corun plan`: flags -> profile, workload, SLO and decode config -> the plan (and its simulation) as JSON."""

from __future__ import annotations

import dataclasses
import json

from deploy.perf_profile import PerformanceModel, PerformanceProfile, profile_engine
from deploy.plan_sim import check_plan
from deploy.planner import SLO, DecodeConfig, Workload, named_workload, plan, read_lengths, split_too_long


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
    from corun.config import CacheConfig, EngineConfig, SchedulerConfig

    block_size = CacheConfig.block_size if args.block_size is None else args.block_size
    num_blocks = None if args.kv_capacity_tokens is None else args.kv_capacity_tokens // block_size + 1
    scheduler = {"max_num_seqs": args.max_num_seqs, "max_model_len": args.max_model_len,
                 "prefill_chunk_size": args.prefill_chunk_size}
    config = EngineConfig(
        model=args.model, dtype=args.dtype, device=args.device, num_threads=args.num_threads,
        scheduler=SchedulerConfig(mode="corun", **{k: v for k, v in scheduler.items() if v is not None}),
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks))
    profile = profile_engine(config, int_list(args.profile_lengths), int_list(args.profile_contexts),
                             int_list(args.profile_rows))
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
