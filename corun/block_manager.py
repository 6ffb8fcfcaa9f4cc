"""KV block accounting: a free deque of block ids; a request holds blocks for its whole sequence.

NOTE: no prefix caching. Reusing another request's prompt KV would change the prefill shape of this request
(a cache hit prefills only the suffix), and vLLM on this CPU measured a logprob change on a hit.
"""

from __future__ import annotations

from collections import deque

from wire.config import NULL_BLOCK

"""Block 0 is never handed out: padding rows of the fixed-shape decode step read and write it."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 2:
            raise ValueError(f"need at least 2 KV blocks (one is the null block), got {num_blocks}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free_block_ids: deque[int] = deque(range(1, num_blocks))
        self.allocated_block_ids: set[int] = set()

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) <= self.num_free_blocks

    def allocate(self, num_tokens: int) -> list[int] | None:
        """Blocks for num_tokens tokens, or None when they do not fit now."""
        if not self.can_allocate(num_tokens):
            return None
        block_ids = [self.free_block_ids.popleft() for _ in range(self.blocks_needed(num_tokens))]
        self.allocated_block_ids.update(block_ids)
        return block_ids

    def free(self, block_ids: list[int]) -> None:
        if NULL_BLOCK in block_ids:
            raise ValueError("the null block is never allocated, so it cannot be freed")
        not_allocated = set(block_ids) - self.allocated_block_ids
        if not_allocated or len(set(block_ids)) != len(block_ids):
            raise ValueError(f"double free or unknown blocks: {sorted(not_allocated) or block_ids}")
        self.allocated_block_ids.difference_update(block_ids)
        self.free_block_ids.extend(block_ids)
