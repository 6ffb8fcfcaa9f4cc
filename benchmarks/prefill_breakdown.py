"""Where an isolated short prefill's time goes on the GPU: its parts timed one by one (each ends synchronised)
and a torch.profiler table of whole engine steps.

    python -m benchmarks.prefill_breakdown --out-dir DIR
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from corun.engine import LLMEngine
from corun.request import Request
from corun.scheduler import PrefillChunk
from corun.step_inputs import build_prefill_pack
from wire.config import DEFAULT_PREFILL_BUCKETS, CacheConfig, EngineConfig, SchedulerConfig
from wire.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.6, seed=1, max_tokens=1, ignore_eos=True)


def timed_ms(fn, repeats: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return round(1e3 * best, 3)


def one_request(engine: LLMEngine, prompt: list[int]) -> None:
    engine.add_request(f"r{time.perf_counter_ns()}", prompt, PARAMS)
    while engine.has_unfinished():
        engine.step()


def parts(engine: LLMEngine, length: int) -> dict:
    runner, rng = engine.runner, random.Random(0)
    prompt = [rng.randrange(runner.model.cfg.vocab_size) for _ in range(length)]
    request = Request("probe", prompt, PARAMS, 1, frozenset())
    request.block_ids = engine.block_manager.allocate(length)
    chunk = PrefillChunk(request, 0, length)
    rows = engine.config.scheduler.prefill_rows(length)
    inputs = build_prefill_pack([chunk], rows, 1, runner.block_size, runner.table_rows)
    logits = runner.padded_prefill_logits(inputs)
    result = {
        "rows": rows,
        "engine_request_ms": timed_ms(lambda: one_request(engine, prompt)),
        "build_inputs_ms": timed_ms(lambda: build_prefill_pack([chunk], rows, 1, runner.block_size,
                                                               runner.table_rows)),
        "padded_forward_ms": timed_ms(lambda: runner.padded_prefill_logits(inputs)),
        "natural_forward_ms": timed_ms(lambda: runner.natural_prefill_logits(chunk)),
        "sample_ms": timed_ms(lambda: runner.sample(logits, [request])),
    }
    if runner.prefill_graph is not None:
        graph, static, _ = runner.prefill_graph.graphs[rows]
        result["graph_replay_only_ms"] = timed_ms(graph.replay)
        result["copy_inputs_ms"] = timed_ms(lambda: inputs.copy_to(static))
    engine.block_manager.free(request.block_ids)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="random:qwen3-8b")
    parser.add_argument("--lengths", default="16,64,512")
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    config = EngineConfig(model=args.model, dtype="bfloat16", device="cuda", scheduler=SchedulerConfig(
        max_num_seqs=256, max_model_len=6144, prefill_chunk_size=4096, prefill_buckets=DEFAULT_PREFILL_BUCKETS),
        cache=CacheConfig(memory_budget_bytes=20000 * 2**20))
    engine = LLMEngine(config)
    report = {str(length): parts(engine, length) for length in map(int, args.lengths.split(","))}
    print(json.dumps(report, indent=1), flush=True)
    prompt = [1] * 64
    one_request(engine, prompt)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            one_request(engine, prompt)
        torch.cuda.synchronize()
    with open(f"{args.out_dir}/prefill_breakdown.json", "w") as f:
        json.dump(report, f, indent=1)
    with open(f"{args.out_dir}/prefill_profile.txt", "w") as f:
        f.write(prof.key_averages().table(sort_by="cpu_time_total", row_limit=40))
        f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))


if __name__ == "__main__":
    main()
