"""Counters of the KV data plane, exported by the nodes in their stats (Pong) and metrics."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class TransferCounters:
    reads_started: int = 0
    """decode: READs posted (start_read calls)."""
    reads_completed: int = 0
    """decode: READs that finished with every byte in place."""
    read_failures: int = 0
    """decode: READs that failed, at post time or later."""
    bytes_read: int = 0
    """decode: bytes of completed READs."""
    blocks_read: int = 0
    """decode: KV blocks of completed READs."""
    read_seconds_total: float = 0.0
    """decode: seconds from posting each completed READ to the poll that saw it done, summed."""
    read_transfer_seconds_total: float = 0.0
    """decode: NIXL's post + transfer time of each completed READ (its telemetry), summed."""
    read_post_seconds_total: float = 0.0
    """decode: the posting part of read_transfer_seconds_total."""
    read_transfer_seconds_max: float = 0.0
    """decode: the slowest completed READ (telemetry): whether a mean is many slow reads or a few very slow ones."""
    reads_over_1ms: int = 0
    """decode: completed READs whose telemetry time exceeded 1 ms."""
    reads_within_1ms: int = 0
    """decode: completed READs whose read_seconds (post to the poll that saw it done) was at most 1 ms; with the
    ones below, cumulative buckets of that time (Prometheus' le buckets): its median is under 5 ms when
    reads_within_5ms >= reads_completed / 2."""
    reads_within_2ms: int = 0
    reads_within_5ms: int = 0
    reads_within_10ms: int = 0
    reads_within_20ms: int = 0
    reads_within_50ms: int = 0
    reads_on_gpu: int = 0
    """decode: READs copied by this process from a prefill node on its GPU (transfer/gpu_peers.py), not by NIXL."""
    read_copy_seconds_total: float = 0.0
    """decode, reads_on_gpu: the GPU's own time from each read's first copy to its last (its events), summed; the rest
    of read_seconds_total is the wait for the copy to run and for the poll that saw it done."""
    descriptors_posted: int = 0
    """decode: descriptors of posted READs (a run of blocks adjacent on both sides is one)."""
    kv_released: int = 0
    """prefill: leases freed after a decode node's completion notification (counted by the prefill node)."""
    lease_expiries: int = 0
    """prefill: leases freed because no decode node claimed or finished them in time (counted by the prefill node)."""

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


READ_MS_BUCKETS = (1, 2, 5, 10, 20, 50)
"""The reads_within_{ms}ms buckets."""


def count_read_time(counters: TransferCounters, seconds: float) -> None:
    counters.read_seconds_total += seconds
    for ms in READ_MS_BUCKETS:
        if seconds * 1e3 <= ms:
            field = f"reads_within_{ms}ms"
            setattr(counters, field, getattr(counters, field) + 1)
