"""`python -m benchmarks.swap_host_time --model DIR --out FILE`: the host time an engine's swap space costs a decode
step (corun/swap_preemption.py: prepare_blocks and ready_to_step), with and without a swap space.

N requests are prefilled, then the scheduler's two calls are timed over --steps decode steps of N rows. Host time
only: on a GPU these run while the step in flight computes (async scheduling), so they cost a step nothing until
they outgrow it.
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
    spent = {"prepare_blocks": 0.0, "ready_to_step": 0.0}
    prepare, ready = scheduler.prepare_blocks, scheduler.ready_to_step

    def timed_prepare():
        start = time.perf_counter()
        prepare()
        spent["prepare_blocks"] += time.perf_counter() - start

    def timed_ready(decoding):
        start = time.perf_counter()
        stepping = ready(decoding)
        spent["ready_to_step"] += time.perf_counter() - start
        return stepping
    scheduler.prepare_blocks, scheduler.ready_to_step = timed_prepare, timed_ready
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
