"""Where one isolated prefill's GPU time goes, kernel by kernel (torch.profiler), next to its GEMM floor.

    python -m benchmarks.prefill_profile --lengths 64,4096 --out-dir DIR

Writes DIR/prefill_profile_<L>.txt: the kernels by total CUDA time over --repeats prefills of L tokens (max_tokens 1),
on the engine the bench runs (8B shape, bf16, N = 256, chunk 4096, the defaults' buckets).
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from corun.engine import LLMEngine
from wire.config import CacheConfig, EngineConfig, SchedulerConfig
from wire.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.6, seed=1, max_tokens=1, ignore_eos=True)


def one_request(engine: LLMEngine, prompt: list[int]) -> None:
    engine.add_request(f"r{time.perf_counter_ns()}", prompt, PARAMS)
    while engine.has_unfinished():
        engine.step()


def profile_table(engine: LLMEngine, prompt: list[int], repeats: int) -> str:
    for _ in range(2):
        one_request(engine, prompt)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            one_request(engine, prompt)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=90)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="random:qwen3-8b")
    parser.add_argument("--lengths", default="64,4096")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    config = EngineConfig(model=args.model, dtype="bfloat16", device="cuda", scheduler=SchedulerConfig(
        max_num_seqs=256, max_model_len=6144, prefill_chunk_size=4096), cache=CacheConfig(
        memory_budget_bytes=20000 * 2**20))
    engine = LLMEngine(config)
    rng, vocab = random.Random(0), engine.runner.arch.vocab_size
    for length in map(int, args.lengths.split(",")):
        prompt = [rng.randrange(vocab) for _ in range(length)]
        table = profile_table(engine, prompt, args.repeats)
        with open(f"{args.out_dir}/prefill_profile_{length}.txt", "w") as f:
            f.write(f"{args.repeats} prefills of {length} tokens\n{table}")
        print(length, table[:3000], flush=True)


if __name__ == "__main__":
    main()
