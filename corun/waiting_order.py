"""Which waiting prompts start first when the prefix cache serves some of them (SGLang's cache-aware scheduling).

A prompt the prefix cache serves at least half of starts before the prompts it serves less of; among each group,
arrival order. Requests reach a node in the order their clients' connections deliver them, not grouped: 256
multiple-choice requests sent at once through HTTP arrive with a question's 4 choices scattered. In arrival order the
queue prefills most questions' contexts before the cheap choices that share them, so most first tokens wait for most
of the work; with the served ones first, each question's choices follow its context, as they do when the requests
arrive grouped. On this repository's host (tiny model, chunk 32, 2,048-row packs, 256 requests added at once in a
random order) the median multiple-choice request's first token came at forward 19 of 22 in arrival order and at
forward 12 with the cached first (11 of 21 added grouped); the median multi-turn request's at 14 and 10 of 19.
Among the rest, prompts that share a first chunk wait next to the first of them that arrived, so that one forward
computes their context once and serves it to all of them (corun/scheduler.py pack_prefill_chunks): in arrival order
a forward packs the contexts of the questions that arrived first and reaches few of their choices, which then start
a forward later, when the burst's median first token comes later too (benchmarks/burst_trickle.py: 256 multiple-
choice requests trickling in at 0.3-0.8 ms each on an 8B-shape GPU clock).
A prompt that waited MAX_WAIT_FORWARDS prefill forwards goes by arrival again, however little the cache serves of it,
so prompts the cache serves cannot starve one it does not (each forward is bounded: SchedulerConfig).
NOTE: only when a prompt starts changes: a prompt's outputs depend on the prompt alone (corun/model_runner.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from corun.block_manager import BlockManager
from corun.request import Request

Item = TypeVar("Item")

MAX_WAIT_FORWARDS = 16
"""Prefill forwards a prompt waits behind prompts the cache serves (that arrived after it) at most. The burst above
takes 21 forwards: at 8 its median first token came at forward 15, at 16 at 12. On the GPU (8,192-row packs) the same
burst of 8B-shape prompts takes ~6."""
SCAN_LIMIT = 1024
"""Waiting prompts ordered per forward (a pack takes fewer: corun/scheduler.py PREFIX_WAIT_SCAN); the rest keep
arrival order, so a long queue costs a forward nothing more. A prompt's wait counts from when it is among them."""


class CachedFirst:
    def __init__(self, block_manager: BlockManager):
        self.block_manager = block_manager
        self.num_forwards = 0
        """Prefill forwards run (forward_ran): a waiting prompt's age."""

    def forward_ran(self) -> None:
        self.num_forwards += 1

    def order(self, waiting: Sequence[Item], request_of: Callable[[Item], Request] = lambda item: item
              ) -> Sequence[Item]:
        """waiting (in arrival order) in the order its prompts may start."""
        if self.block_manager.prefix_cache is None or not waiting:
            return waiting
        first, later = [], []
        for index, item in enumerate(waiting):
            if index == SCAN_LIMIT:
                return first + self.grouped(later, request_of) + list(waiting)[SCAN_LIMIT:]
            (first if self.goes_first(request_of(item)) else later).append(item)
        return first + self.grouped(later, request_of)

    def grouped(self, items: list[Item], request_of: Callable[[Item], Request]) -> list[Item]:
        """items with the prompts that share a first chunk next to the first of them that arrived."""
        groups: dict[object, list[Item]] = {}
        for item in items:
            request = request_of(item)
            servable = self.block_manager.num_servable_chunks(request) > 0
            key = self.block_manager.first_chunk_key(request) if servable else id(request)
            groups.setdefault(key, []).append(item)
        return items if len(groups) == len(items) else [item for group in groups.values() for item in group]

    def goes_first(self, request: Request) -> bool:
        if request.first_seen_forward is None:
            request.first_seen_forward = self.num_forwards
        return self.num_forwards - request.first_seen_forward >= MAX_WAIT_FORWARDS or self.mostly_cached(request)

    def mostly_cached(self, request: Request) -> bool:
        """The prefix cache holds at least half of the prompt's tokens."""
        chunk_size = self.block_manager.prefix_cache.chunk_size
        num_chunks_needed = -(-request.num_prompt_tokens // (2 * chunk_size))
        if num_chunks_needed > self.block_manager.num_servable_chunks(request):
            return False
        # NOTE: the first chunk's key alone (one hash, not the prompt's chain) settles most prompts the cache does not
        # serve: 1,024 waiting prompts of 1,000 tokens are ordered in 2.2 ms on first sight and 0.3 ms after, where
        # chaining them takes 37 ms (benchmarks/results/cpu_waiting_order_stop67.json, order_cost)
        if self.block_manager.first_chunk_key(request) not in self.block_manager.prefix_cache.chunks:
            return False
        return len(self.block_manager.cached_prefix(request)) >= num_chunks_needed
