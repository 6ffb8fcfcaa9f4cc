"""The startup heap kept out of Python's cyclic garbage collection (vLLM's freeze_gc_heap, in its API server and
engine core): a long-lived process builds most of its objects at startup (modules, the tokenizer, configs), and
every full collection would walk them all again, while a request's garbage sits in the young generations. And
full collections spread out (spread_full_collections), for what a burst keeps alive.

Measured on the router (perf, 256 multiple-choice requests of 500 token ids at once): the collector's traversals
(gc_collect_main, visit_decref, visit_reachable, ...) took ~13% of its CPU.
"""

from __future__ import annotations

import gc
import time
from bisect import bisect_left
from collections.abc import Callable

FULL_COLLECTION_THRESHOLD = 100
"""gc's third threshold: a full collection waits for this many second-generation ones (CPython's default: 10).
NOTE: a burst of requests keeps thousands of them alive for seconds (each with its task, its reply queue and its
prompt's token ids), and every full collection walks them all: measured on this repository's 2-core host (router,
`benchmarks.router_burst --model /tmp/q8 --num-requests 4096`, multiple choice, twice each), 9 full collections
took 1.1 s of the router's 3.7 s of CPU (the longest 287 ms). At 100: 1 full collection (0.03 s; the longest pause of
any generation 29 ms), 496-500 against 762-764 us of router CPU per request, client TTFT p50 1.81-1.85 against
2.86-2.95 s (benchmarks/results/README.md, stop 64). At 256 streamed requests (`benchmarks.router_throughput`, five
rounds alternating with the commit before, stop 65): no collection pause over 5 ms in an 8-s window against 2 in
every run before, added ITL p99 3.4-4.5 against 3.8-5.9 ms, the CPU per token level. The young generations keep
their defaults: a request's own garbage dies there."""


def spread_full_collections() -> None:
    """Full collections at most every FULL_COLLECTION_THRESHOLD second-generation ones. Call once, at startup."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_THRESHOLD)


def freeze_startup_heap() -> None:
    """Collect what startup left as garbage, then move every object still tracked to the permanent generation,
    which no collection walks. Call once, when the process is ready to serve."""
    gc.collect()
    gc.freeze()


class CollectionPauses:
    """The pauses of this process' cyclic collections, counted per generation into histogram buckets until taken.
    NOTE: a collection runs wherever an allocation triggers it, even inside a lock its code holds (a Prometheus
    metric's), so the callback only adds to numbers kept here (no allocation of its own, bounded memory however long
    nobody takes them); take() hands them to whoever reports them, outside the collector."""

    def __init__(self, bounds: tuple[float, ...], clock: Callable[[], float] = time.perf_counter):
        """bounds: the buckets' upper bounds, ascending, the last +inf (a pause counts in the first it is <=)."""
        self._bounds, self._clock = bounds, clock
        self._started = 0.0
        self._counts = [[0] * len(bounds) for _ in range(NUM_GENERATIONS)]
        self._sums = [0.0] * NUM_GENERATIONS

    def start(self) -> None:
        gc.callbacks.append(self._on_collection)

    def stop(self) -> None:
        gc.callbacks.remove(self._on_collection)

    def take(self) -> list[tuple[int, list[int], float]]:
        """(generation, pauses per bucket, their total seconds) of each generation collected since the last take."""
        taken = [(generation, counts, total) for generation, (counts, total) in enumerate(zip(self._counts,
                                                                                              self._sums))
                 if any(counts)]
        for generation, _, _ in taken:
            self._counts[generation] = [0] * len(self._bounds)
            self._sums[generation] = 0.0
        return taken

    def _on_collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = self._clock()
            return
        # NOTE: bounded, should a later CPython name a generation past the three it has had
        seconds, generation = self._clock() - self._started, min(info["generation"], NUM_GENERATIONS - 1)
        self._counts[generation][bisect_left(self._bounds, seconds)] += 1
        self._sums[generation] += seconds


NUM_GENERATIONS = 3
"""CPython's collector's generations (gc.get_count() has one count each)."""
