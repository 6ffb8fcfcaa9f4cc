"""Whether a prompt may run several of its prefill chunks in one forward (SchedulerConfig.multi_chunk_prefill): only
where that gives it exactly the K, V and token-1 logits it gets chunk by chunk, found by trying it at start-up.

Chunks are the prefix cache's unit and their cuts depend on the prompt alone; what a forward holds is the scheduler's
choice. The packed prefill kernel reduces a token's keys in an order set by its position alone and the GEMMs give a
row the same bits at every kept pack size (corun/pack_sizes.py), so a prompt's chunks give the same bits in one
forward as one by one: that structure is the argument (on the H200, benchmarks/results/h200_chunk_invariance.json:
6 of 6 cases), and the runner allows it only on that kernel. Per-chunk SDPA (the CPU path) picks its kernel by the
query count and the mask, and does not (measured: 1 of 10 prompts' token 1 moved). This probe is the check that the
structure holds on the runner's device: prompts of a chunk and one token, two chunks, and two and a half chunks,
prefilled chunk by chunk, then whole, alone and after another prompt in the pack.
"""

from __future__ import annotations

import random

import torch

from corun.request import Request
from corun.scheduler import PrefillChunk
from corun.step_inputs import build_prefill_pack
from wire.sampling_params import SamplingParams

PROBE_SEED = 20261204
OTHER_PROMPT_TOKENS = 5


def several_chunks_match(runner) -> bool:
    """runner: a packed-prefill ModelRunner with its pack sizes kept."""
    sched = runner.config.scheduler
    chunk, pack_tokens = sched.prefill_chunk_size, sched.prefill_pack_tokens
    longest = min(pack_tokens, sched.max_model_len)
    lengths = sorted({min(longest, n) for n in (chunk + 1, 2 * chunk, 2 * chunk + chunk // 2)} - set(range(chunk + 1)))
    return bool(lengths) and all(matches_chunk_by_chunk(runner, length, random.Random(PROBE_SEED + length))
                                 for length in lengths)


def matches_chunk_by_chunk(runner, length: int, rng: random.Random) -> bool:
    sched = runner.config.scheduler
    chunk = sched.prefill_chunk_size
    request = probe_prompt(runner, "chunks-probe", length, 1, rng)
    logits = None
    for start in range(0, length, chunk):
        logits = prefill(runner, [PrefillChunk(request, start, min(chunk, length - start))])[0]
    by_chunk = outputs(runner, request, logits)
    whole = outputs(runner, request, prefill(runner, [PrefillChunk(request, 0, length)])[0])
    if not equal(by_chunk, whole):
        return False
    other_length = min(OTHER_PROMPT_TOKENS, sched.prefill_pack_tokens - length)
    if other_length < 1 or sched.prefill_pack_seqs < 2:
        return True
    other = probe_prompt(runner, "chunks-probe-other", other_length, 1 + len(request.block_ids), rng)
    beside = prefill(runner, [PrefillChunk(other, 0, other_length), PrefillChunk(request, 0, length)])[1]
    return equal(by_chunk, outputs(runner, request, beside))


def probe_prompt(runner, name: str, length: int, first_block: int, rng: random.Random) -> Request:
    params = SamplingParams(seed=rng.randrange(2**31))
    request = Request(name, [rng.randrange(runner.arch.vocab_size) for _ in range(length)], params, params.seed,
                      frozenset())
    request.block_ids = list(range(first_block, first_block + -(-length // runner.block_size)))
    return request


def prefill(runner, chunks: list[PrefillChunk]) -> torch.Tensor:
    """One packed forward at the smallest kept size that holds the chunks: -> the finishing prompts' token-1 logits.
    NOTE: the probe's blocks are free at start-up; what it leaves in them is overwritten before a request reads it."""
    sched = runner.config.scheduler
    pack = build_prefill_pack(chunks, runner.pack_rows(chunks), sched.prefill_pack_seqs, runner.block_size,
                              runner.table_rows)
    return runner.padded_prefill_logits(pack).clone()  # NOTE: a graph's output buffer is reused


def outputs(runner, request: Request, logits: torch.Tensor) -> list[torch.Tensor]:
    blocks = torch.tensor(request.block_ids, device=logits.device)
    return [logits] + [cache[blocks].clone() for layer in runner.kv_cache.layers for cache in layer]


def equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
