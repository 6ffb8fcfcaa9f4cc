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
from corun.llm import LLM
from corun.request import Request
from corun.scheduler import PrefillChunk
from corun.step_inputs import build_prefill_pack
from wire.config import CacheConfig, EngineConfig, SchedulerConfig
from wire.sampling_params import SamplingParams


def prompt_request(name: str, length: int, first_block: int, block_size: int, vocab: int,
                   rng: random.Random) -> Request:
    params = SamplingParams(seed=rng.randrange(2**31))
    request = Request(name, [rng.randrange(vocab) for _ in range(length)], params, params.seed, frozenset())
    request.block_ids = list(range(first_block, first_block + -(-length // block_size)))
    return request


def prefill(runner, chunks: list[PrefillChunk]) -> torch.Tensor:
    """One packed forward of chunks at the smallest kept pack size that holds them: the finishing prompts'
    token-1 logits."""
    sched = runner.config.scheduler
    rows = next(size for size in runner.pack_sizes if size >= sum(c.num_tokens for c in chunks))
    pack = build_prefill_pack(chunks, rows, sched.prefill_pack_seqs, runner.block_size, runner.table_rows)
    return runner.padded_prefill_logits(pack).clone()


def kv_of(runner, request: Request) -> list[torch.Tensor]:
    blocks = torch.tensor(request.block_ids, device=runner.device)
    return [cache[blocks].clone() for layer in runner.kv_cache.layers for cache in layer]


def compare(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict:
    equal = [torch.equal(x, y) for x, y in zip(a, b, strict=True)]
    return {"bitwise": all(equal), "tensors_differing": equal.count(False),
            "max_abs_diff": max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))}


def probe(runner, length: int, chunk: int, rng: random.Random) -> dict:
    block_size, vocab = runner.block_size, runner.arch.vocab_size
    request = prompt_request("probe", length, 1, block_size, vocab, rng)
    logits = None
    for start in range(0, length, chunk):
        logits = prefill(runner, [PrefillChunk(request, start, min(chunk, length - start))])
    by_chunk = [logits[:1]] + kv_of(runner, request)
    whole = prefill(runner, [PrefillChunk(request, 0, length)])
    alone = [whole[:1]] + kv_of(runner, request)
    # NOTE: the same prompt after two others in one forward (its rows elsewhere, other sequences beside it)
    others = [prompt_request(f"other-{i}", chunk, 1 + len(request.block_ids) * (i + 1), block_size, vocab, rng)
              for i in range(2)]
    packed = prefill(runner, [PrefillChunk(o, 0, chunk) for o in others] + [PrefillChunk(request, 0, length)])
    beside = [packed[2:3]] + kv_of(runner, request)
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
