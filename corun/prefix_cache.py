"""The prefix cache: the KV of full prompt chunks kept after their request ends, found by the hash chain of the
prompt up to the chunk's end (wire/prefix_hash.py), shared by reference count, evicted least recently used.

Only KV a cold prefill computes bit for bit may be served. A chunk's KV is a function of its tokens, the tokens
before it and the forward's shape; in fixed_shape mode a full chunk (prefill_chunk_size tokens, starting at a
multiple of it) is always computed by one prefill forward of the same shape (natural length, its bucket, or a
verified pack size), reading the chunks before it from the cache (written by an earlier forward, or by another
prompt's rows of the same one: each layer writes every row's K and V before any row attends, and a chunk is cached as
its forward is packed, BlockManager.cache_scheduled), or together with the chunks before it in one forward where the
runner verified that this gives the same bits (SchedulerConfig.multi_chunk_prefill). So the chunks
kept are exactly those: never a partial last chunk (its length is the prompt's), never a block written by decode
steps (all of those are past the prompt). The chunk rule is the scheduler's (prefill_chunk_size, in the
fingerprint), a function of the prompt alone. A hit is capped so that at least the prompt's last chunk is prefilled:
its last row gives token 1 (with every chunk cached, the last one is computed again, as vLLM recomputes the last
token).

Block states (each block is in exactly one): free (BlockManager.free_block_ids), private to a request
(BlockManager.allocated_block_ids), or a cached chunk's. A cached chunk is held (num_holders > 0: requests
reading it, or the one that computed it, until they end; a prefill node's request ends when its lease does, so a
decode node's READ is covered) or unheld (in the LRU, evictable; counted as free). A reset detaches every chunk:
unheld ones are freed at once, held ones when their last holder ends.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass

from wire.config import KV_POOL_SIZING, EngineConfig

MAX_PROMPT_LOGPROB_VARIANTS = 8
"""Prompt logprobs kept per cached chunk: one entry per (alternatives asked, next prompt token), least recently
stored dropped first."""

PromptLogprobsKey = tuple[int, int]
"""(params.prompt_logprobs, the prompt token after the chunk): the chunk's last row predicts that token, so its
logprob entry depends on it; the alternatives shown depend on the count asked."""


@dataclass(eq=False)
class CachedChunk:
    key: bytes
    block_ids: tuple[int, ...]
    num_holders: int = 0
    detached: bool = False
    """Removed by a reset while held: its blocks are freed when the last holder ends, and nobody finds it again."""
    prompt_logprobs: OrderedDict[PromptLogprobsKey, tuple] = dataclasses.field(default_factory=OrderedDict)
    """The prompt logprobs the chunk's rows gave (each row predicts the next prompt token), as a prefill computed
    them: at the chunk's shape, a function of the prompt up to the chunk's end and the key, so a request asking the
    same is served them bit for bit."""

    def store_prompt_logprobs(self, key: PromptLogprobsKey, entries: tuple) -> None:
        if key in self.prompt_logprobs:
            return
        self.prompt_logprobs[key] = entries
        if len(self.prompt_logprobs) > MAX_PROMPT_LOGPROB_VARIANTS:
            self.prompt_logprobs.popitem(last=False)


class PrefixCache:
    def __init__(self, chunk_size: int, salt: bytes):
        self.chunk_size = chunk_size
        self.salt = salt
        self.chunks: dict[bytes, CachedChunk] = {}
        self.unheld: OrderedDict[bytes, CachedChunk] = OrderedDict()
        """Chunks nobody holds, least recently used first: the eviction order."""
        self.num_unheld_blocks = 0
        self.num_queried_tokens = 0
        """Prompt tokens of the requests that looked the cache up (vLLM's vllm:prefix_cache_queries)."""
        self.num_hit_tokens = 0
        """Of those, tokens served from the cache (vllm:prefix_cache_hits)."""
        self.num_evicted_chunks = 0

    def longest_prefix(self, chunk_keys: list[bytes], max_chunks: int) -> list[CachedChunk]:
        """The cached chunks that start the prompt, at most max_chunks."""
        hits = []
        for key in chunk_keys[:max_chunks]:
            chunk = self.chunks.get(key)
            if chunk is None:
                break
            hits.append(chunk)
        return hits

    def hold(self, chunk: CachedChunk) -> None:
        if chunk.num_holders == 0 and not chunk.detached:
            del self.unheld[chunk.key]
            self.num_unheld_blocks -= len(chunk.block_ids)
        chunk.num_holders += 1

    def let_go(self, chunk: CachedChunk) -> tuple[int, ...]:
        """One holder fewer; -> the blocks to free (a detached chunk's, when its last holder ends)."""
        chunk.num_holders -= 1
        if chunk.num_holders > 0:
            return ()
        if chunk.detached:
            return chunk.block_ids
        self.unheld[chunk.key] = chunk  # NOTE: the most recently used end
        self.num_unheld_blocks += len(chunk.block_ids)
        return ()

    def insert(self, key: bytes, block_ids: tuple[int, ...]) -> CachedChunk | None:
        """A new chunk, held by its inserter; None when the key is cached already (the caller keeps its blocks)."""
        if key in self.chunks:
            return None
        chunk = self.chunks[key] = CachedChunk(key, block_ids, num_holders=1)
        return chunk

    def evict(self) -> tuple[int, ...]:
        """The least recently used unheld chunk's blocks, its entry gone; () when every chunk is held."""
        if not self.unheld:
            return ()
        key, chunk = self.unheld.popitem(last=False)
        del self.chunks[key]
        self.num_evicted_chunks += 1
        self.num_unheld_blocks -= len(chunk.block_ids)
        return chunk.block_ids

    def reset(self) -> list[int]:
        """Forget every chunk (vLLM's reset_prefix_cache); -> the unheld chunks' blocks, free now."""
        freed = [b for chunk in self.unheld.values() for b in chunk.block_ids]
        for chunk in self.chunks.values():
            chunk.detached = True
        self.chunks, self.unheld, self.num_unheld_blocks = {}, OrderedDict(), 0
        return freed


def kv_salt(config: EngineConfig) -> bytes:
    """The start of every chain: the engine's settings (resolved) but the KV pool's size, which places KV but does
    not change it. NOTE: one engine's cache holds only its own KV; the salt keeps chains of engines of other
    settings apart wherever hashes meet (logs, tests)."""
    settings = dataclasses.asdict(config)
    settings["cache"] = {k: v for k, v in settings["cache"].items() if k not in KV_POOL_SIZING}
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).digest()
