"""`corun bench`: synthetic workloads through one engine per mode; throughput, TTFT, TPOT, decode step vs floor.

Every request arrives at t=0 (offline batch, as in model evaluation and RL rollouts). Per mode and workload:
output tokens/s, TTFT and TPOT p50/p99, and the median time of full decode steps next to the step's floor:
max(bytes of weights and KV read / measured copy bandwidth, FLOPs / measured bf16 GEMM rate).
"""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import time
from dataclasses import dataclass

import torch

from corun.config import EngineConfig
from corun.engine import LLMEngine
from corun.sampling_params import SamplingParams

WORKLOADS = {"1024x128": (1024, 128), "1024x2048": (1024, 2048), "4096x128": (4096, 128), "4096x2048": (4096, 2048)}


@dataclass(frozen=True)
class Workload:
    name: str
    lengths: tuple[tuple[int, int], ...]
    """(input tokens, output tokens) per request."""


def make_workload(name: str, num_requests: int, seed: int = 0) -> Workload:
    if name in WORKLOADS:
        return Workload(name, (WORKLOADS[name],) * num_requests)
    if name == "burstgpt":
        # NOTE: BurstGPT-like: long-tailed (lognormal) prompt and response lengths, few beyond 4k.
        rng = random.Random(seed)
        lengths = tuple((min(6144, max(16, int(rng.lognormvariate(6.2, 0.9)))),
                         min(2048, max(8, int(rng.lognormvariate(5.3, 1.0))))) for _ in range(num_requests))
        return Workload(name, lengths)
    raise ValueError(f"unknown workload {name!r} (have {[*WORKLOADS, 'burstgpt']})")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def measure_hardware(device: str) -> dict:
    """Copy bandwidth (bytes read + written per second) and bf16 GEMM rate, measured here and now."""
    if not device.startswith("cuda"):
        return {}
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    copy_s = timed(lambda: dst.copy_(src))
    gemm_s = timed(lambda: a @ a)
    return {"copy_bytes_per_s": 2 * src.numel() / copy_s, "bf16_flops_per_s": 2 * 8192**3 / gemm_s}


def timed(fn, repeats: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def step_floor(engine: LLMEngine, context_lens: list[int], num_rows: int, hardware: dict) -> float:
    """Seconds a decode step of num_rows rows over these contexts cannot beat on this GPU."""
    cfg, model = engine.runner.model.cfg, engine.runner.model
    elem = next(model.parameters()).element_size()
    weights = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n or cfg.tie_word_embeddings)
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * elem
    num_bytes = weights * elem + kv_per_token * sum(context_lens)
    flops = 2 * num_rows * weights + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * sum(context_lens)
    return max(num_bytes / hardware["copy_bytes_per_s"], flops / hardware["bf16_flops_per_s"])


def run_workload(engine: LLMEngine, workload: Workload, hardware: dict, seed: int = 0,
                 max_seconds: float | None = None) -> dict:
    """Run every request to its end, or until max_seconds pass; then the rest are aborted and the result is
    marked truncated (its tokens/s then covers the tokens made so far, TPOT the tokens each request made)."""
    rng = random.Random(seed)
    vocab = engine.runner.model.cfg.vocab_size
    requests = [engine.add_request(f"{workload.name}-{i}", [rng.randrange(vocab) for _ in range(num_in)],
                                   SamplingParams(temperature=0.6, seed=i, max_tokens=num_out, ignore_eos=True))
                for i, (num_in, num_out) in enumerate(workload.lengths)]
    first_at, last_at, decode_steps = {}, {}, []
    start = time.perf_counter()
    while engine.has_unfinished():
        if max_seconds is not None and time.perf_counter() - start > max_seconds:
            for request in requests:
                engine.abort_request(request)
            break
        decoding = [r for r in engine.scheduler.running if not r.is_prefilling]
        context_lens = [r.num_tokens for r in decoding]
        step_start = time.perf_counter()
        sampled = engine.step()
        now = time.perf_counter()
        # NOTE: a pure decode step samples exactly the requests that were decoding (ids, not list scans)
        if sampled and {id(s.request) for s in sampled} == {id(r) for r in decoding}:
            decode_steps.append((now - step_start, context_lens))
        for item in sampled:
            first_at.setdefault(item.request.request_id, now - start)
            last_at[item.request.request_id] = now - start
    elapsed = time.perf_counter() - start
    result = summarize(engine, requests, first_at, last_at, decode_steps, elapsed, hardware)
    result["truncated"] = any(r.finish_reason == "abort" for r in requests)
    return result


def summarize(engine, requests, first_at, last_at, decode_steps, elapsed, hardware) -> dict:
    num_tokens = sum(len(r.output_token_ids) for r in requests)
    ttfts = list(first_at.values())
    tpots = [(last_at[r.request_id] - first_at[r.request_id]) / (len(r.output_token_ids) - 1)
             for r in requests if len(r.output_token_ids) > 1]
    n = engine.config.scheduler.max_num_seqs
    full = [(t, ctx) for t, ctx in decode_steps if len(ctx) >= 0.9 * n] or decode_steps
    result = {"num_requests": len(requests), "num_finished": sum(r.finish_reason not in (None, "abort")
                                                                 for r in requests),
              "output_tokens": num_tokens, "seconds": round(elapsed, 3),
              "output_tok_per_s": round(num_tokens / elapsed, 1),
              "ttft_s": {"p50": round(percentile(ttfts, 0.5), 4), "p99": round(percentile(ttfts, 0.99), 4)},
              "tpot_ms": {"p50": round(1e3 * percentile(tpots, 0.5), 3),
                          "p99": round(1e3 * percentile(tpots, 0.99), 3)},
              "num_decode_steps": len(decode_steps)}
    if full and hardware:
        step_s = statistics.median(t for t, _ in full)
        rows = n if engine.config.scheduler.mode == "corun" else statistics.median(len(c) for _, c in full)
        floor_s = statistics.median(step_floor(engine, ctx, int(rows), hardware) for _, ctx in full)
        result["decode_step"] = {"median_ms": round(1e3 * step_s, 3), "floor_ms": round(1e3 * floor_s, 3),
                                 "over_floor": round(step_s / floor_s, 2), "median_active_rows": statistics.median(
                                     len(c) for _, c in full), "steps_measured": len(full)}
    return result


def run_bench(base: EngineConfig, modes: list[str], workloads: list[Workload], out: str | None = None,
              max_seconds: float | None = None) -> dict:
    hardware = measure_hardware(base.device)
    report = {"engine": dataclasses.asdict(base), "hardware": hardware, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None, "modes": {}}
    for mode in modes:
        config = dataclasses.replace(base, scheduler=dataclasses.replace(base.scheduler, mode=mode))
        engine = LLMEngine(config)
        report["modes"][mode] = {}
        for workload in workloads:
            report["modes"][mode][workload.name] = run_workload(engine, workload, hardware, max_seconds=max_seconds)
            if out:  # NOTE: written after every workload, so a run cut short still leaves its results
                with open(out, "w") as f:
                    json.dump(report, f, indent=2, default=str)
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return report


def add_bench(commands) -> None:
    from corun.engine_args import add_engine_args

    cmd = commands.add_parser("bench", help="throughput/TTFT/TPOT per mode on synthetic workloads (JSON)")
    add_engine_args(cmd)
    cmd.add_argument("--modes", default="corun,standard,batch_invariant")
    cmd.add_argument("--workloads", default="1024x128,1024x2048,4096x128,4096x2048,burstgpt")
    cmd.add_argument("--num-requests", type=int, default=256)
    cmd.add_argument("--max-seconds", type=float, default=None,
                     help="cut each (mode, workload) run after this long; its result is marked truncated")
    cmd.add_argument("--out", default=None)
    cmd.set_defaults(run=run_bench_command)


def run_bench_command(args) -> int:
    from corun.engine_args import engine_config_from_args

    base = engine_config_from_args(args)
    workloads = [make_workload(name, args.num_requests) for name in args.workloads.split(",")]
    report = run_bench(base, args.modes.split(","), workloads, args.out, args.max_seconds)
    report["command"] = vars(args) | {"run": None}
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0



