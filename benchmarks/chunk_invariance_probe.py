"""Whether a prompt's KV depends on how its prefill was cut into forwards (a probe for issue 25's next step).

    python -m benchmarks.chunk_invariance_probe --model random:qwen3-8b --out FILE

fixed_shape prefills a long prompt one chunk per forward, so the prefix cache can serve whole chunks only, and a
small chunk (more hits) costs a long prompt many forwards. If a token's K and V came out bitwise the same whether
its prompt ran chunk by chunk or as one segment (packed prefill's attention reduces in an order set by the token's
position alone; its GEMMs give a row the same bits at every verified pack size), a prompt could run all its chunks
in one forward while the cache keeps them chunk by chunk, and the chunk could shrink to a block at no cost.

For each prompt length: the prompt prefilled chunk by chunk (each chunk alone, at the smallest verified pack size
that holds it) against all of it in one forward, and against one forward beside other prompts; per case whether the
K and V of every layer and the token-1 logits are bitwise equal, and the largest difference.
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from benchmarks.harness import gpu_name
from benchmarks.report import emit
from corun.chunk_invariance import outputs, prefill, probe_prompt
from corun.llm import LLM
from corun.scheduler import PrefillChunk
from wire.config import CacheConfig, EngineConfig, SchedulerConfig


def compare(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict:
    equal = [torch.equal(x, y) for x, y in zip(a, b, strict=True)]
    return {"bitwise": all(equal), "tensors_differing": equal.count(False),
            "max_abs_diff": max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))}


def probe(runner, length: int, chunk: int, rng: random.Random) -> dict:
    """The engine's start-up check (corun/chunk_invariance.py) on one length, with how far apart any difference is."""
    request = probe_prompt(runner, "probe", length, 1, rng)
    logits = None
    for start in range(0, length, chunk):
        logits = prefill(runner, [PrefillChunk(request, start, min(chunk, length - start))])
    by_chunk = outputs(runner, request, logits[:1])
    alone = outputs(runner, request, prefill(runner, [PrefillChunk(request, 0, length)])[:1])
    # NOTE: the same prompt after two others in one forward (its rows elsewhere, other sequences beside it)
    others = [probe_prompt(runner, f"other-{i}", chunk, 1 + len(request.block_ids) * (i + 1), rng) for i in range(2)]
    packed = prefill(runner, [PrefillChunk(o, 0, chunk) for o in others] + [PrefillChunk(request, 0, length)])
    beside = outputs(runner, request, packed[2:3])
    return {"prompt_tokens": length, "chunk": chunk, "one_forward": compare(by_chunk, alone),
            "one_forward_packed": compare(by_chunk, beside)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="random:qwen3-8b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--chunks", default="64,256")
    parser.add_argument("--lengths", default="700,1536")
    parser.add_argument("--pack-tokens", type=int, default=2048)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report = {"gpu": gpu_name() if device == "cuda" else None, "runs": []}
    lengths = [int(x) for x in args.lengths.split(",")]
    for chunk in (int(c) for c in args.chunks.split(",")):
        sched = SchedulerConfig(max_num_seqs=8, max_model_len=max(lengths) + 64, prefill_chunk_size=chunk,
                                max_num_batched_tokens=args.pack_tokens, prefill_pack_tokens=args.pack_tokens,
                                decode_step_sizes=())
        llm = LLM.from_config(EngineConfig(model=args.model, dtype=args.dtype, device=device, scheduler=sched,
                                           cache=CacheConfig(num_blocks=4 * (max(lengths) // 16 + 8) + 64,
                                                             enable_prefix_caching=False)))
        runner = llm.engine.runner
        for length in lengths:
            run = probe(runner, length, chunk, random.Random(length * 7 + chunk))
            report["runs"].append(run)
            print(json.dumps(run), flush=True)
        del llm, runner
        if device == "cuda":
            torch.cuda.empty_cache()
    emit(report, args.out)


if __name__ == "__main__":
    main()
