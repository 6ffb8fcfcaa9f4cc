"""`python -m benchmarks.swap_host_time --model DIR --out FILE`: the host time an engine's swap space costs a decode
step (corun/swap_preemption.py prepare_blocks, which gives the decoding requests ready to step), with and without a
swap space.

N requests are prefilled, then prepare_blocks is timed over --steps decode steps of N rows. Host time only: on a GPU
it runs while the step in flight computes (async scheduling), so it costs a step nothing until it outgrows it.
NOTE: the committed results (benchmarks/results/cpu_swap_host_time_*.json) timed prepare_blocks and ready_to_step
apart, from before stop 55's review folded the second into the first: compare their sum.
"""

from __future__ import annotations

import argparse
import json
import time

from corun import SamplingParams
from corun.engine import LLMEngine
from wire.config import MIB, CacheConfig, EngineConfig, SchedulerConfig


def host_time(model: str, rows: int, steps: int, swap_mib: int) -> dict:
    config = EngineConfig(model=model, num_threads=2, scheduler=SchedulerConfig(max_num_seqs=rows, max_model_len=1024),
                          cache=CacheConfig(num_blocks=rows * 70, swap_space_bytes=swap_mib * MIB))
    engine = LLMEngine(config)
    scheduler = engine.scheduler
    params = SamplingParams(temperature=0.7, seed=1, max_tokens=900, ignore_eos=True)
    for i in range(rows):
        engine.add_request(f"r{i}", list(range(5, 37)), params)
    while scheduler.waiting or any(r.is_prefilling for r in scheduler.running):
        engine.step()
    spent = {"prepare_blocks": 0.0}
    prepare = scheduler.prepare_blocks

    def timed_prepare():
        start = time.perf_counter()
        ready = prepare()
        spent["prepare_blocks"] += time.perf_counter() - start
        return ready
    scheduler.prepare_blocks = timed_prepare
    for _ in range(steps):
        engine.step()
    return {"swap_space_mib": swap_mib, "rows": len(scheduler.running),
            **{f"{name}_us_per_step": round(1e6 * seconds / steps, 1) for name, seconds in spent.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/tiny", help="checkpoint (the built-in tiny model's directory)")
    parser.add_argument("--rows", type=int, default=256, help="decoding requests")
    parser.add_argument("--steps", type=int, default=60, help="decode steps timed")
    parser.add_argument("--out", required=True, help="where to write the JSON")
    args = parser.parse_args()
    runs = [host_time(args.model, args.rows, args.steps, swap_mib) for swap_mib in (0, 256)]
    for run in runs:
        print(json.dumps(run), flush=True)
    with open(args.out, "w") as f:
        json.dump({"command": "python -m benchmarks.swap_host_time " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
