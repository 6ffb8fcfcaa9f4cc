"""Blocks adjacent on both sides of a READ travel as one descriptor."""

import pytest

from wire.block_runs import block_runs


@pytest.mark.parametrize("remote, local, runs", [
    ([5, 6, 7], [1, 2, 3], [(5, 1, 3)]),
    ([5, 6, 7], [1, 2, 9], [(5, 1, 2), (7, 9, 1)]),  # NOTE: adjacent remotely only: two descriptors
    ([7, 6], [1, 2], [(7, 1, 1), (6, 2, 1)]),  # NOTE: descending is not a run
    ([3, 4, 9, 10, 11], [20, 21, 1, 2, 3], [(3, 20, 2), (9, 1, 3)]),
    ([4], [8], [(4, 8, 1)]),
])
def test_runs_are_maximal_and_in_order(remote, local, runs):
    assert block_runs(remote, local) == runs
    assert sum(count for _, _, count in runs) == len(local)
