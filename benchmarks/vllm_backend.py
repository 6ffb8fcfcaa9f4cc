"""The vLLM engine backend on this CPU host: CoRun's rules (mode fixed_shape) next to vLLM's own scheduling (mode
mixed), side by side in one run, on the same requests (run in .venv-vllm).

    .venv-vllm/bin/python -m benchmarks.vllm_backend --out benchmarks/results/cpu_vllm_backend.json

Each mode: a colocated VllmEngine, every request arriving at t = 0; output tokens/s, mean and p99 time to first
token, and what its determinism costs: whether each request's tokens and logprobs equal its run alone.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from planner.workloads import make_workload
from wire.config import CacheConfig, EngineConfig, SchedulerConfig
from wire.sampling_params import SamplingParams


def run_requests(engine, requests: list[tuple[list[int], SamplingParams]]) -> dict:
    start = time.perf_counter()
    added = [engine.add_request(f"r{i}-{random.random()}", p, q) for i, (p, q) in enumerate(requests)]
    first_token_s = {}
    while engine.has_unfinished():
        engine.step()
        for request in added:
            if request.output_token_ids and id(request) not in first_token_s:
                first_token_s[id(request)] = time.perf_counter() - start
    seconds = time.perf_counter() - start
    ttft = sorted(first_token_s.values())
    return {"seconds": round(seconds, 3), "output_tokens": sum(len(r.output_token_ids) for r in added),
            "output_tok_per_s": round(sum(len(r.output_token_ids) for r in added) / seconds, 1),
            "ttft_mean_s": round(statistics.mean(ttft), 3), "ttft_p99_s": round(ttft[int(0.99 * (len(ttft) - 1))], 3),
            "outputs": [(r.output_token_ids, [lp.logprob for lp in r.output_logprobs]) for r in added]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--workload", default="burstgpt")
    parser.add_argument("--num-requests", type=int, default=48)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--prefill-chunk-size", type=int, default=256)
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--check-alone", type=int, default=12, help="requests also run alone, for the bit check")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from corun.vllm_backend.engine import VllmEngine

    rng = random.Random(0)
    lengths = [(min(i, args.max_model_len // 2), min(o, args.max_model_len // 2))
               for i, o in make_workload(args.workload, args.num_requests).lengths]
    requests = [([rng.randrange(2047) for _ in range(i)],
                 SamplingParams(temperature=0.7, seed=n, max_tokens=o, logprobs=1, ignore_eos=True))
                for n, (i, o) in enumerate(lengths)]
    report = {"command": vars(args), "lengths": lengths, "modes": {}}
    for mode in ("fixed_shape", "mixed"):
        config = EngineConfig(model=args.model, backend="vllm", num_threads=args.num_threads,
                              scheduler=SchedulerConfig(mode=mode, max_num_seqs=args.max_num_seqs,
                                                        max_model_len=args.max_model_len,
                                                        prefill_chunk_size=args.prefill_chunk_size,
                                                        max_num_batched_tokens=args.prefill_chunk_size),
                              cache=CacheConfig(block_size=32, memory_budget_bytes=512 * 2**20))
        engine = VllmEngine(config)
        run_requests(engine, requests[:2])  # NOTE: warm-up: vLLM compiles some sampler ops at their first call
        together = run_requests(engine, requests)
        alone = [run_requests(engine, [request])["outputs"][0] for request in requests[:args.check_alone]]
        outputs = together.pop("outputs")
        together["alone_vs_together_differing"] = sum(a != b for a, b in zip(alone, outputs, strict=False))
        together["checked_alone"] = len(alone)
        report["modes"][mode] = together
        del engine
    fixed_shape, mixed = report["modes"]["fixed_shape"], report["modes"]["mixed"]
    report["fixed_shape_over_mixed_tok_per_s"] = round(fixed_shape["output_tok_per_s"] / mixed["output_tok_per_s"], 3)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps({mode: {k: v for k, v in r.items()} for mode, r in report["modes"].items()}, indent=2))
    print("fixed_shape / mixed output tok/s:", report["fixed_shape_over_mixed_tok_per_s"])


if __name__ == "__main__":
    main()
