"""`python -m benchmarks.prefill_gaps --out FILE`: where an isolated prefill's wall time goes besides its kernels.

One engine as the bench runs it (8B shape, bf16, the defaults, chunk 4096), a prompt of --length tokens prefilled
alone (max_tokens 1) --repeats times under torch.profiler (CPU and CUDA). Per prefill, from the trace: the wall time
of the engine's steps, the GPU kernels' busy time (their intervals' union), the time before the first kernel (the
host building and copying the step's inputs), after the last one (sampling's read to the host, postprocess), and
between kernels. Writes FILE (JSON).
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from corun.engine import LLMEngine
from wire.config import CacheConfig, EngineConfig, SchedulerConfig
from wire.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.6, seed=1, max_tokens=1, ignore_eos=True)
WINDOW = "prefill_window"


def prefill_once(engine: LLMEngine, prompt: list[int]) -> float:
    """Prefill prompt alone (the step loop inside a profiler range named WINDOW) -> its wall seconds."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.profiler.record_function(WINDOW):
        engine.add_request(f"g{time.perf_counter_ns()}", prompt, PARAMS)
        while engine.has_unfinished():
            engine.step()
    return time.perf_counter() - start


def union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def split(windows: list[tuple[float, float]], kernels: list[tuple[float, float]]) -> list[dict]:
    rows = []
    for start, end in windows:
        inside = [(max(a, start), min(b, end)) for a, b in kernels if b > start and a < end]
        if not inside:
            continue
        first, last = min(a for a, _ in inside), max(b for _, b in inside)
        busy = union_us(inside)
        rows.append({"wall_ms": round((end - start) / 1e3, 3), "kernels_ms": round(busy / 1e3, 3),
                     "before_first_kernel_ms": round((first - start) / 1e3, 3),
                     "after_last_kernel_ms": round((end - last) / 1e3, 3),
                     "between_kernels_ms": round((last - first - busy) / 1e3, 3), "num_kernels": len(inside)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="random:qwen3-8b")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (no kernels to split)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", required=True)
    parser.add_argument("--trace", default=None, help="also write the profiler's Chrome trace here (gzip it after)")
    args = parser.parse_args()
    config = EngineConfig(model=args.model, dtype=args.dtype, device=args.device, scheduler=SchedulerConfig(
        max_num_seqs=256, max_model_len=args.length + 16, prefill_chunk_size=args.length), cache=CacheConfig(
        memory_budget_bytes=20000 * 2**20, enable_prefix_caching=False))
    engine = LLMEngine(config)
    rng = random.Random(0)
    prompt = [rng.randrange(engine.runner.arch.vocab_size) for _ in range(args.length)]
    for _ in range(2):
        prefill_once(engine, prompt)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.repeats):
            prefill_once(engine, prompt)
    if args.trace:
        prof.export_chrome_trace(args.trace)
    unprofiled = [prefill_once(engine, prompt) for _ in range(args.repeats)]
    # NOTE: kernels and the windows on the profiler's one clock (us): the windows are its CPU ranges named WINDOW
    events = prof.events()
    windows = [(e.time_range.start, e.time_range.end) for e in events
               if e.name == WINDOW and e.device_type == torch.autograd.DeviceType.CPU]
    kernels = [(e.time_range.start, e.time_range.end) for e in events
               if e.device_type == torch.autograd.DeviceType.CUDA]
    report = {"gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
              "windows": len(windows), "length": args.length, "prefill_path": engine.runner.prefill_path,
              "profiled": split(windows, kernels),
              "unprofiled_wall_ms": [round(1e3 * seconds, 3) for seconds in unprofiled]}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
