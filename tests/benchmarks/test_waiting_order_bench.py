"""benchmarks/waiting_order.py: a shuffled multiple-choice burst, its requests started cached-first and in arrival
order, grouped and shuffled; the file holds each run with the command that made it, and the order's own cost."""

import json

from benchmarks.waiting_order import main


def test_a_shuffled_burst_s_median_first_token_comes_no_later_with_the_cached_first(tiny_model_dir, tmp_path):
    out = tmp_path / "order.json"
    main(["--model", tiny_model_dir, "--workloads", "multiple_choice", "--num-requests", "48", "--pack-tokens", "1024",
          "--order-cost", "64", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["command"].startswith("python -m benchmarks.waiting_order --model")
    runs = {(run["order"], run["start"]): run["first_token_step_p50"] for run in report["runs"]}
    assert sorted(runs) == [("grouped", "arrival"), ("grouped", "cached_first"), ("shuffled", "arrival"),
                            ("shuffled", "cached_first")]
    assert runs["shuffled", "cached_first"] < runs["shuffled", "arrival"]
    assert runs["grouped", "cached_first"] == runs["grouped", "arrival"]
    cost = report["order_cost"]
    assert cost["num_waiting"] == 64 and cost["prompt_tokens"] == 1000
    assert all(cost[key] > 0 for key in ("order_first_sight_ms", "order_again_ms", "whole_chains_ms"))
