"""How much memory the KV cache gets when --kv-cache-mib is not given: CPU_KV_CACHE_BYTES on CPU; on CUDA what the
GPU's share (gpu_memory_utilization, vLLM's flag) leaves beside the weights and a reserve for the forwards, split
among the nodes on the GPU by the launcher's parts (CacheConfig.gpu_nodes, gpu_kv_share), never more than the GPU
has free, and at most twice what N requests of max_model_len hold.

The reserve is computed from the shapes the engine will run (SGLang sizes its KV pool this way, from the chunked
prefill size and the CUDA-graph batch) rather than by vLLM's profile forward: the largest forward's activations and
sampled logits, ACTIVATION_COPIES times (eager forwards and the captured graphs' pools live side by side; measured on
an H100), plus a fixed allowance for what torch does not count (the CUDA context, cuBLAS and Triton workspaces). On
an H200 with an 8B model in bf16 it leaves ~104 GiB of KV (the engine benchmarks ran with 109 GiB: `--kv-cache-mib
112000`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from corun.kv_cache import bytes_per_block
from corun.models.config import ModelArchConfig
from wire.config import CPU_KV_CACHE_BYTES, GIB, MIB, EngineConfig, SchedulerConfig

logger = logging.getLogger(__name__)

UNCOUNTED_RESERVE_BYTES = GIB
"""What a CUDA process holds outside torch's allocator beside the weights: the context, cuBLAS's and Triton's
workspaces, NCCL-free. vLLM measures it in its profile run; ~0.5-0.8 GiB on an H100/H200 process."""
ACTIVATION_COPIES = 4
"""Eager forwards (start-up verification, a step no graph holds) and the captured graphs' memory pools coexist, and
the allocator's blocks cut for one row count are not all reused at another. Measured (stop 47, H100 80 GB, the 8B
shape at its defaults: T = 8192, N = 256, a full pack of 4 x 3,000 tokens; tests/corun/test_kv_sizing_gpu.py): torch's
peak stood 23.2 GiB above the KV cache whatever its size, and each copy here is 1.35 GiB of KV: with 2 the peak went
1.74 GiB past the 0.9 share, with 3 0.40 GiB past it; 4 leaves ~0.95 GiB for what torch does not count."""
LOGITS_COPIES = 3
"""float32 logits, their log-softmax and a probability tensor exist at once while a step samples."""
MOST_KV_PER_ROW_AT_FULL_LENGTH = 2
"""The KV cache never takes more than this many times what N requests of max_model_len hold: every decode row at
its longest, and as much again for cached prefixes. Beyond it memory would only hold more cached prefixes; where the
model is small (the tiny model's tests: several engines in one process), it stays with the GPU's other users."""


@dataclass(frozen=True)
class GpuMemory:
    """What the GPU says when the weights are in: its size, what is free on it (other processes count), and what
    this process's torch allocator holds (the weights and what loading them left cached)."""

    total_bytes: int
    free_bytes: int
    reserved_bytes: int

    @classmethod
    def of(cls, device: str) -> GpuMemory:
        # NOTE: what the allocator caches from loading (or from an engine this process ran before) goes back first,
        # so reserved_bytes is what live tensors hold
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(torch.device(device))
        return cls(total, free, torch.cuda.memory_reserved(torch.device(device)))


def forward_reserve_bytes(arch: ModelArchConfig, sched: SchedulerConfig, dtype: torch.dtype,
                          piecewise_rows: int = 0) -> int:
    """Memory the forwards need beside the weights and the KV cache, from their largest shapes (a resolved
    scheduler config). piecewise_rows: the largest piecewise graph the runner captures (0: none), whose buffers
    and pool come on top of the other graphs' (ModelRunner.piecewise_sizes).
    NOTE: a decode node's runner (no prefill) keeps the same reserve. Sized from its N-row step alone (stop 49), its
    KV on an H200 (8B shape) was 106.2 GiB and torch's peak 126.9 GiB, past the 0.9 share (125.8 GiB): its decode
    graphs' pools and the eager steps of its size checks hold ~6 GiB beside the weights and KV, which that formula
    does not see; with this reserve 102.7 GiB and a peak of 123.9 GiB (benchmarks/results/README.md, stop 50)."""
    element = torch.empty((), dtype=dtype).element_size()
    rows = max(sched.prefill_pack_tokens or 0, sched.prefill_chunk_size, sched.max_num_seqs,
               sched.max_num_batched_tokens)
    row_elements = (4 * arch.hidden_size + (arch.num_heads + 2 * arch.num_kv_heads) * arch.head_dim
                    + 3 * arch.intermediate_size)
    # NOTE: a decode step's rows, a pack's sampled rows, and a chunk's rows where its prompt logprobs are asked
    sampled_rows = max(sched.max_num_seqs, sched.prefill_seqs_per_forward, sched.prefill_chunk_size)
    logits = sampled_rows * arch.vocab_size * 4 * LOGITS_COPIES
    pieces = piecewise_rows * row_elements * element
    return ACTIVATION_COPIES * (rows * row_elements * element + logits) + pieces + UNCOUNTED_RESERVE_BYTES


def gpu_kv_budget(memory: GpuMemory, utilization: float, reserve_bytes: int, gpu_nodes: int = 1,
                  kv_share: float = 1.0, shared_weight_bytes: int = 0, holds_shared_weights: bool = False) -> int:
    """kv_share of what the GPU's share (utilization) holds beside every node's weights and forwards' reserve (each
    of the gpu_nodes holds what this one does), and no more than is free beside this node's reserve (a node that
    started before may hold more than its part). shared_weight_bytes: weights the GPU's nodes share, counted once
    (corun/shared_weights.py); holds_shared_weights: this node's allocator holds them (the exporter)."""
    own_bytes = memory.reserved_bytes - (shared_weight_bytes if holds_shared_weights else 0)
    pool = int(memory.total_bytes * utilization) - shared_weight_bytes - gpu_nodes * (own_bytes + reserve_bytes)
    return min(int(pool * kv_share), memory.free_bytes - reserve_bytes)


def with_kv_budget(config: EngineConfig, arch: ModelArchConfig, dtype: torch.dtype,
                   memory: GpuMemory | None = None, piecewise_rows: int = 0, shared_weight_bytes: int = 0,
                   holds_shared_weights: bool = False) -> EngineConfig:
    """config with the KV cache's budget resolved (kept as given when --kv-cache-mib or --num-blocks is). On CUDA,
    call it once the weights are loaded; memory: the GPU's figures (None: ask the device); piecewise_rows: as
    forward_reserve_bytes takes it; shared_weight_bytes, holds_shared_weights: as gpu_kv_budget takes them."""
    cache = config.cache
    if cache.num_blocks is not None or cache.memory_budget_bytes is not None:
        return config
    if not config.device.startswith("cuda"):
        return dataclasses.replace(config, cache=dataclasses.replace(cache, memory_budget_bytes=CPU_KV_CACHE_BYTES))
    memory = memory or GpuMemory.of(config.device)
    reserve = forward_reserve_bytes(arch, config.scheduler, dtype, piecewise_rows)
    budget = gpu_kv_budget(memory, cache.gpu_memory_utilization, reserve, cache.gpu_nodes, cache.gpu_kv_share,
                           shared_weight_bytes, holds_shared_weights)
    block_bytes = bytes_per_block(arch, cache.block_size, dtype)
    needed = (config.max_blocks_per_seq + 1) * block_bytes  # NOTE: one request of max_model_len, and the null block
    most = MOST_KV_PER_ROW_AT_FULL_LENGTH * config.scheduler.max_num_seqs * config.max_blocks_per_seq * block_bytes
    budget = min(budget, most + block_bytes)
    if budget < needed:
        raise ValueError(
            f"the KV cache would get {max(budget, 0) // MIB} MiB of the GPU (--gpu-memory-utilization "
            f"{cache.gpu_memory_utilization}: {memory.total_bytes * cache.gpu_memory_utilization / GIB:.1f} GiB of "
            f"{memory.total_bytes / GIB:.1f}, {memory.free_bytes / GIB:.1f} GiB free; the weights hold "
            f"{memory.reserved_bytes / GIB:.1f} GiB; the forwards need {reserve / GIB:.1f} GiB; "
            f"{cache.gpu_nodes} node(s) on the GPU, this one's part {cache.gpu_kv_share:.2f}), less than one "
            f"request of --max-model-len {config.scheduler.max_model_len} needs ({needed // MIB} MiB): raise "
            f"--gpu-memory-utilization, lower --max-model-len or --max-num-batched-tokens, or give --kv-cache-mib")
    logger.info("KV cache sized on %s: %d MiB = %.2f of (%.2f x %.1f GiB - %d x (%.1f GiB held: weights + %.1f GiB "
                "for the forwards) - %.1f GiB of weights shared), %.1f GiB free, at most %d x N x max_model_len "
                "tokens", config.device, budget // MIB, cache.gpu_kv_share, cache.gpu_memory_utilization,
                memory.total_bytes / GIB, cache.gpu_nodes, memory.reserved_bytes / GIB, reserve / GIB,
                shared_weight_bytes / GIB, memory.free_bytes / GIB, MOST_KV_PER_ROW_AT_FULL_LENGTH)
    return dataclasses.replace(config, cache=dataclasses.replace(cache, memory_budget_bytes=budget))
