"""The decode node's KV read times as cumulative buckets (what a median under load is read from)."""

from transfer.counters import READ_MS_BUCKETS, TransferCounters, count_read_time


def test_a_read_counts_in_every_bucket_at_or_above_its_time():
    counters = TransferCounters()
    for seconds in (0.0004, 0.003, 0.003, 0.07):
        count_read_time(counters, seconds)
    within = {ms: getattr(counters, f"reads_within_{ms}ms") for ms in READ_MS_BUCKETS}
    assert within == {1: 1, 2: 1, 5: 3, 10: 3, 20: 3, 50: 3}  # NOTE: the 70 ms read is in none
    assert abs(counters.read_seconds_total - 0.0764) < 1e-12
