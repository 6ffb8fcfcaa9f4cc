"""`python -m benchmarks.router_throughput` end to end (fake nodes, a real router, client workers), briefly; and its
processes all gone afterwards, also when the run fails or is stopped."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from benchmarks.router_load_client import read_event

pytestmark = pytest.mark.timeout(120)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEP_MS = 20.0
MAX_TOKENS = 12


def benchmark_command(model_dir: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.router_throughput", "--model", model_dir, *args]


def child_pids(stderr: str) -> list[int]:
    """The router's and fake nodes' pids, as the benchmark announces them."""
    return [int(pid) for pid in re.findall(r": pid (\d+)", stderr)]


def assert_gone(pids: list[int], within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while any(os.path.exists(f"/proc/{pid}") for pid in pids):
        assert time.monotonic() < deadline, f"left running: {[p for p in pids if os.path.exists(f'/proc/{p}')]}"
        time.sleep(0.1)


def test_a_short_run_streams_every_token_and_reports_sane_figures(tiny_model_dir, tmp_path):
    out = tmp_path / "result.json"
    result = subprocess.run(benchmark_command(tiny_model_dir, "--streams", "8", "--max-tokens", str(MAX_TOKENS),
                                              "--seconds", "2", "--warmup-seconds", "0.5", "--out", str(out)),
                            cwd=REPO, capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["command"].startswith("python -m benchmarks.router_throughput")
    assert report["host"]["nproc"] >= 1 and report["host"]["cpu_model"]
    assert report["idle"][0]["router_cpu_cores"] < 0.5
    [run] = report["runs"]
    assert run["routers"] == 1 and run["streams"] == 8 and run["step_ms"] == STEP_MS
    assert run["tokens"] > 0 and run["tok_per_s"] > 0 and run["router_cpu_s"] > 0
    assert run["router_cpu_us_per_token"] > 0
    # NOTE: 8 streams are far from loading the router: tokens come at the fake node's pace
    assert run["tok_per_s"] == pytest.approx(run["paced_tok_per_s"], rel=0.5)
    assert STEP_MS / 2 < run["itl_ms"]["p50"] < 3 * STEP_MS and run["itl_ms"]["p50"] <= run["itl_ms"]["p99"]
    assert run["added_itl_p99_ms"] == pytest.approx(run["itl_ms"]["p99"] - STEP_MS)
    assert STEP_MS * 0.9 < run["fake_step_interval_ms"]["p50"] < STEP_MS * 1.5
    assert run["fake_decode"]["steps"] > 0 and run["fake_decode"]["events_dropped"] == 0
    assert run["fake_decode"]["running_after_drain"] == 0
    clients = run["clients"]
    # NOTE: every request that started was checked token by token against benchmarks.fake_output
    assert clients["requests_started"] >= 8 and clients["completed_exact"] == clients["requests_started"]
    assert clients["wrong_outputs"] == clients["errors"] == clients["unfinished"] == 0
    assert clients["tokens_received"] == clients["router_counted_tokens"] == MAX_TOKENS * clients["completed_exact"]
    # NOTE: a router that fell behind (a loaded host) merges a stream's queued tokens into one chunk: never more
    # chunks than tokens, and never a token lost (above)
    assert len(clients["cpu_cores_per_worker"]) == 2 and 0 < run["chunks"] <= run["tokens"]
    assert_gone(child_pids(result.stderr))


def test_two_routers_share_one_port_and_both_stream(tiny_model_dir, tmp_path):
    out = tmp_path / "result.json"
    result = subprocess.run(benchmark_command(tiny_model_dir, "--routers", "2", "--streams", "16", "--max-tokens",
                                              str(MAX_TOKENS), "--seconds", "2", "--warmup-seconds", "0.5",
                                              "--out", str(out)),
                            cwd=REPO, capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    [run] = json.loads(out.read_text())["runs"]
    clients = run["clients"]
    assert run["routers"] == 2 and clients["wrong_outputs"] == clients["errors"] == clients["unfinished"] == 0
    assert clients["tokens_received"] == clients["router_counted_tokens"]
    per_router = clients["router_counted_tokens_per_router"]
    assert len(per_router) == 2 and all(tokens > 0 for tokens in per_router), per_router
    assert_gone(child_pids(result.stderr))


def test_a_router_that_cannot_start_fails_the_run_and_leaves_nothing_behind(tiny_model_dir, tmp_path):
    broken = tmp_path / "config-only"
    broken.mkdir()
    shutil.copy(os.path.join(tiny_model_dir, "config.json"), broken)  # NOTE: a vocab size, but no tokenizer
    result = subprocess.run(benchmark_command(str(broken), "--streams", "2"), cwd=REPO, capture_output=True,
                            text=True, timeout=90)
    assert result.returncode == 1 and "the router exited" in result.stderr
    assert len(child_pids(result.stderr)) == 3  # NOTE: both fake nodes and the router had started
    assert_gone(child_pids(result.stderr))


def test_sigterm_mid_run_stops_every_process(tiny_model_dir):
    process = subprocess.Popen(benchmark_command(tiny_model_dir, "--streams", "16", "--seconds", "30"), cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = ""
    try:
        while "router 0: pid" not in stderr:
            line = process.stderr.readline()
            assert line, f"the benchmark ended early: {stderr}"
            stderr += line
        children = wait_for_client_workers(process.pid)
        process.send_signal(signal.SIGTERM)
        exit_code = process.wait(timeout=30)
        stderr += process.stderr.read()
        assert exit_code == 128 + signal.SIGTERM, stderr
    finally:
        process.kill()
        process.wait()
    assert_gone(child_pids(stderr) + children)


def test_a_sigterm_while_the_client_workers_start_unwinds_as_the_sigterm(monkeypatch):
    """SIGTERM (the benchmark's handler: SystemExit) while the second of two client workers starts: the run unwinds
    with that exit, having stopped only the worker that started (joining the other raised multiprocessing's
    AssertionError, which ended the benchmark with 1: test_sigterm_mid_run_stops_every_process on a loaded host)."""
    import benchmarks.router_throughput as router_throughput

    class Worker:
        started: list = []

        def __init__(self, **kwargs):
            self.pid = None
            self.killed = False

        def start(self):
            if Worker.started:
                raise SystemExit(128 + signal.SIGTERM)
            Worker.started.append(self)
            self.pid = os.getpid()

        def is_alive(self):
            return not self.killed

        def kill(self):
            self.killed = True

        def join(self, timeout=None):
            if self.pid is None:
                raise AssertionError("can only join a started process")  # NOTE: multiprocessing's own check

    context = type("Context", (), {"Queue": staticmethod(lambda: None), "Process": Worker})
    monkeypatch.setattr(router_throughput.multiprocessing, "get_context", lambda method: context)
    monkeypatch.setattr(router_throughput, "generated_tokens", lambda router: 0)
    args = router_throughput.parse_args(["--workers", "2"])
    router = router_throughput.RouterProcess(None, "http://127.0.0.1:1", "http://127.0.0.1:1")
    with pytest.raises(SystemExit) as exit_info:
        router_throughput.measure_run([router], None, None, 2, args)
    assert exit_info.value.code == 128 + signal.SIGTERM
    assert [worker.killed for worker in Worker.started] == [True]


def wait_for_client_workers(pid: int, timeout_s: float = 30.0) -> list[int]:
    """pid's children once its client worker processes (multiprocessing spawns) run."""
    deadline = time.monotonic() + timeout_s
    while True:
        children = [int(child) for child in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                           text=True).stdout.split()]
        if any("spawn_main" in read_cmdline(child) for child in children):
            return children
        assert time.monotonic() < deadline, "the client workers never started"
        time.sleep(0.2)


def read_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize("event, expected", [
    (b'data: {"id":"c","choices":[{"index":0,"logprobs":null,"finish_reason":null,"stop_reason":null,'
     b'"token_ids":[645],"seed":1,"text":" x"}],"usage":null}', ([645], None, None)),
    (b'data: {"id":"c","choices":[{"index":0,"logprobs":null,"finish_reason":"length","stop_reason":null,'
     b'"token_ids":[1,2],"seed":1,"text":"ab"}],"usage":null}', ([1, 2], "length", None)),
    (b'data: {"id": "c", "choices": [{"index": 0, "logprobs": null, "finish_reason": null, "stop_reason": null, '
     b'"token_ids": [645], "seed": 1, "text": " x"}], "usage": null}', ([645], None, None)),
    (b'data: {"id": "c", "choices": [{"index": 0, "logprobs": null, "finish_reason": "length", "stop_reason": null, '
     b'"token_ids": [1, 2], "seed": 1, "text": "ab"}], "usage": null}', ([1, 2], "length", None)),
    (b'data: {"choices": [{"token_ids": [7], "finish_reason": "stop"}]}', ([7], "stop", None)),
    (b"data: [DONE]", ([], None, None)),
])
def test_sse_events_are_read_without_json_where_the_router_s_layout_allows(event, expected, monkeypatch):
    import benchmarks.router_load_client as client

    if b'"token_ids"' in event and b'"finish_reason"' in event:
        # NOTE: the router's compact JSON included: json.loads per chunk would make the client what is measured
        monkeypatch.setattr(client, "read_event_as_json", lambda event, logprobs=None: pytest.fail("json.loads"))
    assert read_event(event) == expected


def test_a_run_with_logprobs_checks_each_token_s_logprob(tiny_model_dir, tmp_path):
    from benchmarks.router_load_client import read_event_with_logprobs

    chunk = (b'data: {"choices":[{"index":0,"logprobs":{"tokens":["a"],"token_logprobs":[-0.625],'
             b'"top_logprobs":[{"a":-0.625}],"text_offset":[0]},"finish_reason":null,"token_ids":[7],"text":"a"}]}')
    logprobs = []
    assert read_event_with_logprobs(chunk, logprobs) == ([7], None, None) and logprobs == [-0.625]
    out = tmp_path / "result.json"
    result = subprocess.run(benchmark_command(tiny_model_dir, "--streams", "4", "--max-tokens", str(MAX_TOKENS),
                                              "--logprobs", "2", "--seconds", "1", "--warmup-seconds", "0.5",
                                              "--out", str(out)),
                            cwd=REPO, capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    [run] = json.loads(out.read_text())["runs"]
    clients = run["clients"]
    assert run["logprobs"] == 2 and clients["requests_started"] >= 4
    # NOTE: each request checked its ids and every token's logprob against benchmarks.fake_output
    assert clients["completed_exact"] == clients["requests_started"] and clients["wrong_outputs"] == 0
    assert_gone(child_pids(result.stderr))


def test_an_error_event_is_an_error():
    ids, finish, error = read_event(b'data: {"error": {"message": "node lost", "code": 503}}')
    assert ids == [] and finish is None and "node lost" in error


def test_the_sse_write_floor_counts_every_write_and_its_cpu():
    """benchmarks/sse_write_floor.py: the writes it made at the pace asked for, and a CPU cost per write."""
    import asyncio

    from benchmarks.sse_write_floor import measure, parse_args

    report = asyncio.run(measure(parse_args(["--streams", "4", "--step-ms", "10", "--seconds", "0.3"])))
    assert 4 * 10 <= report["writes"] <= 4 * 31
    assert report["writer_cpu_us_per_write"] > 0
