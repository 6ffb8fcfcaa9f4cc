"""`corun profile` measures the KV hand-off (a NIXL READ of the engine's blocks between two processes) and `corun
plan` uses it; where NIXL cannot run, the profile says the hand-off was not measured."""

from __future__ import annotations

import json
import sys

import torch

from cli.main import main
from planner.kv_handoff import measure_kv_handoff
from planner.perf_profile import PerformanceProfile

PROFILE_FLAGS = ["--max-num-seqs", "4", "--max-model-len", "160", "--prefill-chunk-size", "64",
                 "--kv-capacity-tokens", "1024", "--num-threads", "1", "--profile-lengths", "8,32,128",
                 "--profile-contexts", "8,64", "--profile-rows", "1,4"]


def test_profile_records_a_measured_handoff_that_plan_uses(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "tiny-profile.json"
    assert main(["profile", "--model", tiny_model_dir, "--out", str(out), *PROFILE_FLAGS]) == 0
    assert "KV hand-off" in capsys.readouterr().out
    handoff = PerformanceProfile.load(out).kv_handoff
    assert handoff.source.startswith("measured: NIXL READ") and "128 tokens" in handoff.source
    # NOTE: 8 blocks of the tiny model's 64 KiB on one host: microseconds to milliseconds, never free
    assert 0 < float(handoff.seconds(128)) < 0.5
    (tmp_path / "lengths.csv").write_text("100,20\n60,40\n")
    assert main(["plan", "--profile", str(out), "--lengths", str(tmp_path / "lengths.csv"), "--rate", "1",
                 "--ttft-p99-ms", "5000", "--tpot-p99-ms", "1000", "--simulate-requests", "0", "--gpus", "2"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["kv_handoff"] == {"per_request_s": handoff.per_request_s,
                                                      "per_token_s": handoff.per_token_s, "source": handoff.source}


def test_without_nixl_the_handoff_is_zero_and_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "nixl", None)  # NOTE: `import nixl` then raises ImportError
    handoff = measure_kv_handoff((2, 2, 16, 4, 32), torch.float32, "cpu", 16, [16, 64])
    assert (handoff.per_request_s, handoff.per_token_s) == (0.0, 0.0)
    assert handoff.source.startswith("not measured: NIXL is not installed here")
