"""`corun bench` on the tiny model (CPU): the report's numbers come from the run, and a time cap truncates."""

import json

import pytest

from benchmarks.harness import SLOTargets, percentile, run_bench
from cli.main import main
from planner.workloads import PAPER_WORKLOADS, Arrivals, Workload, default_workloads, make_workload
from wire.config import CacheConfig, EngineConfig, SchedulerConfig


def config(model: str, max_num_seqs: int = 4) -> EngineConfig:
    return EngineConfig(model=model, num_threads=1, scheduler=SchedulerConfig(
        max_num_seqs=max_num_seqs, max_model_len=160, prefill_chunk_size=32, max_num_batched_tokens=64),
        cache=CacheConfig(num_blocks=64))


def small_workload(name: str = "small", num_requests: int = 6) -> Workload:
    workload = make_workload("burstgpt", num_requests)
    return Workload(name, tuple((min(i, 60), min(o, 8)) for i, o in workload.lengths))


def test_bench_reports_every_mode_and_workload(tiny_model_dir, tmp_path):
    workload = small_workload()
    out = tmp_path / "bench.json"
    report = run_bench(config(tiny_model_dir), ["fixed_shape", "mixed"], [workload], str(out))
    assert json.loads(out.read_text())["modes"].keys() == {"fixed_shape", "mixed"}
    for mode in ("fixed_shape", "mixed"):
        result = report["modes"][mode]["small"]
        assert result["output_tokens"] == sum(o for _, o in workload.lengths)
        assert result["num_finished"] == 6 and result["truncated"] is False
        assert result["num_decode_steps"] > 0 and result["ttft_s"]["p50"] <= result["seconds"]
        # NOTE: the engine's token gaps (ITL): a request's TPOT is the mean of its gaps, so the largest gap of the
        # run (p99 of these few) is at least the largest TPOT, and no gap exceeds the run
        itl, tpot = result["itl_ms"], result["tpot_ms"]
        assert 0 < itl["p50"] <= itl["p99"] <= 1e3 * result["seconds"] and itl["p99"] >= tpot["p99"] - 1e-3


def test_old_mode_names_run_and_are_reported_by_their_new_names(tiny_model_dir):
    """`corun bench --modes corun:...,standard` (the names before issue 22) runs those modes; the report names
    them as today (wire.config.OLD_NAMES)."""
    report = run_bench(config(tiny_model_dir), ["corun:prefill_token_budget=0", "standard"],
                       [small_workload(num_requests=2)])
    assert report["modes"].keys() == report["prefill_paths"].keys() == {"fixed_shape:prefill_token_budget=0",
                                                                         "mixed"}
    assert report["prefill_paths"]["mixed"].startswith("mixed-batch")


def test_time_cap_truncates_and_aborts_the_rest(tiny_model_dir):
    workload = Workload("long", ((40, 100),) * 3)
    report = run_bench(config(tiny_model_dir, max_num_seqs=2), ["fixed_shape"], [workload], max_seconds=0.3)
    result = report["modes"]["fixed_shape"]["long"]
    assert result["truncated"] is True
    assert result["num_finished"] < 3 and 0 < result["output_tokens"] < 300


def test_burstgpt_lengths_are_seeded_and_bounded():
    first, again = make_workload("burstgpt", 50, seed=1), make_workload("burstgpt", 50, seed=1)
    assert first == again and first != make_workload("burstgpt", 50, seed=2)
    assert all(16 <= i <= 6144 and 8 <= o <= 2048 for i, o in first.lengths)
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0


def test_report_carries_prefill_path_and_per_run_forward_counts(tiny_model_dir, capsys):
    workloads = [small_workload("first", 3), small_workload("again", 3)]
    report = run_bench(config(tiny_model_dir), ["fixed_shape", "mixed"], workloads)
    assert set(report["prefill_paths"]) == {"fixed_shape", "mixed"}
    for mode, path in report["prefill_paths"].items():
        assert isinstance(path, str) and path
        assert all(report["modes"][mode][name]["prefill_path"] == path for name in ("first", "again"))
    fixed_shape = report["modes"]["fixed_shape"]
    # NOTE: the same all-at-t=0 workload twice on one engine: equal counts only if each is the run's delta
    assert fixed_shape["first"]["forward_counts"] == fixed_shape["again"]["forward_counts"]
    assert fixed_shape["first"]["forward_counts"]["num_prefill_forwards"] >= 3
    assert report["modes"]["mixed"]["first"]["forward_counts"]["num_mixed_forwards"] > 0
    progress = capsys.readouterr().err.splitlines()
    results = [line for line in progress if "tok/s" in line]
    assert len(results) == 4 and all("prefill=" in line for line in results)
    assert sum("building the" in line for line in progress) == 2


def test_finite_rate_waits_for_arrivals_and_ttft_counts_from_arrival(tiny_model_dir):
    arrivals = Arrivals(request_rate=4.0, burstiness=50.0)  # NOTE: near-even gaps of ~0.25 s
    last_arrival = arrivals.times(4)[-1]
    assert last_arrival > 0.6
    report = run_bench(config(tiny_model_dir), ["fixed_shape"], [Workload("spaced", ((8, 2),) * 4)], arrivals=arrivals)
    result = report["modes"]["fixed_shape"]["spaced"]
    assert result["num_finished"] == 4 and result["truncated"] is False
    assert result["seconds"] >= last_arrival
    # NOTE: from t=0 the last request's TTFT would be >= its arrival; from its own arrival it is an idle prefill
    assert result["ttft_s"]["p99"] < last_arrival / 4


def test_time_cap_counts_requests_not_yet_arrived_as_unfinished(tiny_model_dir):
    arrivals = Arrivals(request_rate=0.01)  # NOTE: the second request arrives ~100 s in, far past the cap
    assert arrivals.times(3)[1] > 5
    report = run_bench(config(tiny_model_dir), ["fixed_shape"], [Workload("sparse", ((8, 2),) * 3)], max_seconds=0.5,
                       arrivals=arrivals)
    result = report["modes"]["fixed_shape"]["sparse"]
    assert result["truncated"] is True and result["num_requests"] == 3 and result["num_finished"] == 1
    assert result["seconds"] < 30  # slept until the cap, not until the next arrival (~100 s)


def test_goodput_through_the_run(tiny_model_dir):
    workload = small_workload(num_requests=4)
    impossible, generous = SLOTargets(ttft_ms=0.001), SLOTargets(ttft_ms=1e6, tpot_ms=1e6)
    for slo, expect_good in ((impossible, False), (generous, True)):
        report = run_bench(config(tiny_model_dir), ["fixed_shape"], [workload], slo=slo)
        result = report["modes"]["fixed_shape"]["small"]
        assert result["num_finished"] == 4 and result["slo_targets"] == slo.describe() == report["slo_targets"]
        assert result["num_good"] == (4 if expect_good else 0)
        assert result["goodput_req_per_s"] == pytest.approx(result["num_good"] / result["seconds"], rel=0.02)


def test_over_long_workload_is_refused_before_any_model_loads():
    base = config("/nonexistent/model")  # NOTE: loading it would fail differently; the check must come first
    with pytest.raises(ValueError, match=r"workload 'wide'.*max_model_len 160.*100 prompt \+ 61 output = 161"):
        run_bench(base, ["fixed_shape"], [Workload("wide", ((10, 10), (100, 61)))])


def test_default_workloads_fit_the_engine():
    """The newcomer's `corun bench --model models/tiny` (max_model_len 1024) runs: the paper's set needs >= 1152."""
    def names(max_model_len):
        workloads, note = default_workloads(max_model_len)
        return [workload.name for workload in workloads], note

    assert names(1024) == (["768x128"], "1024x128, 1024x2048, 4096x128, 4096x2048, burstgpt left out: longer than "
                                        "max_model_len 1024")
    assert names(2048)[0] == ["1024x128"]
    assert names(8192) == (list(PAPER_WORKLOADS), None)
    assert make_workload("96x8", 3).lengths == ((96, 8),) * 3
    with pytest.raises(ValueError, match="unknown workload 'big'"):
        make_workload("big")


def test_cli_refuses_a_named_too_long_workload_and_bad_goodput(tiny_model_dir, capsys):
    assert main(["bench", "--model", tiny_model_dir, "--workloads", "1024x128"]) == 2
    assert "workload '1024x128'" in capsys.readouterr().err
    assert main(["bench", "--model", tiny_model_dir, "--workloads", "sharegpt", "--goodput", "e2el:100"]) == 2
    assert "--goodput" in capsys.readouterr().err


def test_cli_writes_strict_json_with_arrivals_and_goodput(tiny_model_dir, capsys):
    argv = ["bench", "--model", tiny_model_dir, "--num-threads", "1", "--modes", "fixed_shape", "--workloads", "small",
            "--max-model-len", "160", "--num-requests", "2", "--goodput", "ttft:100000", "tpot:100000"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("cli.bench.make_workload", lambda name, num, seed: small_workload(name, num))
        assert main(argv) == 0
    report = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"non-JSON {name}"))
    assert report["arrivals"]["request_rate"] == "inf" and report["command"]["request_rate"] == "inf"
    assert report["slo_targets"] == {"ttft_ms": 100000.0, "tpot_ms": 100000.0}
    assert report["modes"]["fixed_shape"]["small"]["num_good"] == 2


def test_the_tail_is_reported_by_active_row_count():
    """decode_step.tail: steps of at most N/8 running requests, summed and timed per count of them, so that a tail whose
    total differs while its median does not shows which steps differ."""
    from benchmarks.harness import tail_summary

    steps = [(0.010, [100] * 200), (0.005, [900]), (0.007, [900]), (0.006, [50, 60]), (0.004, [70, 80, 90])]
    tail = tail_summary(steps, max_num_seqs=32)
    assert tail["steps"] == 4 and tail["seconds"] == 0.022 and tail["median_longest_context"] == 495.0
    assert tail["mean_ms"] == 5.5 and tail["max_ms"] == 7.0
    assert tail["by_active_rows"] == {1: {"steps": 2, "seconds": 0.012, "median_ms": 6.0},
                                      2: {"steps": 1, "seconds": 0.006, "median_ms": 6.0},
                                      3: {"steps": 1, "seconds": 0.004, "median_ms": 4.0}}
    assert tail_summary(steps[:1], max_num_seqs=32) == {"steps": 0}
