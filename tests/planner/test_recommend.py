"""The planner's deployments (colocated nodes, P/D with the KV hand-off, P/D sharing a GPU), its recommendation and
summary, the plot, and the SLO flags' unit: milliseconds everywhere, old spellings and implausible values refused."""

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest

from benchmarks.harness import parse_goodput
from cli.main import main
from planner.capacity_model import PrefillInterference, WorkloadStats, normal_survival, shared_gpu_delay
from planner.deployments import ClusterModel, Deployment, candidates, predict
from planner.perf_profile import KVHandoff, PerformanceProfile, SharedGPU
from planner.plan import SLO, named_workload, plan, split_too_long
from planner.recommend import recommend
from tests.planner.test_planner import H200_DECODE, H200_LIKE, plan_argv, synthetic_profile

SMALL_HANDOFF = KVHandoff(0.001, 0.0, "test")
SHARED = SharedGPU(1.25, 1.9, KVHandoff(0.021, 0.0, "test"), "test")
TIGHT_TPOT = SLO.from_ms(1000, 20)


def cluster_model(handoff: KVHandoff = SMALL_HANDOFF, shared: SharedGPU | None = None,
                  budget: int = 8192) -> ClusterModel:
    return ClusterModel(H200_LIKE, H200_DECODE, budget, handoff, shared)


def stats_at(rate: float, name: str = "sharegpt") -> WorkloadStats:
    workload = split_too_long(named_workload(name, rate, num_samples=400), H200_DECODE)[0]
    return WorkloadStats.of(workload, H200_LIKE, H200_DECODE)


# --- the unit convention ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("old_flag, new_flag", [("--ttft-p99", "--ttft-p99-ms"), ("--tpot", "--tpot-p99-ms")])
def test_the_old_slo_flags_are_refused_with_the_new_flag_and_unit(tmp_path, capsys, old_flag, new_flag):
    synthetic_profile(H200_LIKE).save(tmp_path / "profile.json")
    with pytest.raises(SystemExit) as exit_info:
        main(plan_argv(tmp_path / "profile.json", old_flag, "0.05"))
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in error
    assert f"{old_flag} is gone" in error and new_flag in error and "milliseconds" in error


@pytest.mark.parametrize("flag, value", [("--tpot-p99-ms", "0.05"), ("--ttft-p99-ms", "0.5"),
                                         ("--tpot-p99-ms", "nan")])
def test_slo_values_implausible_as_milliseconds_are_refused(tmp_path, capsys, flag, value):
    synthetic_profile(H200_LIKE).save(tmp_path / "profile.json")
    argv = plan_argv(tmp_path / "profile.json")
    argv[argv.index(flag) + 1] = value
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("corun plan: error:") and "milliseconds" in error and "at least 1 ms" in error


def test_the_new_flags_are_milliseconds_as_bench_goodput_takes_them(tmp_path, capsys):
    synthetic_profile(H200_LIKE).save(tmp_path / "profile.json")
    assert main(plan_argv(tmp_path / "profile.json", "--simulate-requests", "0")) == 0
    assert json.loads(capsys.readouterr().out)["slo"] == {"ttft_p99_s": 1.0, "tpot_p99_s": 0.03}
    assert parse_goodput(["ttft:1000", "tpot:30"]).describe() == {"ttft_ms": 1000.0, "tpot_ms": 30.0}
    with pytest.raises(ValueError, match="at least 1 ms"):
        parse_goodput(["tpot:0.05"])


# --- the model: colocated nodes, the hand-off, a shared GPU -----------------------------------------------------

def test_the_kv_handoff_adds_to_the_p_d_ttft_and_not_to_the_colocated_node():
    stats, slo = stats_at(1.0), SLO.from_ms(5000, 50)
    pd, colocated = Deployment.disaggregated(1, 1), Deployment.colocated(1)
    slow_handoff = KVHandoff(0.05, 0.0, "test")
    ttft = {handoff: predict(cluster_model(handoff), pd, stats, slo).ttft_p99_s for handoff in (KVHandoff(),
                                                                                                slow_handoff)}
    assert ttft[slow_handoff] - ttft[KVHandoff()] == pytest.approx(0.05, rel=0.1)
    assert predict(cluster_model(slow_handoff), colocated, stats, slo) == \
        predict(cluster_model(KVHandoff()), colocated, stats, slo)
    workload = split_too_long(named_workload("sharegpt", 1.0, num_samples=400), H200_DECODE)[0]
    sized = [plan(H200_LIKE, workload, slo, H200_DECODE, kv_handoff=handoff) for handoff in (KVHandoff(),
                                                                                             slow_handoff)]
    assert sized[1].prediction.ttft_p99_s > sized[0].prediction.ttft_p99_s + 0.04


def test_a_colocated_node_s_tpot_grows_with_its_prefill_load_and_a_budget_delays_its_prefills():
    slo = SLO.from_ms(5000, 50)
    colocated, pd = Deployment.colocated(1), Deployment.disaggregated(1, 1)
    quiet, busy = stats_at(0.5), stats_at(25.0)
    # alone, a colocated node decodes at the decode node's step; under prefill load its rows wait for prefills
    assert predict(cluster_model(), colocated, quiet, slo).tpot_p99_s == pytest.approx(
        predict(cluster_model(), pd, quiet, slo).tpot_p99_s, rel=0.05)
    assert predict(cluster_model(), colocated, busy, slo).tpot_p99_s > \
        1.3 * predict(cluster_model(), pd, busy, slo).tpot_p99_s
    # a small prefill token budget puts more decode steps inside each prefill: a longer TTFT
    assert predict(cluster_model(budget=256), colocated, busy, slo).ttft_p99_s > \
        predict(cluster_model(budget=0), colocated, busy, slo).ttft_p99_s


def test_p_d_sharing_a_gpu_is_offered_only_when_measured_and_is_slower_than_a_gpu_each():
    assert not any(d.kind == "shared_gpu" for d in candidates(4, shared_gpu_measured=False))
    assert Deployment.shared_gpu(2) in candidates(4, shared_gpu_measured=True)
    assert len(candidates(3, False)) == 3 + 3  # 1-3 colocated; 1:1, 1:2, 2:1
    stats, slo = stats_at(15.0), SLO.from_ms(5000, 50)
    shared = predict(cluster_model(shared=SHARED), Deployment.shared_gpu(1), stats, slo)
    own = predict(cluster_model(shared=SHARED), Deployment.disaggregated(1, 1), stats, slo)
    assert shared.ttft_p99_s > own.ttft_p99_s + 0.02 and shared.tpot_p99_s > own.tpot_p99_s
    with pytest.raises(ValueError, match="no shared_gpu"):
        predict(cluster_model(), Deployment.shared_gpu(1), stats, slo)


# --- the recommendation -----------------------------------------------------------------------------------------

def test_colocated_at_a_low_rate_p_d_at_a_high_rate_under_a_tight_tpot():
    cluster = cluster_model()
    low = recommend(cluster, stats_at(2.0), TIGHT_TPOT, num_gpus=2)
    assert low.meets_slo and low.chosen.deployment == Deployment.colocated(1)  # one GPU is enough, no hand-off
    high_stats = stats_at(40.0)
    high = recommend(cluster, high_stats, TIGHT_TPOT, num_gpus=2)
    assert high.meets_slo and high.chosen.deployment.kind == "disaggregated"
    # why, in the model's own numbers: the colocated nodes' rows wait for prefills past the TPOT target
    for outlook in high.outlooks:
        if outlook.deployment.kind == "colocated":
            assert outlook.tpot_p99_s > TIGHT_TPOT.tpot_p99_s
    assert high.capacity_req_per_s >= 40.0


@pytest.mark.parametrize("rate, slo_ms, name", [(3.0, (300, 15), "burstgpt"), (20.0, (1000, 20), "sharegpt"),
                                                (35.0, (500, 40), "burstgpt"), (80.0, (2000, 30), "sharegpt")])
def test_the_recommendation_meets_the_slo_whenever_a_candidate_does(rate, slo_ms, name):
    slo, stats = SLO.from_ms(*slo_ms), stats_at(rate, name)
    result = recommend(cluster_model(shared=SHARED), stats, slo, num_gpus=3)
    meeting = [o for o in result.outlooks if o.meets(slo, 0.9)]
    assert result.meets_slo == bool(meeting)
    if meeting:
        assert result.chosen.meets(slo, 0.9)
        assert result.chosen.deployment.num_gpus == min(o.deployment.num_gpus for o in meeting)
    else:
        assert result.chosen.goodput_req_per_s == max(o.goodput_req_per_s for o in result.outlooks)
        assert result.summary[0].startswith("No deployment on 3 GPU(s) meets")


def test_the_summary_names_the_recommendation_and_the_plot_is_a_png(tmp_path, capsys):
    profile = PerformanceProfile(**synthetic_profile(H200_LIKE).__dict__ | {"kv_handoff": SMALL_HANDOFF})
    profile.save(tmp_path / "profile.json")
    plot = tmp_path / "plan.png"
    argv = plan_argv(tmp_path / "profile.json", "--gpus", "2", "--plot", str(plot), "--simulate-requests", "0")
    assert main(argv) == 0
    captured = capsys.readouterr()
    recommendation = json.loads(captured.out)["recommendation"]
    assert recommendation["meets_slo"] and recommendation["gpus"] <= 2
    summary = captured.err.splitlines()
    assert summary[0].startswith(f"Recommended: {recommendation['deployment']} on ")
    assert recommendation["serve_flags"] in summary[0] and f"Plot: {plot}" in summary
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and plot.stat().st_size > 10_000


def test_a_profile_keeps_its_handoffs_and_budget_through_json(tmp_path):
    profile = PerformanceProfile(**synthetic_profile(H200_LIKE).__dict__ | {
        "kv_handoff": SMALL_HANDOFF, "shared_gpu": SHARED, "prefill_token_budget": 2048})
    profile.save(tmp_path / "profile.json")
    assert PerformanceProfile.load(tmp_path / "profile.json") == profile
    cluster = ClusterModel.of(H200_LIKE, profile, H200_DECODE)
    assert (cluster.prefill_token_budget, cluster.kv_handoff, cluster.shared_gpu) == (2048, SMALL_HANDOFF, SHARED)


def test_the_h200_profile_says_where_its_handoff_numbers_come_from():
    from benchmarks.derive_h200_profile import derive_profile

    profile = derive_profile()
    assert 0.0001 < profile.kv_handoff.seconds(4096) < 0.001  # 0.58 ms measured for 604 MB, idle
    assert 0.020 < profile.shared_gpu.kv_handoff.per_request_s < 0.022  # 21 ms under ShareGPT-like load
    assert "h200_kv_transfer.json" in profile.kv_handoff.source
    assert "h200_front_door_before_push.json" in profile.shared_gpu.kv_handoff.source
    assert 1.2 < profile.shared_gpu.decode_stretch < 1.3 and 1.8 < profile.shared_gpu.prefill_stretch < 2.0


# --- a decoding row's TPOT under the prefills of its GPU ----------------------------------------------------------

def test_a_colocated_row_s_tpot_p99_counts_the_prefills_its_own_decode_catches():
    slo, colocated = SLO.from_ms(5000, 50), Deployment.colocated(1)
    outlooks = [predict(cluster_model(), colocated, stats_at(rate, "burstgpt"), slo) for rate in (2.0, 8.0, 16.0)]
    # the mean interval hides the jumps: a short request that catches a long prompt's prefill sets the p99
    assert all(o.tpot_p99_s > 1.15 * o.token_interval_s for o in outlooks[1:])
    assert outlooks[0].tpot_p99_s < outlooks[1].tpot_p99_s < outlooks[2].tpot_p99_s


def test_1p1d_on_one_gpu_stretches_the_decode_by_the_prefill_s_stretch_while_the_prefill_runs():
    """Two contexts time-slice in equal slices: while a prefill runs (prefill_stretch times as long), the decode
    steps go as many times slower; the whole-run decode_stretch plays no part."""
    stats, slo, shared = stats_at(15.0), SLO.from_ms(5000, 50), Deployment.shared_gpu(1)
    prefill_busy = stats.rate * float(stats.prefill_s.mean())
    for decode_stretch, prefill_stretch in ((1.25, 1.9), (2.0, 2.0)):
        profile = SharedGPU(decode_stretch, prefill_stretch, KVHandoff(0.021, 0.0, "test"), "test")
        outlook = predict(cluster_model(shared=profile), shared, stats, slo)
        lost = prefill_busy * shared_gpu_delay(prefill_stretch)
        unshared = predict(cluster_model(shared=profile), Deployment.disaggregated(1, 1), stats, slo)
        assert outlook.token_interval_s == pytest.approx(unshared.token_interval_s / (1 - lost), rel=0.02)
    assert shared_gpu_delay(2.0) == 1.0 and shared_gpu_delay(1.0) == 0.0
    stretched = [predict(cluster_model(shared=SharedGPU(1.25, s, KVHandoff(), "test")), shared, stats, slo).tpot_p99_s
                 for s in (1.1, 1.5, 1.9)]
    assert stretched == sorted(stretched) and stretched[-1] > 1.2 * stretched[0]
    by_decode_stretch = {predict(cluster_model(shared=SharedGPU(s, 1.9, KVHandoff(), "test")), shared, stats,
                                 slo).tpot_p99_s for s in (1.1, 2.0)}
    assert len(by_decode_stretch) == 1


def test_1p1d_on_one_gpu_holds_the_kv_its_decode_process_measured_there():
    """The two processes on one GPU split its memory: the decode process's KV (not the whole GPU's) bounds the rows
    it admits. The inverse: a profile without the figure (made before it was recorded) keeps the whole GPU's."""
    stats, slo, shared = stats_at(2.0, "1024x2048"), SLO.from_ms(5000, 50), Deployment.shared_gpu(1)
    whole = predict(cluster_model(shared=SHARED), shared, stats, slo)
    for part in (0.75, 0.5):
        split = dataclasses.replace(SHARED, decode_kv_capacity_tokens=int(part * H200_DECODE.kv_capacity_tokens))
        outlook = predict(cluster_model(shared=split), shared, stats, slo)
        assert math.isfinite(outlook.max_utilization) and outlook.max_utilization > whole.max_utilization
    apart = dataclasses.replace(SHARED, decode_kv_capacity_tokens=H200_DECODE.kv_capacity_tokens // 2)
    assert predict(cluster_model(shared=apart), Deployment.disaggregated(1, 1), stats, slo) == \
        predict(cluster_model(shared=SHARED), Deployment.disaggregated(1, 1), stats, slo)
    with pytest.raises(ValueError, match="decode_kv_capacity_tokens must be >= 1"):
        dataclasses.replace(SHARED, decode_kv_capacity_tokens=0)


def test_prefill_interference_refuses_what_cannot_be_one():
    with pytest.raises(ValueError, match="rate >= 0"):
        PrefillInterference(-1.0, np.array([0.01]), 1.0)
    with pytest.raises(ValueError, match="max_delay_per_step_s > 0"):
        PrefillInterference(1.0, np.array([0.01]), 1.0, 0.0)
    with pytest.raises(ValueError, match="prefill seconds > 0"):
        PrefillInterference(1.0, np.array([]), 1.0)
    with pytest.raises(ValueError, match="prefill stretch must be >= 1"):
        shared_gpu_delay(0.9)


def test_the_prefill_delays_are_seeded_and_average_to_the_lost_fraction():
    interference = PrefillInterference(20.0, np.array([0.01, 0.02, 0.09]), 1.0)
    windows, steps = np.full(500, 2.0), np.full(500, 100.0)
    delays = interference.delays(windows, steps)
    assert np.array_equal(delays, interference.delays(windows, steps))
    assert delays.mean() == pytest.approx(interference.lost_fraction * 2.0, rel=0.05)
    capped = PrefillInterference(20.0, np.array([0.01, 0.02, 0.09]), 1.0, max_delay_per_step_s=0.001)
    assert (capped.delays(windows, steps) <= 0.1 + 1e-12).all()


def test_normal_survival_matches_erfc():
    z = np.linspace(-6, 6, 241)
    expected = np.array([0.5 * math.erfc(x / math.sqrt(2)) for x in z])
    assert np.allclose(normal_survival(z), expected, rtol=1e-6, atol=1e-12)


def test_normal_survival_of_a_spread_of_zero_is_exact_and_quiet():
    """A request with no spread reaches it as z ~ +-1e300 (capacity_model divides by max(spread, 1e-300))."""
    z = np.array([1e300, -1e300, 40.0, -40.0, 1e10])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NOTE: x * x overflowed here (a RuntimeWarning) before the cap
        survival = normal_survival(z)
    assert survival.tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]
