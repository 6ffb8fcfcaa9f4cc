"""Where a decode step's time goes: input building, graph replay, sampling, host post-processing.

    python -m benchmarks.decode_step_profile --model random:qwen3-8b --max-num-seqs 256 --prompt-len 1024

--num-requests K profiles a step of K running requests instead of N: the tail of a t = 0 run, where each mode runs
the graph it picks for K rows (fixed_shape: its smallest verified decode size; mixed: the next captured size).
--num-requests 1,8 profiles each count in turn on one engine per mode (requests are added to reach the next count).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time

import torch

from benchmarks.harness import measure_hardware, scheduler_for, step_floor
from benchmarks.report import emit
from corun.engine import LLMEngine
from corun.step_inputs import build_window_decode
from wire.config import CacheConfig, EngineConfig, SchedulerConfig, canonical_mode_spec
from wire.sampling_params import SamplingParams


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_ms(fn, repeats: int = 20) -> float:
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        samples.append(1e3 * (time.perf_counter() - start))
    return round(statistics.median(samples), 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="random:qwen3-8b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--num-requests", default=None,
                        help="running requests, or ascending counts separated by commas (default: N)")
    parser.add_argument("--modes", default="fixed_shape")
    parser.add_argument("--kernel-profile", action="store_true",
                        help="also run one eager step under torch.profiler and total the GPU time per kernel")
    parser.add_argument("--step-profile", action="store_true",
                        help="also run engine steps under torch.profiler: GPU busy time per step against its wall time")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report = {}
    counts = [int(c) for c in args.num_requests.split(",")] if args.num_requests else [args.max_num_seqs]
    if counts != sorted(counts):
        parser.error("--num-requests: counts must ascend (requests are only added)")
    for mode in map(canonical_mode_spec, args.modes.split(",")):
        by_count = profile_mode(args, mode, device, counts)  # NOTE: its engine is freed on return: two 8B engines
        report[mode] = by_count[0] if len(counts) == 1 else {str(c): r for c, r in zip(counts, by_count)}  # with
        print(mode, json.dumps(report[mode]), flush=True)  # their KV do not fit one GPU
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    emit(report, args.out)


def profile_mode(args, mode: str, device: str, counts: list[int]) -> list[dict]:
    base = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_model_len=args.prompt_len + 256,
                           prefill_chunk_size=args.prompt_len, max_num_batched_tokens=args.prompt_len * 4)
    config = EngineConfig(model=args.model, dtype=args.dtype, device=device, scheduler=scheduler_for(base, mode),
        cache=CacheConfig(num_blocks=args.max_num_seqs * (args.prompt_len + 256) // CacheConfig.block_size + 64))
    engine = LLMEngine(config)
    rng = random.Random(0)
    vocab = engine.runner.model.cfg.vocab_size
    results, added = [], 0
    for count in counts:
        for i in range(added, count):
            engine.add_request(str(i), [rng.randrange(vocab) for _ in range(args.prompt_len)],
                               SamplingParams(temperature=0.6, seed=i, max_tokens=200, ignore_eos=True))
        added = count
        results.append(profile_running(args, engine, device))
    return results


def profile_running(args, engine: LLMEngine, device: str) -> dict:
    while any(r.is_prefilling or not r.output_token_ids for r in engine.scheduler.running) or \
            engine.scheduler.waiting:
        engine.step()
    runner, requests = engine.runner, list(engine.scheduler.running)
    rows = runner.decode_graph.size_for(len(requests)) if runner.decode_graph else runner.max_num_seqs
    inputs = build_window_decode(requests, rows, runner.window_blocks, runner.block_size, runner.table_rows)
    # NOTE: as each mode samples: fixed_shape every row of its step, mixed its running requests' rows
    sampled_rows = rows if runner.mode == "fixed_shape" else len(requests)
    logits = runner.decode_logits(requests, rows)[:sampled_rows]
    result = {
        "graph_rows": rows, "running_requests": len(requests),
        "build_inputs_ms": timed_ms(lambda: build_window_decode(requests, rows, runner.window_blocks,
                                                                 runner.block_size, runner.table_rows)),
        "model_step_ms": timed_ms(lambda: runner.decode_graph.replay(rows, inputs) if runner.decode_graph
                                  else runner.decode_logits(requests, rows)),
        "sample_ms": timed_ms(lambda: runner.sample(logits, requests)),
        "engine_step_ms": timed_ms(engine.step, repeats=20),
    }
    if args.kernel_profile:
        result["eager_kernels"] = kernel_profile(runner, inputs)
    if args.step_profile:
        result["engine_steps"] = step_profile(engine)
    result["floor_ms"] = round(1e3 * step_floor(engine, [r.num_tokens for r in requests], rows,
                                                measure_hardware(device)), 3) if device == "cuda" else None
    return result


def kernel_profile(runner, inputs, top: int = 25) -> dict:
    """GPU time per kernel name over one eager decode step (the graph replays the same kernels)."""
    from torch.profiler import ProfilerActivity, profile

    splits = runner.kv_splits(len(inputs.input_ids))
    static = inputs.to(runner.device)
    runner.window_decode_logits(static, splits, runner.kv_split_tokens)
    sync()
    kind = "CUDA" if runner.on_cuda else "CPU"  # NOTE: CPU totals nest ops in ops; only CUDA's are exclusive
    with profile(activities=[getattr(ProfilerActivity, kind)]) as prof:
        runner.window_decode_logits(static, splits, runner.kv_split_tokens)
        sync()
    totals: dict[str, float] = {}
    for event in prof.events():
        if event.device_type.name == kind:
            totals[event.name] = totals.get(event.name, 0.0) + event.time_range.elapsed_us() / 1e3
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    return {"total_ms": round(sum(totals.values()), 3),
            "top_ms": {name[:120]: round(ms, 3) for name, ms in ranked[:top]}}


def step_profile(engine: LLMEngine, num_steps: int = 10) -> dict:
    """Whole engine steps (schedule, inputs, graph, sampler, postprocess): how much of a step's wall time the GPU
    computes, so a slower step shows whether the host or the kernels cost the difference."""
    from torch.profiler import ProfilerActivity, profile

    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(num_steps):
            engine.step()
        sync()
        wall_ms = 1e3 * (time.perf_counter() - start) / num_steps
    gpu: dict[str, float] = {}
    for event in prof.events():
        if event.device_type.name == "CUDA":
            gpu[event.name] = gpu.get(event.name, 0.0) + event.time_range.elapsed_us() / 1e3 / num_steps
    busy = sum(gpu.values())
    ranked = sorted(gpu.items(), key=lambda kv: -kv[1])[:12]
    return {"wall_ms": round(wall_ms, 3), "gpu_busy_ms": round(busy, 3), "gpu_idle_ms": round(wall_ms - busy, 3),
            "top_gpu_ms": {name[:100]: round(ms, 3) for name, ms in ranked}}


if __name__ == "__main__":
    main()
