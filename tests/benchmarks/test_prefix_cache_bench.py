"""benchmarks/prefix_cache.py through HTTP: a run cut short (a device call's time limit) keeps the rows it made."""

import json

from benchmarks.prefix_cache import main, speedups, through_http
from planner.workloads import Workload
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

SHARED = Workload("shared", ((150, 2),) * 4, ((0, 128),) * 4)
CONTROL = Workload("2x40x2", ((40, 2),) * 2)


def test_each_workload_s_rows_are_handed_on_as_they_finish_cache_on_then_off(tiny_model_dir):
    config = EngineConfig(model=tiny_model_dir, num_threads=1, cache=CacheConfig(num_blocks=128),
                          scheduler=SchedulerConfig(max_num_seqs=4, max_model_len=512, prefill_chunk_size=64))
    seen = []
    report = through_http(config, [SHARED, CONTROL], max_seconds=None,
                          on_workload=lambda so_far: seen.append({label: sorted(rows)
                                                                  for label, rows in so_far["modes"].items()}))
    # NOTE: the inverse of saving once at the end: the first hand-on holds the first workload only
    assert seen == [{"cache_on": ["shared"]},
                    {"cache_on": ["2x40x2", "shared"]},
                    {"cache_on": ["2x40x2", "shared"], "cache_off": ["shared"]},
                    {"cache_on": ["2x40x2", "shared"], "cache_off": ["2x40x2", "shared"]}]
    assert report["speedup"]["shared"]["hit_rate"] > 0 and report["speedup"]["2x40x2"]["hit_rate"] == 0
    assert all(row["num_finished"] == row["num_requests"] for rows in report["modes"].values() for row in rows.values())


def test_a_workload_without_its_cache_off_row_yet_has_no_ratio():
    row = {"output_tok_per_s": 10.0, "ttft_s": {"p50": 0.5}, "hit_rate": 0.5}
    assert speedups({"cache_on": {"w": row}}) == {"w": {"throughput_x": None, "ttft_p50_x": None, "hit_rate": 0.5}}
    half = {"output_tok_per_s": 5.0, "ttft_s": {"p50": 1.0}, "hit_rate": 0.0}
    assert speedups({"cache_on": {"w": row}, "cache_off": {"w": half}})["w"] == {
        "throughput_x": 2.0, "ttft_p50_x": 0.5, "hit_rate": 0.5}


def test_cache_runs_only_the_settings_named(tiny_model_dir, tmp_path):
    out = tmp_path / "pc.json"
    main(["--model", tiny_model_dir, "--num-threads", "1", "--max-model-len", "1024", "--prefill-chunk-size", "64",
          "--workloads", "multiple_choice", "--num-requests", "4", "--cache", "on", "--out", str(out)])
    report = json.loads(out.read_text())
    assert sorted(report["modes"]) == ["cache_on"]
    assert report["speedup"]["multiple_choice"]["throughput_x"] is None
