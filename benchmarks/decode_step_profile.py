"""Where a full decode step's time goes: input building, graph replay, sampling, host post-processing.

    python -m benchmarks.decode_step_profile --model random:qwen3-8b --max-num-seqs 256 --prompt-len 1024
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from corun.config import CacheConfig, EngineConfig, SchedulerConfig
from corun.engine import LLMEngine
from corun.sampling_params import SamplingParams
from corun.step_inputs import build_window_decode


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
    parser.add_argument("--modes", default="corun")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report = {}
    for mode in args.modes.split(","):
        config = EngineConfig(model=args.model, dtype=args.dtype, device=device, scheduler=SchedulerConfig(
            mode=mode, max_num_seqs=args.max_num_seqs, max_model_len=args.prompt_len + 256,
            prefill_chunk_size=args.prompt_len, max_num_batched_tokens=args.prompt_len * 4),
            cache=CacheConfig(num_blocks=args.max_num_seqs * (args.prompt_len + 256) // 16 + 64))
        engine = LLMEngine(config)
        rng = random.Random(0)
        vocab = engine.runner.model.cfg.vocab_size
        for i in range(args.max_num_seqs):
            engine.add_request(str(i), [rng.randrange(vocab) for _ in range(args.prompt_len)],
                               SamplingParams(temperature=0.6, seed=i, max_tokens=200, ignore_eos=True))
        while any(r.is_prefilling or not r.output_token_ids for r in engine.scheduler.running) or \
                engine.scheduler.waiting:
            engine.step()
        runner, requests = engine.runner, list(engine.scheduler.running)
        rows = runner.num_rows
        inputs = build_window_decode(requests, rows, runner.window_blocks, runner.block_size)
        logits = runner.decode_logits(requests, rows)
        result = {
            "build_inputs_ms": timed_ms(lambda: build_window_decode(requests, rows, runner.window_blocks,
                                                                     runner.block_size)),
            "model_step_ms": timed_ms(lambda: runner.decode_graph.replay(inputs) if runner.decode_graph
                                      else runner.decode_logits(requests, rows)),
            "sample_ms": timed_ms(lambda: runner.sample(logits, requests)),
            "engine_step_ms": timed_ms(engine.step, repeats=20),
        }
        report[mode] = result
        print(mode, json.dumps(result), flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
