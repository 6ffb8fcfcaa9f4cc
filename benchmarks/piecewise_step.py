"""One mixed-mode step, eager against the piecewise CUDA graphs (corun/piecewise_graphs.py), by phase.

    python -m benchmarks.piecewise_step --model random:qwen3-8b --dtype bfloat16 --kv-cache-mib 112000 --out FILE

A step of D decoding requests (contexts of C tokens) and one prompt chunk of P tokens is built once per (D, P)
and run --repeats times each way; per way the best time, and for the pieces the time in loading the buffers,
in graph replays and in eager attention (each phase synchronised, so the phases do not overlap). The allocator's
retries (a cudaMalloc that failed and freed the cache first) are counted: a step that triggers them is
memory-bound, not compute-bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import time

import torch

from corun.block_manager import BlockManager
from corun.engine import LLMEngine
from corun.request import Request
from corun.scheduler import PrefillChunk
from wire.config import CacheConfig, EngineConfig, SchedulerConfig
from wire.sampling_params import SamplingParams

CASES = ((0, 1, 512), (64, 1, 512), (256, 1, 1792), (16, 1, 4096), (0, 40, 200), (0, 8, 1000), (128, 20, 300))
"""(decoding requests, prompt chunks, tokens per chunk): one chunk as in a Poisson step, many as at t = 0."""


def mixed_step(engine: LLMEngine, blocks: BlockManager, num_decodes: int, context: int, num_chunks: int,
               prompt_tokens: int):
    params = SamplingParams(max_tokens=16)
    requests = []
    for i in range(num_decodes + num_chunks):
        prompt = [(7 * i + j) % 1000 + 3 for j in range(prompt_tokens if i >= num_decodes else context)]
        request = Request(f"s{i}", prompt, params, 0, frozenset())
        request.block_ids = blocks.allocate(request.max_num_tokens)
        requests.append(request)
    for request in requests[:num_decodes]:  # NOTE: decoding: KV "written" (whatever the blocks hold), one output
        request.num_computed_tokens = context
        request.output_token_ids.append(5)
    chunks = [PrefillChunk(r, 0, prompt_tokens) for r in requests[num_decodes:]]
    return engine.runner.mixed_inputs(requests[:num_decodes], num_decodes, chunks), requests


def timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def phases(pieces, inputs) -> dict:
    """The piecewise forward with each phase synchronised (PiecewiseForward.forward, unrolled)."""
    size = pieces.size_for(len(inputs.input_ids))
    b = pieces.buffers.first(size)
    out = {"load": 0.0, "replay": 0.0, "attention": 0.0}

    def clock(name, fn):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out[name] += time.perf_counter() - start

    meta = inputs.meta
    clock("load", lambda: b.load(inputs.input_ids, inputs.positions, meta.slot_blocks, meta.slot_offsets))
    attention_meta = dataclasses.replace(meta, slot_blocks=b.slot_blocks, slot_offsets=b.slot_offsets)
    for piece in range(pieces.num_pieces):
        clock("replay", pieces.graphs[size][piece].replay)
        if piece < len(pieces.model.layers):
            clock("attention", lambda p=piece: b.attn_out.copy_(pieces.model.attend(
                p, b.q, b.k, b.v, pieces.kv_layers[p], attention_meta)))
    return {name: round(1e3 * seconds, 3) for name, seconds in out.items()} | {"size": size}


def fresh_shape_steps(engine: LLMEngine, config: EngineConfig, context: int, num_steps: int = 4) -> dict:
    """Eager 8-chunk steps whose chunk lengths are new each time (as at t = 0 in a bench, unlike the repeated
    steps above), in this engine and in one built without the piecewise graphs: ms per step, first to last."""
    def steps(runner) -> list[float]:
        times = []
        for step in range(num_steps):
            blocks = BlockManager(runner.kv_cache.num_blocks, config.cache.block_size)
            inputs, _ = mixed_step(engine, blocks, 0, context, 8, 1000 + 7 * step + 1)
            times.append(round(1e3 * timed(lambda: runner.forward(inputs), 1), 1))
        return times

    with_graphs = steps(engine.runner)
    engine.runner.piecewise_forward = None
    gc.collect()
    torch.cuda.empty_cache()
    plain = LLMEngine(dataclasses.replace(config, scheduler=dataclasses.replace(config.scheduler,
                                                                                piecewise_graphs=False)))
    return {"with_piecewise_graphs_ms": with_graphs, "without_ms": steps(plain.runner)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random:qwen3-8b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--kv-cache-mib", type=int, default=112000)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--fresh-shapes", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    config = EngineConfig(model=args.model, dtype=args.dtype, device="cuda", scheduler=SchedulerConfig(
        mode="mixed", max_num_seqs=256, max_model_len=6144, prefill_chunk_size=4096,
        max_num_batched_tokens=args.max_num_batched_tokens, piecewise_graphs=True),
        cache=CacheConfig(memory_budget_bytes=args.kv_cache_mib * 2**20))
    start = time.perf_counter()
    engine = LLMEngine(config)
    report = {"build_s": round(time.perf_counter() - start, 1), "kv_cache_mib": args.kv_cache_mib,
              "memory_after_build_gib": round(torch.cuda.memory_reserved() / 2**30, 2),
              "free_gib": round(torch.cuda.mem_get_info()[0] / 2**30, 2), "cases": []}
    runner, pieces = engine.runner, engine.runner.piecewise_forward
    for num_decodes, num_chunks, prompt_tokens in CASES:
        blocks = BlockManager(runner.kv_cache.num_blocks, config.cache.block_size)
        inputs, _ = mixed_step(engine, blocks, num_decodes, args.context, num_chunks, prompt_tokens)
        if pieces.size_for(len(inputs.input_ids)) is None:  # NOTE: such steps run eagerly in an engine
            continue
        retries = torch.cuda.memory_stats().get("num_alloc_retries", 0)
        eager = timed(lambda: runner.forward(inputs), args.repeats)
        piecewise = timed(lambda: pieces.forward(inputs.input_ids, inputs.positions, inputs.meta), args.repeats)
        case = {"decodes": num_decodes, "chunks": num_chunks, "prompt_tokens": prompt_tokens,
                "eager_ms": round(1e3 * eager, 3),
                "piecewise_ms": round(1e3 * piecewise, 3), "phases_ms": phases(pieces, inputs),
                "alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries}
        print(json.dumps(case), flush=True)
        report["cases"].append(case)
    if args.fresh_shapes:
        report["fresh_shapes"] = fresh_shape_steps(engine, config, args.context)
        print(json.dumps(report["fresh_shapes"]), flush=True)
    if args.profile:  # NOTE: where a many-chunk piecewise step spends its time
        blocks = BlockManager(runner.kv_cache.num_blocks, config.cache.block_size)
        inputs, _ = mixed_step(engine, blocks, 0, args.context, 40, 200)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            pieces.forward(inputs.input_ids, inputs.positions, inputs.meta)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=18), flush=True)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps({k: v for k, v in report.items() if k != "cases"}))


if __name__ == "__main__":
    main()
