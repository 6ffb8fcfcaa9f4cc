"""`python -m benchmarks.router_burst` end to end, briefly: a burst through a real router to fake nodes, every request
answered, the figures there, and its processes gone afterwards."""

import json
import subprocess
import sys

import pytest

from tests.benchmarks.test_router_throughput import REPO, assert_gone, child_pids

pytestmark = pytest.mark.timeout(120)


def test_a_short_burst_is_answered_whole_and_leaves_nothing_running(tiny_model_dir, tmp_path):
    out = tmp_path / "burst.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.router_burst", "--model", tiny_model_dir,
                             "--workload", "multiple_choice", "--num-requests", "16", "--routers", "1",
                             "--client-processes", "1", "--connections", "fresh,warm", "--out", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["command"].startswith("python -m benchmarks.router_burst") and len(report["runs"]) == 2
    assert [run["connections"] for run in report["runs"]] == ["fresh", "warm"]
    for run in report["runs"]:
        assert (run["routers"], run["client_processes"], run["num_requests"]) == (1, 1, 16)
        assert 0 < run["ttft_s"]["p50"] <= run["ttft_s"]["p99"]
        assert 0 < run["server_means"]["ttft_s"] and run["server_means"]["client_ttft_s"] > 0
    assert_gone(child_pids(result.stderr))


def test_an_unknown_connection_kind_is_refused_before_anything_starts(tmp_path):
    result = subprocess.run([sys.executable, "-m", "benchmarks.router_burst", "--connections", "fresh,hot",
                             "--out", str(tmp_path / "burst.json")], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "--connections takes fresh, warm" in result.stderr
    assert not (tmp_path / "burst.json").exists()
