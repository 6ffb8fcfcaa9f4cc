"""The planner's validation benchmark, as a CPU smoke run (qwen3-tiny, one rate, short runs): the profile measured
with its KV hand-off, both deployments served, and the JSON the H200 run commits (rows of predicted vs measured)."""

from __future__ import annotations

import json

import pytest

from benchmarks.planner_validation import RESULTS, main, repredict, window_tok_per_s
from planner.deployments import ClusterModel
from planner.perf_profile import PerformanceModel, PerformanceProfile
from planner.plan import DecodeConfig
from planner.workloads import Arrivals, Workload

FIGURES = {"ttft_p99_s", "tpot_p99_s", "tok_per_s"}


@pytest.mark.slow
def test_smoke_run_writes_the_validation_rows(tmp_path):
    out = tmp_path / "validation.json"
    main(["--device", "cpu", "--load-fractions", "0.5", "--arrival-seconds", "2", "--max-seconds", "3",
          "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["profile"]["kv_handoff"]["source"].startswith("measured: NIXL READ")
    rows = report["rows"]
    assert {(row["deployment"], row["workload"]) for row in rows} == {
        (deployment, workload) for deployment in ("colocated", "1p1d") for workload in ("burstgpt", "sharegpt")}
    for row in rows:
        assert {"deployment", "workload", "rate", "predicted", "measured", "within"} <= set(row)
        assert FIGURES <= set(row["predicted"]) and FIGURES <= set(row["measured"])
        assert row["rate"] == pytest.approx(0.5 * report["capacity_req_per_s"][row["workload"]][row["deployment"]],
                                            abs=1e-3)
        assert row["measured"]["detail"]["errors"] == 0 and row["measured"]["ttft_p99_s"] > 0
        assert all(isinstance(row["within"][key]["within"], bool) for key in FIGURES)
    for workload in ("burstgpt", "sharegpt"):
        verdict = report["recommendation_one_gpu"][workload]
        assert verdict["recommended"] == "colocated"  # NOTE: on CPU 1P1D is planned with a device per node
        assert verdict["measured_best"]["deployment"] in ("colocated", "1p1d")


def test_the_committed_h200_rows_are_predicted_again_from_their_own_profile():
    report = repredict(RESULTS / "h200_planner_validation.json")
    committed = json.loads((RESULTS / "h200_planner_validation.json").read_text())
    assert len(report["rows"]) == len(committed["rows"])  # NOTE: repredicted_row rebuilds each run's requests
    for row in report["rows"]:
        now = row["predicted_now"]
        assert now["at_rate_req_per_s"] == pytest.approx(row["realized_rate_req_per_s"], rel=0.01)
        assert FIGURES <= set(now) and set(row["now"]) == FIGURES | {"all_within"}


def test_the_window_s_tokens_approach_the_steady_state_as_the_run_outlasts_the_outputs():
    report = json.loads((RESULTS / "h200_planner_validation.json").read_text())
    profile = PerformanceProfile.from_dict(report["profile"])
    node = DecodeConfig(profile.max_num_seqs, profile.kv_capacity_tokens, profile.max_model_len, profile.block_size)
    cluster = ClusterModel.of(PerformanceModel.fit(profile), profile, node)
    workload = Workload("fixed", ((100, 50),) * 4000)
    rate, interval = 20.0, 0.01
    times = Arrivals(rate, 1.0, 0).times(len(workload.lengths))
    steady = (len(times) - 1) / times[-1] * 50
    assert window_tok_per_s(cluster, workload, times, interval) == pytest.approx(steady, rel=0.05)
    # a short run whose requests outlast half of it: its window still ramps up
    short = Workload("fixed", ((100, 2000),) * 100)
    short_times = Arrivals(rate, 1.0, 0).times(100)
    assert window_tok_per_s(cluster, short, short_times, interval) < 0.8 * rate * 2000
