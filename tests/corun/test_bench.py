"""`corun bench` on the tiny model (CPU): the report's numbers come from the run, and a time cap truncates."""

import json

from corun.bench import make_workload, percentile, run_bench
from corun.config import CacheConfig, EngineConfig, SchedulerConfig


def config(model: str, max_num_seqs: int = 4) -> EngineConfig:
    return EngineConfig(model=model, num_threads=1, scheduler=SchedulerConfig(
        max_num_seqs=max_num_seqs, max_model_len=160, prefill_chunk_size=32, max_num_batched_tokens=64),
        cache=CacheConfig(num_blocks=64))


def test_bench_reports_every_mode_and_workload(tiny_model_dir, tmp_path):
    workload = make_workload("burstgpt", 6)
    workload = type(workload)("small", tuple((min(i, 60), min(o, 8)) for i, o in workload.lengths))
    out = tmp_path / "bench.json"
    report = run_bench(config(tiny_model_dir), ["corun", "standard"], [workload], str(out))
    assert json.loads(out.read_text())["modes"].keys() == {"corun", "standard"}
    for mode in ("corun", "standard"):
        result = report["modes"][mode]["small"]
        assert result["output_tokens"] == sum(o for _, o in workload.lengths)
        assert result["num_finished"] == 6 and result["truncated"] is False
        assert result["num_decode_steps"] > 0 and result["ttft_s"]["p50"] <= result["seconds"]


def test_time_cap_truncates_and_aborts_the_rest(tiny_model_dir):
    workload = make_workload("1024x128", 3)
    workload = type(workload)("long", ((40, 100),) * 3)
    report = run_bench(config(tiny_model_dir, max_num_seqs=2), ["corun"], [workload], max_seconds=0.3)
    result = report["modes"]["corun"]["long"]
    assert result["truncated"] is True
    assert result["num_finished"] < 3 and 0 < result["output_tokens"] < 300


def test_burstgpt_lengths_are_seeded_and_bounded():
    first, again = make_workload("burstgpt", 50, seed=1), make_workload("burstgpt", 50, seed=1)
    assert first == again and first != make_workload("burstgpt", 50, seed=2)
    assert all(16 <= i <= 6144 and 8 <= o <= 2048 for i, o in first.lengths)
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
