"""KV block accounting: a free deque of block ids; a request holds blocks for its whole sequence; with a prefix
cache (corun/prefix_cache.py), a prompt's leading full chunks may be blocks it shares with other requests.

NOTE: prefix caching keeps the contract because only full chunks at chunk boundaries are shared, whose KV a cold
prefill computes bit for bit (see corun/prefix_cache.py); vLLM's block-level cache, whose hits change the prefill's
shape, measured a logprob change on a hit on this CPU.
"""

from __future__ import annotations

from collections import deque

from corun.prefix_cache import CachedChunk, PrefixCache, kv_salt
from corun.request import Request
from wire.config import NULL_BLOCK, EngineConfig
from wire.prefix_hash import chunk_hash_chain

"""Block 0 is never handed out: padding rows of the fixed-shape decode step read and write it."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_cache: PrefixCache | None = None):
        """prefix_cache: None (decode nodes, modes other than fixed_shape, or turned off): no sharing."""
        if num_blocks < 2:
            raise ValueError(f"need at least 2 KV blocks (one is the null block), got {num_blocks}")
        if prefix_cache is not None and prefix_cache.chunk_size % block_size:
            raise ValueError(f"a prefix cache needs chunks of whole blocks: chunk {prefix_cache.chunk_size}, block "
                             f"{block_size}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free_block_ids: deque[int] = deque(range(1, num_blocks))
        self.allocated_block_ids: set[int] = set()
        """Blocks private to one request (the others are free or a cached chunk's)."""
        self.prefix_cache = prefix_cache

    @property
    def num_free_blocks(self) -> int:
        """Free blocks and those of unheld cached chunks (evicted when needed), as vLLM counts them."""
        cached = self.prefix_cache.num_unheld_blocks if self.prefix_cache is not None else 0
        return len(self.free_block_ids) + cached

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) <= self.num_free_blocks

    def allocate(self, num_tokens: int) -> list[int] | None:
        """Blocks for num_tokens tokens (evicting unheld cached chunks as needed), or None when they do not fit."""
        if not self.can_allocate(num_tokens):
            return None
        num_needed = self.blocks_needed(num_tokens)
        while len(self.free_block_ids) < num_needed:
            self.free_block_ids.extend(self.prefix_cache.evict())
        block_ids = [self.free_block_ids.popleft() for _ in range(num_needed)]
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

    # --- a request's blocks, its prompt's cached chunks first -----------------------------------------------------
    def allocate_request(self, request: Request, num_tokens: int) -> bool:
        """Blocks for the request's first num_tokens tokens: its longest cached full-chunk prefix (held), then new
        ones; request.num_computed_tokens starts past the prefix. False (nothing held) when they do not fit now.
        NOTE: a request asking prompt_logprobs is served only chunks that kept the prompt logprobs it asks (see
        CachedChunk.prompt_logprobs); they become the start of its own."""
        hits = self.cached_prefix(request)
        for chunk in hits:
            self.prefix_cache.hold(chunk)
        num_cached_tokens = len(hits) * self.prefix_cache.chunk_size if hits else 0
        block_ids = self.allocate(num_tokens - num_cached_tokens)
        if block_ids is None:
            self.let_go(hits)
            return False
        if self.prefix_cache is not None:
            self.prefix_cache.num_queried_tokens += request.num_prompt_tokens
            self.prefix_cache.num_hit_tokens += num_cached_tokens
        request.block_ids = [b for chunk in hits for b in chunk.block_ids] + block_ids
        request.cached_chunks = list(hits)
        request.num_chunks_offered = len(hits)
        request.num_cached_tokens = request.num_computed_tokens = num_cached_tokens
        if hits and request.params.prompt_logprobs is not None:
            request.prompt_logprobs = [None] + [entry for k, chunk in enumerate(hits)
                                                for entry in chunk.prompt_logprobs[self.logprobs_key(request, k)]]
        return True

    def cached_prefix(self, request: Request) -> list[CachedChunk]:
        """The cached chunks that start the prompt, all but the last chunk at most (it gives token 1); for a
        request asking prompt_logprobs, only as far as each kept the prompt logprobs it asks."""
        cache = self.prefix_cache
        if cache is None:
            return []
        hits = cache.longest_prefix(self.chunk_keys(request), self.num_servable_chunks(request))
        if request.params.prompt_logprobs is None:
            return hits
        with_logprobs = 0
        while with_logprobs < len(hits) and self.logprobs_key(request, with_logprobs) in \
                hits[with_logprobs].prompt_logprobs:
            with_logprobs += 1
        return hits[:with_logprobs]

    def chunks_in_flight(self, requests: list[Request]) -> set[bytes]:
        """The keys of the full prompt chunks these admitted requests are yet to compute (each is cached as its
        forward ends)."""
        if self.prefix_cache is None:
            return set()
        return {key for request in requests for key in self.chunk_keys(request)[request.num_chunks_offered:]}

    def waits_for_chunk_in_flight(self, request: Request, in_flight: set[bytes],
                                  computed_now: set[bytes] = frozenset()) -> bool:
        """The first chunk the waiting request would compute is one an admitted request computes in a later forward
        (in_flight), or, for a request asking prompt_logprobs, in this one (computed_now: the logprobs a cached chunk
        serves are kept with it once its forward ends): admitted later, it is served that chunk from the cache."""
        waiting_on = in_flight | computed_now if request.params.prompt_logprobs is not None else in_flight
        if not waiting_on:
            return False
        num_hits = len(self.cached_prefix(request))
        return num_hits < self.num_servable_chunks(request) and \
            self.chunk_keys(request)[num_hits] in waiting_on

    def num_servable_chunks(self, request: Request) -> int:
        """The prompt's full chunks a cache hit may serve: all but the one holding its last token (it gives token 1)."""
        return (request.num_prompt_tokens - 1) // self.prefix_cache.chunk_size

    def chunk_keys(self, request: Request) -> list[bytes]:
        """The hash chain of the request's full prompt chunks (computed once per request)."""
        if request.chunk_keys is None:
            request.chunk_keys = chunk_hash_chain(request.prompt_token_ids, self.prefix_cache.chunk_size,
                                                  self.prefix_cache.salt)
        return request.chunk_keys

    def first_chunk_key(self, request: Request) -> bytes:
        """The key of the request's first full chunk (it has one): the chain's first, or that alone, hashed once, where
        the chain is not needed yet (a waiting order asking whether the cache holds the prompt's start)."""
        if request.chunk_keys is not None:
            return request.chunk_keys[0]
        if request.first_chunk_key is None:
            [request.first_chunk_key] = chunk_hash_chain(request.prompt_token_ids, self.prefix_cache.chunk_size,
                                                         self.prefix_cache.salt, max_chunks=1)
        return request.first_chunk_key

    def logprobs_key(self, request: Request, chunk_index: int) -> tuple[int, int]:
        """CachedChunk.prompt_logprobs' key for the request's chunk: the count asked, the prompt token after it."""
        next_token = request.prompt_token_ids[(chunk_index + 1) * self.prefix_cache.chunk_size]
        return request.params.prompt_logprobs, next_token

    def cache_scheduled(self, request: Request, end: int) -> list[bytes]:
        """The full prompt chunks a prefill piece ending at prompt position end completes, cached as soon as its
        forward is scheduled (each one no other request cached first becomes a cached chunk, held by this request
        until it ends): a prompt admitted to the same forward is served them, its rows reading the K and V that
        forward writes, since each layer writes every row's K and V before any row attends (as a prompt's own chunks
        in one forward do: SchedulerConfig.multi_chunk_prefill). So the 4 continuations of a multiple-choice
        question prefill in their context's forward instead of the next one. NOTE: a forward once scheduled always
        runs (LLMEngine.step, the nodes' turns). -> the keys of the full chunks the piece computes."""
        cache = self.prefix_cache
        if cache is None:
            return []
        keys = self.chunk_keys(request)
        num_done = min(end, request.num_prompt_tokens) // cache.chunk_size
        blocks_per_chunk = cache.chunk_size // self.block_size
        for k in range(request.num_chunks_offered, num_done):
            block_ids = tuple(request.block_ids[k * blocks_per_chunk:(k + 1) * blocks_per_chunk])
            chunk = cache.insert(keys[k], block_ids)
            if chunk is not None:
                self.allocated_block_ids.difference_update(block_ids)
                request.cached_chunks.append(chunk)
        first = request.num_chunks_offered
        request.num_chunks_offered = max(request.num_chunks_offered, num_done)
        return keys[first:num_done]

    def cache_prefilled(self, request: Request, start: int, end: int) -> None:
        """After the forward of the request's prefill piece [start, end): its full chunks cached (cache_scheduled,
        for a caller that did not cache them when it scheduled the forward) and, when the request asked
        prompt_logprobs, those the piece's rows gave kept with them (cached by it or by another)."""
        cache = self.prefix_cache
        if cache is None:
            return
        self.cache_scheduled(request, end)
        if request.params.prompt_logprobs is None:
            return
        keys = self.chunk_keys(request)
        for k in range(start // cache.chunk_size, min(end, request.num_prompt_tokens) // cache.chunk_size):
            self.store_prompt_logprobs(request, k, cache.chunks.get(keys[k]))

    def store_prompt_logprobs(self, request: Request, chunk_index: int, chunk: CachedChunk | None) -> None:
        """The chunk's rows' prompt logprobs (targets: the prompt tokens after each row), when the request computed
        them and the chunk is not the prompt's end (its last row predicts no prompt token then)."""
        size = self.prefix_cache.chunk_size
        end = (chunk_index + 1) * size
        if chunk is None or request.params.prompt_logprobs is None or end >= request.num_prompt_tokens:
            return
        entries = tuple(request.prompt_logprobs[chunk_index * size + 1:end + 1])
        if len(entries) == size and all(entry is not None for entry in entries):
            chunk.store_prompt_logprobs(self.logprobs_key(request, chunk_index), entries)

    def release(self, request: Request) -> None:
        """The request ends: its private blocks are freed, its cached chunks let go (the last chunk first, so that a
        prompt's tail is evicted before its head)."""
        shared = {b for chunk in request.cached_chunks for b in chunk.block_ids}
        self.free([b for b in request.block_ids if b not in shared])
        self.let_go(request.cached_chunks)
        request.block_ids, request.cached_chunks = [], []

    def let_go(self, chunks: list[CachedChunk]) -> None:
        for chunk in reversed(chunks):
            self.free_block_ids.extend(self.prefix_cache.let_go(chunk))

    def reset_prefix_cache(self) -> int:
        """Forget every cached chunk (held ones are freed when their holders end); -> the blocks freed now."""
        if self.prefix_cache is None:
            return 0
        freed = self.prefix_cache.reset()
        self.free_block_ids.extend(freed)
        return len(freed)


def make_block_manager(config: EngineConfig, num_blocks: int, shares_prefixes: bool = True) -> BlockManager:
    """An engine's or node's block manager, with a prefix cache where config (resolved: EngineConfig.resolved) has
    one in force and the server prefills (shares_prefixes: not a decode node, whose prompt KV is read from others)."""
    cache = None
    if shares_prefixes and config.cache.enable_prefix_caching:
        cache = PrefixCache(config.scheduler.prefill_chunk_size, kv_salt(config))
    return BlockManager(num_blocks, config.cache.block_size, cache)
