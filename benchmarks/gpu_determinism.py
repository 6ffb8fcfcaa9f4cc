"""The determinism suite on a GPU: bs1 vs bsN and needle, per mode, on the tiny model and a random 8B shape.

    python -m benchmarks.gpu_determinism --out benchmarks/results/h200_determinism.json

fixed_shape must be bitwise identical; mixed (cuBLAS + split-KV decode attention) should differ; batch_invariant
should be identical too (at its throughput cost).
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from benchmarks.harness import gpu_name, scheduler_for
from corun import LLM, SamplingParams
from wire.config import CacheConfig, EngineConfig, SchedulerConfig, canonical_mode_spec

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def token_prompts(num: int, vocab: int, seed: int, max_len: int = 300) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(5, max_len))] for _ in range(num)]


def bs1_vs_bsn(llm: LLM, prompts, params) -> dict:
    alone = [llm.generate([p], params)[0].outputs[0] for p in prompts]
    together = [o.outputs[0] for o in llm.generate(prompts, params)]
    diffs = [i for i, (a, b) in enumerate(zip(alone, together, strict=True))
             if a.token_ids != b.token_ids or a.logprobs != b.logprobs]
    return {"prompts": len(prompts), "prompts_differing": len(diffs), "identical": not diffs}


def needle(llm: LLM, vocab: int, params, num_trials: int = 4, max_batch: int = 64) -> dict:
    rng = random.Random(7)
    target = token_prompts(1, vocab, 99)[0]
    reference = llm.generate([target], params)[0].outputs[0]
    differing = 0
    for trial in range(num_trials):
        size = rng.randint(2, max_batch)
        others = token_prompts(size - 1, vocab, 1000 + trial)
        position = rng.randrange(size)
        prompts = others[:position] + [target] + others[position:]
        sampling = [SamplingParams(temperature=rng.choice([0.0, 0.6, 1.0]), seed=rng.randrange(2**31),
                                   max_tokens=rng.randint(1, 24), ignore_eos=True) for _ in prompts]
        sampling[position] = params
        out = llm.generate(prompts, sampling)[position].outputs[0]
        differing += out.token_ids != reference.token_ids or out.logprobs != reference.logprobs
    return {"trials": num_trials, "trials_differing": differing, "identical": differing == 0}


def run(model: str, dtype: str, mode: str, max_num_seqs: int, num_prompts: int) -> dict:
    """mode: a bench mode spec (benchmarks.harness.scheduler_for), e.g. fixed_shape:prefill_buckets=default."""
    scheduler = scheduler_for(SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=1024, prefill_chunk_size=256,
                                              max_num_batched_tokens=2048), mode)
    llm = LLM.from_config(EngineConfig(model=model, dtype=dtype, device=DEVICE, scheduler=scheduler,
                                       cache=CacheConfig(num_blocks=4096)))
    vocab = llm.engine.runner.model.cfg.vocab_size
    params = SamplingParams(temperature=0.6, seed=42, max_tokens=16, logprobs=5, ignore_eos=True)
    result = {"bs1_vs_bsn": bs1_vs_bsn(llm, token_prompts(num_prompts, vocab, 0), params),
              "needle": needle(llm, vocab, params, max_batch=min(64, max_num_seqs))}
    graphs, prefill_graphs = llm.engine.runner.decode_graph, llm.engine.runner.prefill_graph
    result["cuda_graphs"] = None if graphs is None else {"sizes": graphs.sizes, "replays": graphs.num_replays}
    result["prefill_graphs"] = None if prefill_graphs is None else {"sizes": prefill_graphs.sizes,
                                                                    "replays": prefill_graphs.num_replays}
    result["prefill_path"] = llm.engine.runner.prefill_path
    result["max_prefill_batch"] = llm.engine.stats.max_prefill_batch
    result["forward_counts"] = llm.engine.runner.forward_counts()  # NOTE: joined forwards, piecewise ones among them
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="random:qwen3-tiny:float32:32,random:qwen3-8b:bfloat16:256")
    parser.add_argument("--modes", default="fixed_shape,mixed,batch_invariant",
                        help="comma-separated mode specs (benchmarks.harness.scheduler_for)")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    gpu = gpu_name() if DEVICE == "cuda" else None
    report = {"gpu": gpu, "torch": torch.__version__, "results": {}}
    for spec in args.models.split(","):
        model, dtype, n = spec.rsplit(":", 2)
        for mode in map(canonical_mode_spec, args.modes.split(",")):
            key = f"{model}/{dtype}/N={n}/{mode}"
            report["results"][key] = run(model, dtype, mode, int(n), args.num_prompts)
            print(key, json.dumps(report["results"][key]), flush=True)
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
