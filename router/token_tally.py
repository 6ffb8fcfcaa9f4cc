"""The router's per-token series, counted in plain numbers and written to Prometheus once per event-loop turn.

NOTE (issue 21): every prometheus_client update takes a lock (and, beside other routers, writes to a memory-mapped
file). A streamed token made three of them (vllm:generation_tokens, and the sum and a bucket of
vllm:inter_token_latency_seconds): ~10% of the router's CPU per token at 128 streams. The router is one event loop,
so the tally needs no lock; the tokens of one loop turn (a decode step's, for every stream) are written in one
update per series, by a flush scheduled at the turn's first token. /metrics flushes before it renders.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left

from prometheus_client import Counter, Histogram


class StreamedTokenTally:
    def __init__(self, generated_tokens: Counter, inter_token_latency: Histogram):
        """generated_tokens, inter_token_latency: the labelled children the tally writes to."""
        self._generated_tokens = generated_tokens
        self._inter_token_latency = inter_token_latency
        self._bounds = tuple(inter_token_latency._upper_bounds)
        """The histogram's own bucket bounds, +Inf last (see flush on its internals)."""
        self._num_tokens = 0
        self._gap_counts = [0] * len(self._bounds)
        """Per bucket (le bound i): gaps since the last flush (not cumulative)."""
        self._gap_sum = 0.0
        self._flush_scheduled = False

    def add(self, num_tokens: int, gap_s: float | None) -> None:
        """num_tokens streamed to a client; gap_s: the time since its sample's previous tokens (None for its
        first)."""
        self._num_tokens += num_tokens
        if gap_s is not None:
            # NOTE: bucket i counts gaps <= bounds[i] (Prometheus' le), as Histogram.observe places them
            self._gap_counts[bisect_left(self._bounds, gap_s)] += 1
            self._gap_sum += gap_s
        if not self._flush_scheduled:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # NOTE: outside the router's loop (a synchronous caller): nothing to batch with
            self.flush()
            return
        self._flush_scheduled = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if self._num_tokens:
            self._generated_tokens.inc(self._num_tokens)
            self._num_tokens = 0
        if any(self._gap_counts):
            observe_counts(self._inter_token_latency, self._gap_counts, self._gap_sum)
            self._gap_counts = [0] * len(self._gap_counts)
            self._gap_sum = 0.0


def observe_counts(histogram: Histogram, counts: list[int], total: float) -> None:
    """As many observe() calls as counts holds per bucket (histogram's own bounds), summing to total.
    NOTE: prometheus_client has no bulk observe: its Histogram keeps a value per bucket (_buckets, not cumulative) and
    _sum, the values observe() increments (tests/router/test_token_tally.py compares the exposition with observe()'s,
    for the streamed tokens and the collector's pauses, so a change of those internals fails there)."""
    for index, count in enumerate(counts):
        if count:
            histogram._buckets[index].inc(count)
    histogram._sum.inc(total)
