"""The paged KV cache: one tensor, block-major, so a request's block is one contiguous region.

Layout [num_blocks, num_layers, 2 (k, v), block_size, num_kv_heads, head_dim]: moving a block between nodes
is one descriptor (transfer/), and each layer's K or V is a strided view of it.
"""

from __future__ import annotations

import torch

from corun.models.config import ModelArchConfig
from wire.config import CacheConfig


def bytes_per_block(arch: ModelArchConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return arch.num_layers * 2 * block_size * arch.num_kv_heads * arch.head_dim * elem


def num_blocks_for(arch: ModelArchConfig, cache: CacheConfig, dtype: torch.dtype) -> int:
    if cache.num_blocks is not None:
        return cache.num_blocks
    if cache.memory_budget_bytes is None:
        raise ValueError("the KV cache's budget is auto: size it first (corun/kv_sizing.py with_kv_budget)")
    return cache.memory_budget_bytes // bytes_per_block(arch, cache.block_size, dtype)


class PagedKVCache:
    def __init__(self, arch: ModelArchConfig, cache: CacheConfig, dtype: torch.dtype, device: str):
        self.block_size = cache.block_size
        self.num_blocks = num_blocks_for(arch, cache, dtype)
        shape = (self.num_blocks, arch.num_layers, 2, cache.block_size, arch.num_kv_heads, arch.head_dim)
        self.data = torch.zeros(shape, dtype=dtype, device=device)
        self.layers = [(self.data[:, i, 0], self.data[:, i, 1]) for i in range(arch.num_layers)]

    @property
    def block_nbytes(self) -> int:
        return self.data[0].numel() * self.data.element_size()

    def copy_blocks(self, source_ids: list[int], target_ids: list[int]) -> None:
        """Blocks target_ids[i] become copies of source_ids[i] (every layer's K and V: one indexed copy)."""
        if len(source_ids) != len(target_ids):
            raise ValueError(f"{len(source_ids)} source blocks for {len(target_ids)} targets")
        if source_ids:
            index = torch.tensor(source_ids, device=self.data.device)
            self.data[torch.tensor(target_ids, device=self.data.device)] = self.data[index]
