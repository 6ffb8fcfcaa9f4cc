"""Packed prefill row counts below T that give every prompt exactly the bits of the T-row forward, found by trying.

Packed prefill fixes a forward's shape at T rows, whatever it holds, because a kernel's reduction order can change
with the row count: a lone prompt then pays T rows. The order does not always change: cuBLAS and the Triton kernels
pick their algorithm from the shape alone, the glue and attention kernels are row- and sequence-wise, and on the
H200 every count from 320 to 8448 (and 192) gives each row of every Qwen3-8B projection the same bits
(benchmarks/results/h200_gemm_row_invariance.json). Each candidate is run against the T-row forward on random
prompts: a full pack and a lone short prompt, the KV they write and their token-1 logits compared bit for bit. A
pack of r rows then runs at the smallest kept size >= r, which costs less than T rows and keeps the contract (the
decode-size probe, corun/decode_sizes.py, does the same for decode steps).
"""

from __future__ import annotations

import random
from typing import Protocol

import torch

from corun.kv_cache import PagedKVCache
from corun.models.config import ModelArchConfig
from corun.request import Request
from corun.scheduler import PrefillChunk
from corun.step_inputs import BlockTableRows, PrefillPackInputs, build_prefill_pack
from wire.config import EngineConfig
from wire.sampling_params import SamplingParams

PROBE_SEED = 20261202


class PackProbedRunner(Protocol):
    """What the probe runs a packed prefill on (corun.model_runner.ModelRunner, which calls it at start-up)."""

    config: EngineConfig
    block_size: int
    table_rows: BlockTableRows
    arch: ModelArchConfig
    kv_cache: PagedKVCache

    def padded_prefill_logits(self, inputs: PrefillPackInputs) -> torch.Tensor: ...


def equivalent_pack_sizes(runner: PackProbedRunner, candidates: tuple[int, ...]) -> list[int]:
    """The candidates (< T) whose packed forward matches the T-row forward bit for bit, then T; ascending."""
    pack_tokens = runner.config.scheduler.prefill_pack_tokens
    return [size for size in candidates if matches_full_pack(runner, size)] + [pack_tokens]


def matches_full_pack(runner: PackProbedRunner, size: int) -> bool:
    """A pack filled to `size` rows and a lone short prompt: the two ends of what a forward of `size` rows holds."""
    sched = runner.config.scheduler
    for case in ("full", "lone"):
        rng = random.Random(PROBE_SEED + 1000 * size + len(case))
        chunks = probe_chunks(runner, size if case == "full" else min(size, 3), sched.prefill_pack_seqs, rng)
        full = probe_outputs(runner, chunks, sched.prefill_pack_tokens)
        small = probe_outputs(runner, chunks, size)
        if not all(torch.equal(a, b) for a, b in zip(full, small, strict=True)):
            return False
    return True


def probe_chunks(runner: PackProbedRunner, num_rows: int, max_prompts: int, rng: random.Random) -> list[PrefillChunk]:
    """Whole prompts (each at most one prefill chunk) filling up to num_rows rows, on distinct blocks from 1."""
    sched, vocab = runner.config.scheduler, runner.arch.vocab_size
    free_blocks = runner.kv_cache.num_blocks - 1
    longest = min(sched.prefill_chunk_size, sched.max_model_len)  # NOTE: positions past max_model_len have no RoPE
    chunks, rows_left, next_block = [], num_rows, 1
    while rows_left > 0 and len(chunks) < max_prompts:
        length = min(rows_left, rng.randint(1, longest))
        num_blocks = -(-length // runner.block_size)
        if next_block - 1 + num_blocks > free_blocks:
            break
        params = SamplingParams(seed=rng.randrange(2**31))
        request = Request(f"pack-probe-{len(chunks)}", [rng.randrange(vocab) for _ in range(length)], params,
                          params.seed, frozenset())
        request.block_ids = list(range(next_block, next_block + num_blocks))
        next_block += num_blocks
        chunks.append(PrefillChunk(request, 0, length))
        rows_left -= length
    return chunks


def probe_outputs(runner: PackProbedRunner, chunks: list[PrefillChunk], num_rows: int) -> list[torch.Tensor]:
    """The chunks prefilled in one forward of num_rows rows: each prompt's token-1 logits, then the K and V it
    wrote to each layer's cache.

    NOTE: the probe's blocks are free at start-up; whatever it leaves in them is overwritten before a request
    reads it."""
    sched = runner.config.scheduler
    pack = build_prefill_pack(chunks, num_rows, sched.prefill_pack_seqs, runner.block_size, runner.table_rows)
    logits = runner.padded_prefill_logits(pack)[: len(chunks)].clone()  # NOTE: a graph's output buffer is reused
    blocks = torch.tensor([b for chunk in chunks for b in chunk.request.block_ids], device=logits.device)
    return [logits] + [cache[blocks].clone() for layer in runner.kv_cache.layers for cache in layer]
