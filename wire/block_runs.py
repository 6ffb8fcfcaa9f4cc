"""Runs of KV block ids: one copy per run, wherever blocks move (a KV READ between nodes, a swap to host memory)."""

from __future__ import annotations

from collections.abc import Sequence


def block_runs(source_block_ids: Sequence[int], target_block_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """(source first block, target first block, blocks) of the maximal runs adjacent on both sides, in order."""
    runs: list[list[int]] = []
    for source, target in zip(source_block_ids, target_block_ids, strict=True):
        if runs and runs[-1][0] + runs[-1][2] == source and runs[-1][1] + runs[-1][2] == target:
            runs[-1][2] += 1
        else:
            runs.append([source, target, 1])
    return [(source, target, count) for source, target, count in runs]
