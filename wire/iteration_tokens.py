"""Tokens per engine step, counted on a node and summed by the router into vLLM's vllm:iteration_tokens_total.

A node keeps cumulative counts per bucket (vLLM's bounds), which travel in its Pong stats as one JSON-able value;
the router turns the nodes' counts into a Prometheus histogram at scrape time. Counts only grow (a node restarted
starts again from zero, as a restarted vLLM engine's histogram does).
"""

from __future__ import annotations

import bisect

ITERATION_TOKENS_BUCKETS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
"""vLLM's bounds (vllm/v1/metrics/buckets.py ITERATION_TOKENS_BUCKETS); +Inf is the last count."""

STAT_KEY = "iteration_tokens"
"""The Pong stats key: {"bucket_counts": [one per bound, then +Inf; not cumulative], "sum": tokens}."""


class IterationTokenCounts:
    """Per-bucket counts of each forward's tokens, as vLLM counts an engine step's: the prompt tokens it computed
    plus the tokens it sampled (a fixed-shape decode step's padding rows are neither)."""

    def __init__(self):
        self.bucket_counts = [0] * (len(ITERATION_TOKENS_BUCKETS) + 1)
        self.sum = 0

    def observe(self, num_tokens: int) -> None:
        self.bucket_counts[bisect.bisect_left(ITERATION_TOKENS_BUCKETS, num_tokens)] += 1
        self.sum += num_tokens

    def as_stat(self) -> dict:
        return {"bucket_counts": list(self.bucket_counts), "sum": self.sum}


def read_stat(value) -> tuple[list[int], int] | None:
    """(bucket counts, sum) of a node's stat, or None when it is not of that shape (an older node)."""
    if not isinstance(value, dict):
        return None
    counts, total = value.get("bucket_counts"), value.get("sum")
    if not (isinstance(counts, list) and len(counts) == len(ITERATION_TOKENS_BUCKETS) + 1
            and all(isinstance(c, int) for c in counts) and isinstance(total, int)):
        return None
    return counts, total
