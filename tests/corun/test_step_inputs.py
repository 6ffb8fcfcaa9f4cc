"""Decode-step inputs: the engine's cached block-table rows equal a fresh build, and follow replaced blocks."""

import torch

from corun.block_manager import NULL_BLOCK
from corun.request import Request
from corun.step_inputs import BlockTableRows, build_window_decode
from wire.sampling_params import SamplingParams


def request(i: int, blocks: list[int]) -> Request:
    r = Request.create(str(i), list(range(20 + i)), SamplingParams(max_tokens=8), i, frozenset())
    r.block_ids, r.output_token_ids = blocks, [7]
    return r


def test_cached_rows_equal_a_fresh_build_and_follow_new_blocks():
    rows = BlockTableRows(window_blocks=4)
    requests = [request(0, [3, 4]), request(1, [9, 10, 11, 12, 13])]  # the second overflows the window
    cached = build_window_decode(requests, 4, 4, 16, rows)
    fresh = build_window_decode(requests, 4, 4, 16)
    for name in ("input_ids", "positions", "slot_blocks", "slot_offsets", "block_tables", "context_lens"):
        assert torch.equal(getattr(cached, name), getattr(fresh, name)), name
    assert cached.block_tables.tolist() == [[3, 4, NULL_BLOCK, NULL_BLOCK], [9, 10, 11, 12]] + [[NULL_BLOCK] * 4] * 2
    requests[0].block_ids = [5, 6, 7]  # e.g. the request finished and its object was reused by a test
    assert build_window_decode(requests, 2, 4, 16, rows).block_tables[0].tolist() == [5, 6, 7, NULL_BLOCK]
    assert build_window_decode([], 0, 4, 16, rows).block_tables.shape == (0, 4)
