"""`corun bench` without a model: arrival times, SLO targets and goodput, and the synthetic workloads."""

import json
import math
import statistics

import pytest

from benchmarks.harness import RequestOutcome, SLOTargets, count_good, parse_goodput
from planner.workloads import Arrivals, Workload, check_fits, make_workload


def gaps(times: tuple[float, ...]) -> list[float]:
    return [later - earlier for earlier, later in zip(times, times[1:])]


def test_arrival_times_are_seeded_and_start_at_zero():
    first = Arrivals(request_rate=5.0, seed=1).times(100)
    assert first == Arrivals(request_rate=5.0, seed=1).times(100) != Arrivals(request_rate=5.0, seed=2).times(100)
    assert first[0] == 0.0 and all(gap > 0 for gap in gaps(first)) and len(first) == 100


def test_poisson_gaps_have_mean_one_over_rate_and_burstiness_sets_their_spread():
    poisson = gaps(Arrivals(request_rate=20.0, seed=0).times(20001))
    assert statistics.mean(poisson) == pytest.approx(1 / 20, rel=0.03)
    assert statistics.stdev(poisson) / statistics.mean(poisson) == pytest.approx(1.0, rel=0.05)  # exponential
    even = gaps(Arrivals(request_rate=20.0, burstiness=4.0, seed=0).times(20001))
    assert statistics.mean(even) == pytest.approx(1 / 20, rel=0.03)
    assert statistics.stdev(even) / statistics.mean(even) == pytest.approx(0.5, rel=0.05)  # gamma: 1/sqrt(shape)


def test_infinite_rate_sends_everything_at_zero_and_is_written_as_inf():
    arrivals = Arrivals()
    assert arrivals.times(5) == (0.0,) * 5
    assert json.loads(json.dumps(arrivals.describe(), allow_nan=False))["request_rate"] == "inf"


@pytest.mark.parametrize("rate, burstiness", [(0.0, 1.0), (-1.0, 1.0), (math.nan, 1.0), (1.0, 0.0), (1.0, math.inf)])
def test_bad_arrivals_are_refused(rate, burstiness):
    with pytest.raises(ValueError, match="request rate|burstiness"):
        Arrivals(request_rate=rate, burstiness=burstiness)


def test_goodput_flag_parses_ttft_and_tpot():
    assert parse_goodput(["ttft:500", "tpot:50"]) == SLOTargets(ttft_ms=500.0, tpot_ms=50.0)
    assert parse_goodput(["ttft:500,tpot:50"]) == SLOTargets(ttft_ms=500.0, tpot_ms=50.0)
    assert parse_goodput(["tpot:2.5"]).describe() == {"tpot_ms": 2.5}
    assert parse_goodput(None) == SLOTargets() and SLOTargets().describe() == {}


@pytest.mark.parametrize("pairs, message", [
    (["e2el:100"], "expected ttft:<ms> or tpot:<ms>"), (["ttft"], "expected ttft:<ms>"),
    (["ttft:fast"], "not a number"), (["ttft:0"], "at least 1 ms"), (["tpot:-5"], "at least 1 ms"),
    (["ttft:inf"], "at least 1 ms"), (["ttft:nan"], "at least 1 ms"), (["tpot:0.05"], "in milliseconds"),
    (["ttft:1", "ttft:2"], "given twice")])
def test_bad_goodput_flags_are_refused(pairs, message):
    with pytest.raises(ValueError, match=message):
        parse_goodput(pairs)


def test_good_requests_finished_and_met_every_target():
    outcomes = [RequestOutcome(True, 0.2, 0.010), RequestOutcome(True, 0.9, 0.030),
                RequestOutcome(True, 0.1, None), RequestOutcome(False, 0.1, 0.001), RequestOutcome(False, None, None)]
    assert count_good(outcomes, SLOTargets(ttft_ms=0.001)) == 0
    assert count_good(outcomes, SLOTargets(ttft_ms=1e6, tpot_ms=1e6)) == 3  # every finished one, no more
    assert count_good(outcomes, SLOTargets(ttft_ms=500)) == 2
    assert count_good(outcomes, SLOTargets(tpot_ms=20)) == 2  # one output token: no TPOT to miss
    assert count_good(outcomes, SLOTargets(ttft_ms=500, tpot_ms=5)) == 1
    assert count_good(outcomes, SLOTargets()) == 3


def test_burstgpt_lengths_are_unchanged():
    # NOTE: pinned from the mix before the workloads moved to bench_workloads: earlier results must stay comparable
    workload = make_workload("burstgpt", 256, seed=0)
    assert workload.lengths[:4] == ((417, 206), (924, 181), (1758, 43), (628, 60))
    assert sum(i for i, _ in workload.lengths) == 181765 and sum(o for _, o in workload.lengths) == 85484


def test_sharegpt_is_short_prompts_medium_outputs_seeded_and_bounded():
    workload = make_workload("sharegpt", 5000, seed=1)
    assert workload == make_workload("sharegpt", 5000, seed=1) != make_workload("sharegpt", 5000, seed=2)
    assert all(4 <= i <= 2048 and 8 <= o <= 1024 for i, o in workload.lengths)
    assert statistics.mean(i for i, _ in workload.lengths) == pytest.approx(300, rel=0.05)
    assert statistics.median(i for i, _ in workload.lengths) == pytest.approx(250, rel=0.05)
    assert statistics.mean(o for _, o in workload.lengths) == pytest.approx(250, rel=0.05)


def test_rl_rollout_is_512_uniform_requests_by_default():
    workload = make_workload("rl_rollout", seed=3)
    assert len(workload.lengths) == 512 and workload == make_workload("rl_rollout", seed=3)
    assert workload != make_workload("rl_rollout", seed=4)
    assert all(100 <= i <= 400 and 256 <= o <= 1024 for i, o in workload.lengths)
    prompts, outputs = [i for i, _ in workload.lengths], [o for _, o in workload.lengths]
    assert min(prompts) < 110 and max(prompts) > 390 and min(outputs) < 280 and max(outputs) > 1000  # uniform
    assert len(make_workload("rl_rollout", 7).lengths) == 7


def test_request_counts_default_per_workload_and_are_checked():
    assert len(make_workload("sharegpt").lengths) == len(make_workload("1024x128").lengths) == 256
    with pytest.raises(ValueError, match="num_requests must be >= 1"):
        make_workload("burstgpt", 0)
    with pytest.raises(ValueError, match="unknown workload 'chat'.*rl_rollout"):
        make_workload("chat")


def test_check_fits_names_the_workload_and_the_numbers():
    check_fits(Workload("ok", ((100, 60),)), max_model_len=160)
    with pytest.raises(ValueError, match=r"'4096x128': 2 of 2 requests exceed max_model_len 1024 .*4224 tokens"):
        check_fits(make_workload("4096x128", 2), max_model_len=1024)
