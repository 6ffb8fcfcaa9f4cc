"""Issue 24: what structured outputs add to a whole decode step of the engine, as the product runs it.

benchmarks/structured_mask_cost.py times the bitmask fill and its application apart. A decode step overlaps them
with the forward: the CUDA graph is launched, and the CPU fills the masks (corun.model_runner.sample_requests)
while the GPU runs it. This benchmark times engine steps of N decoding rows, every row constrained by one JSON
schema against none, in one process and alternating arms (unconstrained, constrained, ...), so the ratio is one
machine's.

A random-weight preset has no tokenizer, so its grammars get the synthetic byte vocabulary of
structured_mask_cost.py at the preset's vocabulary size (what a 150k BPE tokenizer looks like to xgrammar, for
lack of one offline). A model directory with a tokenizer uses its own.

    python -m benchmarks.structured_step_cost --model random:qwen3-8b --device cuda --dtype bfloat16 \
        --rows 256 --out FILE
    python -m benchmarks.structured_step_cost --model /tmp/tiny --rows 8 --steps 8      # a CPU check
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time

import torch

from benchmarks.harness import gpu_name
from benchmarks.report import emit
from benchmarks.structured_mask_cost import SCHEMA, summary, synthetic_vocab
from corun.llm import LLM
from corun.models.presets import is_random_spec
from corun.structured import Grammars
from wire.sampling_params import SamplingParams
from wire.structured import StructuredOutput


def use_synthetic_vocabulary() -> None:
    """Benchmark-only: give every Grammars a compiler on the synthetic vocabulary of the model's size."""
    import xgrammar

    def build_compiler(self: Grammars, vocab_size: int):
        info = xgrammar.TokenizerInfo(synthetic_vocab(vocab_size), xgrammar.VocabType.RAW, vocab_size=vocab_size,
                                      stop_token_ids=[vocab_size - 1])
        return xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    Grammars.build_compiler = build_compiler


def run_arm(llm: LLM, constrained: bool, args: argparse.Namespace, rng: random.Random) -> dict:
    """Add args.rows requests, run them to the end; -> the times of the steps that decoded every row."""
    structure = StructuredOutput("json", json.dumps(SCHEMA)) if constrained else None
    vocab_size = llm.engine.runner.arch.vocab_size
    for _ in range(args.rows):
        prompt = [rng.randrange(1000, vocab_size - 1000) for _ in range(args.prompt_len)]
        llm.add(prompt, SamplingParams(max_tokens=args.steps + 2, temperature=1.0, seed=rng.randrange(1 << 30),
                                       structured=structure))
    engine, full_steps = llm.engine, []
    while engine.has_unfinished():
        started = time.perf_counter()
        batch = engine.scheduler.schedule()
        if batch is None:
            continue
        engine.postprocess(batch, engine.run(batch))
        if not batch.prefill_chunks and len(batch.decode_requests) == args.rows:
            full_steps.append((time.perf_counter() - started) * 1e3)
    return {"constrained": constrained, "full_decode_steps": len(full_steps), "step_ms": summary(full_steps),
            "step_ms_mean": statistics.fmean(full_steps) if full_steps else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random:qwen3-8b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16" if torch.cuda.is_available() else "float32")
    parser.add_argument("--rows", type=int, default=256, help="decoding rows (max_num_seqs)")
    parser.add_argument("--steps", type=int, default=32, help="decode steps per request")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of (unconstrained, constrained)")
    parser.add_argument("--out", help="write the results here (JSON)")
    args = parser.parse_args()
    if is_random_spec(args.model):
        use_synthetic_vocabulary()
    llm = LLM(args.model, device=args.device, dtype=args.dtype, max_num_seqs=args.rows,
              max_model_len=args.prompt_len + args.steps + 64)
    rng = random.Random(0)
    run_arm(llm, False, args, rng)  # NOTE: warm-up: graphs, the sampler's first calls
    run_arm(llm, True, args, rng)  # NOTE: warm-up: the schema's compilation (cached afterwards)
    arms = [run_arm(llm, constrained, args, rng) for _ in range(args.rounds) for constrained in (False, True)]
    free = [arm["step_ms"]["p50"] for arm in arms if not arm["constrained"] and arm["full_decode_steps"]]
    bound = [arm["step_ms"]["p50"] for arm in arms if arm["constrained"] and arm["full_decode_steps"]]
    result = {"benchmark": "structured_step_cost", "model": args.model, "device": args.device, "dtype": args.dtype,
              "rows": args.rows, "schema": SCHEMA, "host": platform.node(), "torch": torch.__version__,
              "cuda_device": gpu_name() if torch.cuda.is_available() else None,
              "vocabulary": "synthetic (structured_mask_cost.synthetic_vocab)" if is_random_spec(args.model)
              else "the model's tokenizer", "arms": arms,
              "added_fraction_p50": statistics.median(bound) / statistics.median(free) - 1 if free and bound else None}
    emit(result, args.out)


if __name__ == "__main__":
    main()
