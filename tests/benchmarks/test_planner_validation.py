"""The planner's validation benchmark, as a CPU smoke run (qwen3-tiny, one rate, short runs): the profile measured
with its KV hand-off, both deployments served, and the JSON the H200 run commits (rows of predicted vs measured)."""

from __future__ import annotations

import json

import pytest

from benchmarks.planner_validation import main

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
