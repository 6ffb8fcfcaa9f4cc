"""What a served run at one Poisson rate measured, in the planner's terms (benchmarks/planner_validation.py): TTFT p99,
TPOT p99 and output tokens per second, over HTTP (benchmarks/http_bench.py's stream_workload), a run cut at max_seconds.

- TTFT p99 over every request sent: one with no token yet at the cut counts with the time it had waited (a lower
  bound: "censored"), so a run whose queue grows does not look fast by leaving its slowest requests out.
- TPOT p99 over the requests that finished, and those cut with at least MIN_TPOT_TOKENS tokens (a mean over fewer
  gaps of a cut request is one or two inter-token gaps, not the per-request mean the planner predicts).
- Throughput: output tokens streamed in the second half of the arrivals (from half the last arrival's time to it),
  per second: the first half is the ramp (a run starts with nothing decoding) and after the last arrival the load
  falls. Requests longer than the run still ramp up inside the window, so long outputs (BurstGPT-like) read below
  the steady state (rate * mean output): benchmarks/planner_validation.py predicts the tokens of this window
  (window_tok_per_s) rather than the steady state.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import aiohttp

from benchmarks.http_bench import stream_workload
from benchmarks.http_clients import REQUEST_TIMEOUT_S, StreamedRequest
from planner.workloads import Arrivals, Workload

MIN_TPOT_TOKENS = 16
IDLE_TIMEOUT_S = 30.0


def measure_rate(url: str, workload: Workload, vocab_size: int, rate: float, seed: int,
                 max_seconds: float) -> dict:
    """The run at `rate` (Poisson, seeded): the planner's three figures and how the run went."""
    records, elapsed, truncated = asyncio.run(stream(url, workload, vocab_size, Arrivals(rate, 1.0, seed), seed,
                                                     max_seconds))
    return summarize(records, elapsed, truncated, len(workload.lengths), rate)


async def stream(url: str, workload: Workload, vocab_size: int, arrivals: Arrivals, seed: int,
                 max_seconds: float) -> tuple[list[StreamedRequest], float, bool]:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        return await stream_workload(session, url, workload, vocab_size, arrivals, seed, max_seconds, None)


def summarize(records: list[StreamedRequest], elapsed: float, truncated: bool, num_requests: int,
              rate: float) -> dict:
    ok = [r for r in records if r.error is None]
    ttfts = [(r.chunk_at[0] if r.chunk_at else elapsed) - r.arrived_at for r in ok]
    tpots = [(r.chunk_at[-1] - r.chunk_at[0]) / (r.num_tokens - 1) for r in ok
             if r.num_tokens > 1 and (r.finish_reason is not None or r.num_tokens >= MIN_TPOT_TOKENS)]
    window_end = min(max((r.arrived_at for r in records), default=0.0), elapsed)
    window = (window_end / 2, window_end)
    tokens = sum(n for r in ok for at, n in zip(r.chunk_at, r.chunk_tokens, strict=True) if window[0] <= at < window[1])
    last_arrival = max((r.arrived_at for r in records), default=0.0)
    return {"ttft_p99_s": p99(ttfts), "tpot_p99_s": p99(tpots),
            "tok_per_s": tokens / (window[1] - window[0]) if window[1] > window[0] else None,
            "detail": {"requests_planned": num_requests, "requests_sent": len(records),
                       "requests_finished": sum(r.finish_reason is not None for r in ok),
                       "errors": len(records) - len(ok), "first_errors": [r.error for r in records if r.error][:3],
                       "ttft_censored_at_cut": sum(not r.chunk_at for r in ok), "tpot_requests": len(tpots),
                       "seconds": round(elapsed, 3), "cut_at_max_seconds": truncated,
                       "throughput_window_s": [round(w, 3) for w in window],
                       "realized_rate_req_per_s": round((len(records) - 1) / last_arrival, 3)
                       if last_arrival > 0 else None, "nominal_rate_req_per_s": rate}}


def p99(values: list[float]) -> float | None:
    """The 99th percentile, as benchmarks.harness.percentile takes it (the sample at rank floor(0.99 n))."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else None


def wait_idle(url: str, timeout_s: float = IDLE_TIMEOUT_S) -> bool:
    """Until no node of the cluster has a request running or waiting (a cut run's requests are aborted as their
    streams close); False when some still had work at the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/admin/nodes", timeout=10) as response:
            nodes = json.loads(response.read())["nodes"]
        if all(node["stats"].get("num_running", 0) + node["stats"].get("num_waiting", 0) == 0 for node in nodes):
            return True
        time.sleep(0.5)
    return False
