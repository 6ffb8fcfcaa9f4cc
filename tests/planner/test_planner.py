"""The capacity planner: profile fits, the analytic plan, its simulation check, profiling a real engine, the CLI."""

import json
import math
import random

import numpy as np
import pytest

from cli.main import main
from corun.engine import LLMEngine
from corun.request import RequestStatus
from planner.perf_profile import (
    DecodePoint,
    DecodeStepModel,
    PerformanceModel,
    PerformanceProfile,
    PrefillModel,
    PrefillPoint,
)
from planner.plan import SLO, DecodeConfig, Workload, named_workload, plan, read_lengths, split_too_long
from planner.plan_sim import ClusterSim, SimRequest, check_plan, simulate
from planner.profiling import EngineMeasurer, profile_engine
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

# NOTE: close to the H200 fit of benchmarks/results/h200_planner_profile.json (Qwen3-8B, bf16, N = 256)
H200_LIKE = PerformanceModel(PrefillModel(a=0.009, b=24e-6, c=2e-10, chunk_size=4096),
                             DecodeStepModel(a=0.0121, b=2.9e-8, max_num_seqs=256), 0.0, 0.0)
H200_DECODE = DecodeConfig(max_num_seqs=256, kv_capacity_tokens=796416, max_model_len=6144)
SIM_REQUESTS = 8000


def burstgpt(rate: float) -> Workload:
    return split_too_long(named_workload("burstgpt", rate, num_samples=1000), H200_DECODE)[0]


def synthetic_profile(model: PerformanceModel) -> PerformanceProfile:
    lengths = [64, 512, 2048, 4096, 6000]
    prefill = tuple(PrefillPoint(n, float(model.prefill.seconds(n))) for n in lengths)
    decode = tuple(DecodePoint(rows, rows * ctx, float(model.decode.seconds(rows * ctx)))
                   for rows in (1, 128, 256) for ctx in (128, 1024, 3000))
    return PerformanceProfile(max_num_seqs=256, prefill_chunk_size=model.prefill.chunk_size, prefill_points=prefill,
                              decode_points=decode, kv_capacity_tokens=796416, max_model_len=6144, source="test")


def test_fits_recover_a_known_profile_and_chunked_prefill_telescopes():
    fitted = PerformanceModel.fit(synthetic_profile(H200_LIKE))
    for name in ("a", "b", "c"):
        assert getattr(fitted.prefill, name) == pytest.approx(getattr(H200_LIKE.prefill, name), rel=1e-6)
    assert (fitted.decode.a, fitted.decode.b) == pytest.approx((H200_LIKE.decode.a, H200_LIKE.decode.b), rel=1e-6)
    assert fitted.prefill_max_rel_error < 1e-9 and fitted.decode_max_rel_error < 1e-9
    # a 6000-token prompt in chunks of 4096: the sum of chunk costs a + b*n + c*n*(n + 2*prefix)
    p = H200_LIKE.prefill
    chunks = [(4096, 0), (1904, 4096)]
    assert float(p.seconds(6000)) == pytest.approx(sum(p.a + p.b * n + p.c * n * (n + 2 * pre) for n, pre in chunks))


def test_fit_keeps_coefficients_non_negative_and_linear_with_two_lengths():
    points = (PrefillPoint(1024, 0.0335), PrefillPoint(1024, 0.0343), PrefillPoint(4096, 0.1077))
    decode = (DecodePoint(256, 200_000, 0.018), DecodePoint(256, 400_000, 0.0175))  # noisy: a falling step
    fitted = PerformanceModel.fit(PerformanceProfile(256, 4096, points, decode))
    assert fitted.prefill.c == 0 and fitted.prefill.a > 0 and fitted.prefill.b > 0
    assert fitted.decode.b == 0 and fitted.decode.a > 0
    with pytest.raises(ValueError, match="two or more"):
        PerformanceModel.fit(PerformanceProfile(256, 4096, points[:2], decode))


def test_profile_round_trips_through_json(tmp_path):
    profile = synthetic_profile(H200_LIKE)
    profile.save(tmp_path / "profile.json")
    assert PerformanceProfile.load(tmp_path / "profile.json") == profile
    (tmp_path / "bad.json").write_text(json.dumps({"max_num_seqs": 4}))
    with pytest.raises(ValueError, match="not a performance profile"):
        PerformanceProfile.load(tmp_path / "bad.json")


def test_higher_rate_never_needs_fewer_instances():
    slo = SLO(ttft_p99_s=0.5, tpot_p99_s=0.025)
    plans = [plan(H200_LIKE, burstgpt(rate), slo, H200_DECODE) for rate in (5, 20, 50, 100, 200)]
    assert all(p.feasible for p in plans)
    for smaller, larger in zip(plans, plans[1:]):
        assert larger.num_prefill >= smaller.num_prefill and larger.num_decode >= smaller.num_decode
    assert plans[-1].num_prefill > plans[0].num_prefill and plans[-1].num_decode > plans[0].num_decode


def test_tighter_ttft_needs_more_prefill():
    workload = burstgpt(100)
    plans = [plan(H200_LIKE, workload, SLO(ttft, 0.03), H200_DECODE) for ttft in (2.0, 0.3, 0.15, 0.12)]
    prefill = [p.num_prefill for p in plans]
    assert prefill == sorted(prefill) and prefill[-1] > prefill[0]
    assert plans[0].prefill_limited_by == "prefill_throughput" and plans[-1].prefill_limited_by == "ttft"


def test_tpot_under_the_fixed_step_is_infeasible_and_a_tight_one_binds_decode():
    workload = burstgpt(50)
    impossible = plan(H200_LIKE, workload, SLO(1.0, 0.012), H200_DECODE)
    assert not impossible.feasible and impossible.num_decode is None and impossible.ratio is None
    assert impossible.decode_limited_by == "tpot" and "no number of decode instances" in impossible.reason
    loose, tight = (plan(H200_LIKE, workload, SLO(1.0, tpot), H200_DECODE) for tpot in (0.03, 0.0145))
    assert tight.decode_limited_by == "tpot" and tight.num_decode > loose.num_decode
    assert tight.prediction.tpot_p99_s <= 0.0145 < loose.prediction.tpot_p99_s


def test_kv_capacity_limits_long_sequences():
    workload = Workload(2.0, ((4096, 2048),))
    kv_bound = plan(H200_LIKE, workload, SLO(2.0, 0.04), H200_DECODE)
    assert kv_bound.decode_limited_by == "kv_capacity"
    assert kv_bound.prediction.usable_slots_per_decode == 129  # 796416 // 6144: half of N = 256
    assert kv_bound.prediction.decode_kv_utilization > kv_bound.prediction.decode_slot_utilization
    double_kv = DecodeConfig(256, 2 * 796416, 6144)
    assert plan(H200_LIKE, workload, SLO(2.0, 0.04), double_kv).num_decode < kv_bound.num_decode


def test_a_swap_space_lets_an_instance_hold_what_its_tokens_need():
    """With a swap space, admission counts whole sequences against KV + swap, and the KV holds what the tokens need:
    4096 + 2048 tokens hold 5,120 on average over their steps, so 155 rows fit where 129 whole sequences did, one
    decode instance serves what took two, and the simulation agrees. A swap space too small to admit another
    sequence changes nothing."""
    workload, slo = Workload(2.0, ((4096, 2048),)), SLO(2.0, 0.04)
    swapping = DecodeConfig(256, 796416, 6144, swap_tokens=796416)
    result = plan(H200_LIKE, workload, slo, swapping)
    assert result.prediction.usable_slots_per_decode == 796416 // 5120
    assert result.num_decode < plan(H200_LIKE, workload, slo, H200_DECODE).num_decode
    runs = check_plan(result, H200_LIKE, workload, slo, swapping, num_requests=4000)
    assert runs["agrees"] and runs["plan"]["meets_slo"]
    assert runs["plan"]["decode_kv_utilization"] == pytest.approx(result.prediction.decode_kv_utilization, rel=0.1)
    tiny_swap = DecodeConfig(256, 796416, 6144, swap_tokens=16)
    assert plan(H200_LIKE, workload, slo, tiny_swap).prediction.usable_slots_per_decode == 129


def test_the_simulation_pauses_the_newest_request_while_the_kv_is_outgrown():
    """Two 32 + 33-token requests on a KV of 112 tokens and as much swap space: both are admitted (80 + 80 <= 224)
    and run together until their blocks outgrow the KV; then the newer one waits while the older one runs on. Both
    finish; the newer one's TPOT is the longer. Inverse: with KV for both, their TPOTs are the same."""
    def run(kv_tokens: int) -> list[SimRequest]:
        decode = DecodeConfig(max_num_seqs=4, kv_capacity_tokens=kv_tokens, max_model_len=128, swap_tokens=112)
        sim = ClusterSim(H200_LIKE, decode, num_prefill=2, num_decode=1)
        requests = [SimRequest(0.0, 32, 33, 0.01, 80), SimRequest(0.0, 32, 33, 0.01, 80)]
        sim.run(requests)
        return requests

    def tpots(requests: list[SimRequest]) -> list[float]:
        assert all(r.last_token is not None for r in requests)
        return [(r.last_token - r.first_token) / (r.num_output - 1) for r in requests]

    older, newer = tpots(run(112))
    assert newer > 1.2 * older
    older, newer = tpots(run(160))
    assert newer == pytest.approx(older, rel=0.01)


def test_workload_samples_longer_than_the_model_are_rejected_or_split_off():
    decode = DecodeConfig(256, 796416, max_model_len=2048)
    workload = Workload(1.0, ((1000, 100), (2000, 100)))
    with pytest.raises(ValueError, match="1 workload samples exceed max_model_len 2048"):
        plan(H200_LIKE, workload, SLO(1.0, 0.03), decode)
    kept, num_rejected = split_too_long(workload, decode)
    assert kept.lengths == ((1000, 100),) and num_rejected == 1


@pytest.mark.parametrize("workload, slo, expected", [
    (burstgpt(100), SLO(0.25, 0.03), ("ttft", "decode_slots")),
    (burstgpt(50), SLO(1.0, 0.0145), ("prefill_throughput", "tpot")),
    (Workload(2.0, ((4096, 2048),)), SLO(2.0, 0.04), ("one_instance", "kv_capacity")),
], ids=["ttft-and-slots", "prefill-throughput-and-tpot", "kv-capacity"])
def test_simulation_agrees_with_the_plan(workload, slo, expected):
    result = plan(H200_LIKE, workload, slo, H200_DECODE)
    assert (result.prefill_limited_by, result.decode_limited_by) == expected
    runs = check_plan(result, H200_LIKE, workload, slo, H200_DECODE, num_requests=SIM_REQUESTS)
    assert runs["agrees"] and runs["plan"]["meets_slo"]
    for name in ("one_fewer_prefill", "one_fewer_decode"):
        assert name not in runs or not runs[name]["meets_slo"]
    # the simulated cluster behaves as predicted at the plan
    assert runs["plan"]["ttft_p99_s"] == pytest.approx(result.prediction.ttft_p99_s, rel=0.3)
    assert runs["plan"]["tpot_p99_s"] == pytest.approx(result.prediction.tpot_p99_s, rel=0.05)
    for name in ("prefill_utilization", "decode_slot_utilization", "decode_kv_utilization"):
        assert runs["plan"][name] == pytest.approx(getattr(result.prediction, name), rel=0.1)


def test_simulation_is_deterministic_per_seed():
    workload = burstgpt(30)
    first, again = (simulate(H200_LIKE, workload, H200_DECODE, 1, 1, num_requests=2000, seed=3) for _ in range(2))
    assert first == again
    assert simulate(H200_LIKE, workload, H200_DECODE, 1, 1, num_requests=2000, seed=4) != first


def test_profile_engine_on_the_tiny_model(tiny_model_dir, tmp_path):
    config = EngineConfig(model=tiny_model_dir, num_threads=1, cache=CacheConfig(num_blocks=64),
                          scheduler=SchedulerConfig(max_num_seqs=4, max_model_len=160, prefill_chunk_size=64))
    profile = profile_engine(config, prefill_lengths=[8, 32, 128], decode_contexts=[8, 96], decode_rows=[1, 4],
                             num_decode_steps=3, repeats=2)
    assert [p.prompt_len for p in profile.prefill_points] == [8, 32, 128]
    assert all(p.seconds > 0 for p in profile.prefill_points + profile.decode_points)
    assert profile.prefill_points[-1].seconds > profile.prefill_points[0].seconds  # 2 chunks vs 8 tokens
    assert sorted(p.num_rows for p in profile.decode_points) == [1, 1, 4, 4]
    assert max(p.sum_context for p in profile.decode_points) >= 4 * 96
    assert (profile.max_num_seqs, profile.kv_capacity_tokens) == (4, 63 * 16)
    assert profile.swap_capacity_tokens == 0  # NOTE: no swap space on CPU (its KV cache is host memory)
    model = PerformanceModel.fit(profile)
    prefill_s, step_s = model.prefill.seconds([8, 64, 128, 159]), model.decode.seconds([0, 100, 600])
    # NOTE: within one chunk the fit may find no per-token cost on a loaded host (8 and 64 tokens equal); more
    # chunks always cost more
    assert (prefill_s > 0).all() and (np.diff(prefill_s) >= 0).all() and (np.diff(step_s) >= 0).all()
    assert prefill_s[2] > prefill_s[1]
    profile.save(tmp_path / "tiny.json")
    assert PerformanceProfile.load(tmp_path / "tiny.json") == profile


def plan_argv(profile_path, *extra) -> list[str]:
    return ["plan", "--profile", str(profile_path), "--workload", "burstgpt", "--rate", "20", "--ttft-p99-ms", "1000",
            "--tpot-p99-ms", "30", "--num-samples", "500", "--simulate-requests", "2000", *extra]


def test_cli_prints_the_plan_as_json(tmp_path, capsys):
    synthetic_profile(H200_LIKE).save(tmp_path / "profile.json")
    assert main(plan_argv(tmp_path / "profile.json")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["plan"]["feasible"] and report["plan"]["ratio"] == "1:1"
    assert report["decode_config"] == {"max_num_seqs": 256, "kv_capacity_tokens": 796416, "max_model_len": 6144,
                                       "block_size": 16, "swap_tokens": 0}
    assert report["workload"]["num_samples"] + report["workload"]["rejected_samples"] == 500
    assert report["simulation"]["plan"]["meets_slo"] and report["slo"] == {"ttft_p99_s": 1.0, "tpot_p99_s": 0.03}


def test_cli_profiles_a_model_on_the_fly(tiny_model_dir, tmp_path, capsys):
    (tmp_path / "lengths.csv").write_text("100,20\n60,40\n")
    argv = ["plan", "--model", tiny_model_dir, "--max-num-seqs", "4", "--max-model-len", "160",
            "--prefill-chunk-size", "64", "--kv-capacity-tokens", "1024", "--num-threads", "1",
            "--profile-lengths", "8,32,128", "--profile-contexts", "8,64", "--profile-rows", "1,4",
            "--profile-out", str(tmp_path / "tiny.json"), "--lengths", str(tmp_path / "lengths.csv"), "--rate", "5",
            "--ttft-p99-ms", "1000", "--tpot-p99-ms", "100", "--simulate-requests", "1000"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["plan"]["feasible"] and report["decode_config"]["kv_capacity_tokens"] == 1024
    assert report["profile_source"].startswith("profile_engine:")
    assert PerformanceProfile.load(tmp_path / "tiny.json").max_num_seqs == 4


def test_corun_profile_writes_what_plan_reads(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "tiny-profile.json"
    assert main(["profile", "--model", tiny_model_dir, "--out", str(out), "--max-num-seqs", "4",
                 "--max-model-len", "160", "--prefill-chunk-size", "64", "--kv-capacity-tokens", "1024",
                 "--num-threads", "1", "--profile-lengths", "8,32,128", "--profile-contexts", "8,64",
                 "--profile-rows", "1,4"]) == 0
    assert "3 prefill points" in capsys.readouterr().out
    profile = PerformanceProfile.load(out)
    assert profile.max_num_seqs == 4 and profile.kv_capacity_tokens == 1024
    (tmp_path / "lengths.csv").write_text("100,20\n60,40\n")
    assert main(["plan", "--profile", str(out), "--lengths", str(tmp_path / "lengths.csv"), "--rate", "1",
                 "--ttft-p99-ms", "5000", "--tpot-p99-ms", "1000", "--simulate-requests", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["ratio"] == "1:1"


def test_cli_reads_lengths_files(tmp_path, capsys):
    synthetic_profile(H200_LIKE).save(tmp_path / "profile.json")
    (tmp_path / "lengths.csv").write_text("input,output\n1024,128\n2048,256\n")
    (tmp_path / "lengths.json").write_text(json.dumps([[1024, 128], {"input": 2048, "output": 256}]))
    assert read_lengths(tmp_path / "lengths.csv") == read_lengths(tmp_path / "lengths.json") == ((1024, 128),
                                                                                                 (2048, 256))
    argv = plan_argv(tmp_path / "profile.json", "--simulate-requests", "0")
    argv[argv.index("--workload"):argv.index("--workload") + 2] = ["--lengths", str(tmp_path / "lengths.csv")]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["workload"]["input_mean"] == 1536


@pytest.mark.parametrize("change, message", [
    (("--rate", "-3"), "rate must be a positive number"),
    (("--workload", "nosuch"), "unknown workload 'nosuch'"),
    (("--max-num-seqs", "128"), "measured at N = 256"),
    (("--tpot-p99-ms", "0"), "must be at least 1 ms"),
    (("--swap-kv-tokens", "-1"), "swap_tokens must be >= 0"),
])
def test_cli_bad_input_is_a_clear_error(tmp_path, capsys, change, message):
    synthetic_profile(H200_LIKE).save(tmp_path / "profile.json")
    argv = plan_argv(tmp_path / "profile.json")
    if change[0] in argv:
        argv[argv.index(change[0]) + 1] = change[1]
    else:
        argv += list(change)
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("corun plan: error:") and message in error and "Traceback" not in error


def test_cli_reports_an_infeasible_plan(tmp_path, capsys):
    synthetic_profile(H200_LIKE).save(tmp_path / "profile.json")
    argv = plan_argv(tmp_path / "profile.json")
    argv[argv.index("--tpot-p99-ms") + 1] = "5"
    assert main(argv) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["plan"]["feasible"] and report["plan"]["decode_limited_by"] == "tpot"
    assert "simulation" not in report


def test_h200_profile_derived_from_the_bench_results():
    from benchmarks.derive_h200_profile import derive_profile

    profile = derive_profile()
    model = PerformanceModel.fit(profile)
    assert (profile.max_num_seqs, profile.kv_capacity_tokens, profile.max_model_len) == (256, 796416, 6144)
    # 1024x128 ran at 256 rows of mean context 1024 + 64: the floor inversion gives it back
    assert profile.decode_points[0].sum_context == 256 * 1088
    assert model.decode_max_rel_error < 0.05 and model.prefill_max_rel_error < 0.05
    assert 0.010 < model.decode.a < 0.015 and math.isclose(float(model.prefill.seconds(4096)), 0.1077, rel_tol=0.02)


def test_a_decode_point_times_every_row_it_names(tiny_model_dir):
    """With a prefill token budget the engine decodes the rows prefilled first while it prefills the rest: a decode
    point's rows must all still be decoding when its steps are timed (they once ended during the fill, and the
    H200 profile timed 256-row steps that held a few rows: 8.4 ms against 19 ms served)."""
    config = EngineConfig(model=tiny_model_dir, num_threads=1, cache=CacheConfig(num_blocks=128),
                          scheduler=SchedulerConfig(max_num_seqs=8, max_model_len=256, prefill_chunk_size=32,
                                                    prefill_token_budget=32))
    engine = LLMEngine(config)
    measure = EngineMeasurer(engine, random.Random(0))
    running_at_abort = []
    abort = engine.abort_request

    def recording_abort(request):
        running_at_abort.append(request.status == RequestStatus.RUNNING)
        abort(request)

    engine.abort_request = recording_abort
    point = measure.decode_step(8, 64, 3)
    assert running_at_abort == [True] * 8
    assert point.num_rows == 8 and point.sum_context >= 8 * (64 + 3)
    assert not engine.has_unfinished()
