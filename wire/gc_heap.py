"""The startup heap kept out of Python's cyclic garbage collection (vLLM's freeze_gc_heap, in its API server and
engine core): a long-lived process builds most of its objects at startup (modules, the tokenizer, configs), and
every full collection would walk them all again, while a request's garbage sits in the young generations.

Measured on the router (perf, 256 multiple-choice requests of 500 token ids at once): the collector's traversals
(gc_collect_main, visit_decref, visit_reachable, ...) took ~13% of its CPU.
"""

from __future__ import annotations

import gc
import time
from bisect import bisect_left
from collections.abc import Callable


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
