"""Decode step row counts below N that give every row exactly the bits of the N-row step, found by trying them.

The contract fixes the decode step's shape at N rows because a kernel's reduction order can change with the row
count. It does not always change: cuBLAS, the Triton kernels and the CPU BLAS pick their algorithm from the shape
alone, and many row counts share one (measured on the H200 for the Qwen3-8B shape: 128, 160 and 224 rows do what
256 do, 192 and fewer than 128 do not, because down_proj's GEMM changes kernel there; on this project's CPU
hosts every count >= 4). Each candidate is run against the N-row step on random KV, tokens, contexts and sampling
parameters; only candidates whose logits and sampled outputs agree bit for bit on every row are kept. A step with
few running requests then runs at the smallest kept size, which costs less than N rows and keeps the contract.
"""

from __future__ import annotations

import random
from typing import Protocol

import torch

from corun.kv_cache import PagedKVCache
from corun.models.config import ModelArchConfig
from corun.request import Request
from corun.sampler import Sampler, SamplingBatch
from wire.config import EngineConfig
from wire.sampling_params import SamplingParams


class ProbedRunner(Protocol):
    """What the probe runs a decode step on (corun.model_runner.ModelRunner, which calls the probe at start-up)."""

    config: EngineConfig
    device: torch.device
    block_size: int
    max_num_seqs: int
    window_blocks: int
    arch: ModelArchConfig
    sampler: Sampler
    kv_cache: PagedKVCache

    def decode_logits(self, requests: list[Request], num_rows: int) -> torch.Tensor: ...


PROBE_SEED = 20261201
MAX_PROBE_BLOCKS_PER_REQUEST = 8


def equivalent_decode_sizes(runner: ProbedRunner, candidates: tuple[int, ...]) -> list[int]:
    """The candidates (< N) whose decode step matches the N-row step bit for bit, then N; ascending."""
    return [size for size in candidates if matches_full_step(runner, size)] + [runner.max_num_seqs]


def matches_full_step(runner: ProbedRunner, size: int) -> bool:
    """Every row filled, and one row among padding: the two ends of what a step of `size` rows carries."""
    if runner.kv_cache.num_blocks - 1 < size:
        return False  # NOTE: a cache too small to give each probe row a block of its own: nothing is kept untried
    for num_real in sorted({1, size}):
        requests = probe_requests(runner, num_real, random.Random(PROBE_SEED + 1000 * size + num_real))
        full, small = probe_outputs(runner, requests, runner.max_num_seqs), probe_outputs(runner, requests, size)
        if not all(torch.equal(a, b) for a, b in zip(full, small, strict=True)):
            return False
    return True


def probe_requests(runner: ProbedRunner, num: int, rng: random.Random, first_block: int = 1) -> list[Request]:
    """num requests on distinct blocks (from first_block) filled with random K and V, at random contexts."""
    # NOTE: long enough for contexts of several decode attention ranges (decode_kv_split_tokens), whose kernel
    # layout changes with the step's rows while their bits must not
    split = runner.config.scheduler.decode_kv_split_tokens
    wanted = max(MAX_PROBE_BLOCKS_PER_REQUEST, -(-(2 * split + runner.block_size) // runner.block_size))
    blocks_per_request = max(1, min(wanted, (runner.kv_cache.num_blocks - first_block) // num, runner.window_blocks))
    vocab, requests = runner.arch.vocab_size, []
    for i in range(num):
        context = rng.randint(1, blocks_per_request * runner.block_size)
        params = SamplingParams(temperature=rng.choice([0.0, 0.7, 1.0]), top_p=rng.choice([1.0, 0.9]),
                                top_k=rng.choice([0, 20]), seed=rng.randrange(2**31))
        request = Request(f"probe-{i}", [rng.randrange(vocab) for _ in range(context)], params, params.seed,
                          frozenset())
        first = first_block + i * blocks_per_request
        request.block_ids = list(range(first, first + blocks_per_request))
        request.num_computed_tokens = context - 1
        requests.append(request)
    fill_random_kv(runner, [b for r in requests for b in r.block_ids], rng.randrange(2**31))
    return requests


def fill_random_kv(runner: ProbedRunner, block_ids: list[int], seed: int) -> None:
    """NOTE: the probe's blocks are free: whatever is left in them is overwritten before any request reads it."""
    generator = torch.Generator(device=runner.device).manual_seed(seed)
    index = torch.tensor(block_ids, device=runner.device)
    for k_cache, v_cache in runner.kv_cache.layers:
        for cache in (k_cache, v_cache):
            shape = (len(block_ids), *cache.shape[1:])
            cache[index] = torch.randn(shape, generator=generator, device=runner.device).to(cache.dtype)


def probe_outputs(runner: ProbedRunner, requests: list[Request], num_rows: int) -> list[torch.Tensor]:
    """The requests' rows of a decode step at num_rows rows: logits, then the sampler's outputs."""
    logits = runner.decode_logits(requests, num_rows).clone()  # NOTE: a graph's output buffer is reused
    return sampled_outputs(runner, requests, logits)


def sampled_outputs(runner: ProbedRunner, requests: list[Request], logits: torch.Tensor) -> list[torch.Tensor]:
    """The requests' rows of a decode step's logits ([num_rows, vocab]), then of what the sampler makes of them."""
    num_rows = logits.shape[0]
    batch = SamplingBatch.build([r.params for r in requests], [r.seed for r in requests],
                                [r.num_tokens for r in requests], num_rows, logits.device, requests)
    out = runner.sampler(logits, batch, runner.config.max_logprobs)
    return [t[: len(requests)] for t in (logits, out.token_ids, out.logprobs, out.topk_ids, out.topk_logprobs)]
