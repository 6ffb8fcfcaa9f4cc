"""benchmarks/burst_trickle.py: a multiple-choice burst added at once and trickling in, on the modelled GPU clock;
the file holds each run, its prefill steps, and the cache-on/off ratios, with the command that made it."""

import json

from benchmarks.burst_trickle import GpuClock, main


def test_the_modelled_clock_counts_rows_of_a_forward_and_flat_decode_steps():
    clock = GpuClock(forward_fixed_ms=2.0, forward_ms_per_row=0.01, decode_step_ms=5.0)
    assert clock.step_ms(1000, 24) == 2.0 + 0.01 * 1024
    assert clock.step_ms(0, 24) == 5.0
    assert clock.step_ms(0, 0) == 0.0


def test_a_trickled_burst_s_first_tokens_wait_for_its_arrivals(tiny_model_dir, tmp_path):
    """Every request gets its first token; a forward holds at most the pack's rows; a trickled run's steps see its
    requests arrive one by one. Its TTFT counts from the burst's start, so with an intake slower than the work
    (10 ms a request) the median waits for the median arrival: the comparison can tell the arrivals apart."""
    out = tmp_path / "trickle.json"
    main(["--model", tiny_model_dir, "--workloads", "multiple_choice", "--num-requests", "24", "--pack-tokens", "1024",
          "--intake-ms", "10", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["command"].startswith("python -m benchmarks.burst_trickle --model")
    runs = {(run["cache"], run["arrival"]): run for run in report["runs"]}
    assert sorted(runs) == [("off", "at_once"), ("off", "trickle"), ("on", "at_once"), ("on", "trickle")]
    for run in runs.values():
        steps = run["prefill_steps"]
        assert steps[-1]["first_tokens"] == 24 and all(step["rows"] <= 1024 for step in steps)
        assert [step["end_s"] for step in steps] == sorted(step["end_s"] for step in steps)
    trickled = runs["on", "trickle"]
    assert trickled["prefill_steps"][0]["arrived"] < 24
    assert trickled["ttft_s_p50"] >= 0.010 * 12 > runs["on", "at_once"]["ttft_s_p50"]
    assert set(report["cache_on_over_off"]) == {"multiple_choice at_once", "multiple_choice trickle_10.0ms"}


def test_the_ramp_what_if_caps_the_first_forwards_and_doubles_the_cap_each():
    from benchmarks.burst_trickle import ramp_up

    asked = []

    class Scheduler:
        def prefill_chunks(self, max_rows=None):
            asked.append(max_rows)
            return ["chunk"] if max_rows != 3000 else []

    scheduler = Scheduler()
    ramp_up(scheduler, 1024)
    for budget in (None, None, 3000, None, None):
        scheduler.prefill_chunks(budget)
    assert asked == [1024, 2048, 3000, 4096, 8192]  # NOTE: a forward that ran nothing does not double the cap
