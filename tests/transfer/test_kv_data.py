"""check_kv_data: KV data is one block-major tensor or segments whose block b is one same-sized region in each."""

from __future__ import annotations

import pytest
import torch

from tests.transfer import scenario
from transfer.reads import check_kv_data


@pytest.mark.parametrize("kv_data", [
    scenario.empty_kv(),
    scenario.empty_segments(),
    tuple(scenario.empty_segments()),
    # NOTE: only the bytes of a block must agree, not the shape or dtype of a segment
    [torch.zeros(12, 4, 8), torch.zeros(12, 8, 2, dtype=torch.float64)],
], ids=["one tensor", "segment list", "segment tuple", "alike bytes per block"])
def test_one_tensor_or_alike_segments_are_accepted(kv_data):
    check_kv_data(kv_data)


@pytest.mark.parametrize("kv_data, error", [
    ([], "at least one segment"),
    ([torch.zeros(12, 4, 8), torch.zeros(10, 4, 8)], r"same number of blocks, got \[12, 10\]"),
    ([torch.zeros(12, 4, 8), torch.zeros(12, 4, 4)], r"same bytes per block, got \[128, 64\]"),
    ([torch.zeros(12, 4, 8), torch.zeros(12, 4, 8, dtype=torch.float16)], "same bytes per block"),
    ([torch.zeros(12, 4, 8), torch.zeros(12, 8, 4).transpose(1, 2)], "KV segment 1 must be one contiguous"),
    ([torch.zeros(12, 4, 8), torch.zeros(12, 4, 8, device="meta")], r"same device, got \['cpu', 'meta'\]"),
    ([torch.zeros(12, 4, 8), torch.zeros(1, 4, 8)], "KV segment 1 .* >= 2 blocks"),
    ([torch.zeros(12)], "KV segment 0 must be one contiguous block-major tensor"),
    ([torch.zeros(12, 4, 8), "not a tensor"], "KV segment 1 must be a tensor"),
], ids=["none", "num blocks", "block bytes", "dtype", "non-contiguous", "mixed devices", "one block", "1-d",
        "not a tensor"])
def test_mismatched_segments_are_refused_naming_what_differs(kv_data, error):
    with pytest.raises(ValueError, match=error):
        check_kv_data(kv_data)
