"""fixed_shape vs mixed mode on one engine: output tokens/s, plus bs1-vs-bsN determinism and CUDA-graph facts.

    python -m benchmarks.engine_modes --device cpu --out benchmarks/results/cpu_engine_modes.json
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time

import torch

from benchmarks.harness import gpu_name
from benchmarks.report import emit
from corun import LLM, SamplingParams
from corun.models.tiny import make_tiny_model
from tests.conftest import varied_prompts


def throughput(llm: LLM, prompts: list[str], output_len: int) -> dict:
    params = SamplingParams(temperature=0.6, seed=42, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4))  # NOTE: warm-up (allocator, lazy init)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"output_tokens": num_tokens, "seconds": round(elapsed, 4),
            "output_tok_per_s": round(num_tokens / elapsed, 1)}


def bs1_vs_bsn(llm: LLM, prompts: list[str]) -> dict:
    params = SamplingParams(temperature=0.6, seed=42, max_tokens=16, logprobs=5, ignore_eos=True)
    alone = [llm.generate([p], params)[0].outputs[0] for p in prompts]
    together = [o.outputs[0] for o in llm.generate(prompts, params)]
    token_diffs = sum(a.token_ids != b.token_ids for a, b in zip(alone, together, strict=True))
    logprob_diffs = sum(a.logprobs != b.logprobs for a, b in zip(alone, together, strict=True))
    return {"prompts_with_different_tokens": token_diffs, "prompts_with_different_logprobs": logprob_diffs,
            "bitwise_identical": token_diffs == 0 and logprob_diffs == 0}


def run_mode(model_dir: str, mode: str, args) -> dict:
    llm = LLM(model_dir, mode=mode, max_num_seqs=args.max_num_seqs, max_model_len=1024, device=args.device,
              dtype=args.dtype, num_threads=args.num_threads)
    prompts = varied_prompts(args.num_requests, seed=0, max_words=args.max_prompt_words)
    result = {"throughput": throughput(llm, prompts, args.output_len)}
    result["determinism_bs1_vs_bs32"] = bs1_vs_bsn(llm, varied_prompts(32, seed=1))
    result["engine_stats"] = vars(llm.engine.stats)
    graph = llm.engine.runner.decode_graph
    result["cuda_graph"] = None if graph is None else {
        "captured_sizes": graph.sizes, "replays": graph.num_replays, "rows": llm.engine.runner.max_num_seqs,
        "decode_steps": llm.engine.stats.num_decode_steps}
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--max-prompt-words", type=int, default=120)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(make_tiny_model(tmp))
        report = {"args": vars(args), "torch": torch.__version__, "host": platform.processor() or platform.machine(),
                  "gpu": gpu_name() if torch.cuda.is_available() else None,
                  "modes": {mode: run_mode(model_dir, mode, args) for mode in ("fixed_shape", "mixed")}}
    modes = report["modes"]
    report["fixed_shape_over_mixed_throughput"] = round(
        modes["fixed_shape"]["throughput"]["output_tok_per_s"] / modes["mixed"]["throughput"]["output_tok_per_s"], 3)
    emit(report, args.out)


if __name__ == "__main__":
    main()
