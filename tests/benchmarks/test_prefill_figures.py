"""The arithmetic behind issue 20's prefill figures: prefill_cost's GEMM-rate fractions and prefill_gaps' split of a
prefill's wall time (both run on a GPU; their sums are checked here on made-up timings)."""

import pytest

from benchmarks.prefill_cost import floors
from benchmarks.prefill_gaps import split, union_us

HARDWARE = {"copy_bytes_per_s": 3e12, "bf16_flops_per_s": 800e12}
WEIGHT_BYTES = 16 * 10**9


def test_fractions_compare_each_prefill_with_the_gemm_rate_at_its_own_clock():
    flops = 2 * (WEIGHT_BYTES // 2) * 4096
    burst_ms = 1e3 * flops / HARDWARE["bf16_flops_per_s"]
    sustained = HARDWARE | {"bf16_flops_per_s_sustained": 680e12}
    result = floors(4096, alone_s=0.103, hardware=sustained, weight_bytes=WEIGHT_BYTES, rested_s=0.094)
    assert result["gemm_floor_ms"] == pytest.approx(burst_ms, abs=1e-3)
    assert result["gemm_rate_fraction"] == pytest.approx(burst_ms / 103, abs=1e-3)
    assert result["gemm_rate_fraction_rested"] == pytest.approx(burst_ms / 94, abs=1e-3)
    assert result["gemm_rate_fraction_sustained"] == pytest.approx(1e3 * flops / 680e12 / 103, abs=1e-3)
    # NOTE: inverse: a slower sustained rate can only raise the fraction it sets the prefill against
    assert result["gemm_rate_fraction_sustained"] > result["gemm_rate_fraction"]


def test_without_the_rested_run_or_the_sustained_rate_their_fractions_are_absent():
    result = floors(64, alone_s=0.008, hardware=HARDWARE, weight_bytes=WEIGHT_BYTES)
    assert "gemm_rate_fraction_rested" not in result and "gemm_rate_fraction_sustained" not in result
    assert floors(64, alone_s=0.008, hardware={}, weight_bytes=WEIGHT_BYTES) == {}


def test_union_counts_overlapping_kernels_once():
    assert union_us([(0, 10), (5, 15), (20, 30)]) == 25
    assert union_us([]) == 0


def test_a_window_splits_into_host_time_before_gaps_between_and_time_after():
    # window 0-100 us: kernels 10-40 and 50-90 (a 10-us gap), one kernel outside the window
    rows = split([(0.0, 100.0)], [(10.0, 40.0), (50.0, 90.0), (200.0, 300.0)])
    assert rows == [{"wall_ms": 0.1, "kernels_ms": 0.07, "before_first_kernel_ms": 0.01, "after_last_kernel_ms": 0.01,
                     "between_kernels_ms": 0.01, "num_kernels": 2}]
    parts = rows[0]
    assert parts["kernels_ms"] + parts["before_first_kernel_ms"] + parts["between_kernels_ms"] + \
        parts["after_last_kernel_ms"] == pytest.approx(parts["wall_ms"])
    assert split([(0.0, 5.0)], [(10.0, 20.0)]) == []  # NOTE: a window with no kernel gives no row
