"""`corun bench --url`: the bench's workloads and arrivals against a running router, over streaming HTTP.

As `vllm bench serve` measures a server: each request is a streaming /v1/completions call with token-id prompts
(the engine bench's prompts, so both see the same requests), sent at its arrival time. TTFT is from the request's
arrival to its first streamed token; ITL the gaps between streamed chunks; TPOT a request's mean gap between its
later tokens. The result has the engine bench's schema (plus itl_ms), so colocated and served runs sit side by
side in one report. Like the engine bench, each workload's clock starts after a warm-up of a few requests.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time

import aiohttp

from benchmarks.harness import RequestOutcome, SLOTargets, outcome_summary, percentile, warm_up_prompts
from benchmarks.http_clients import (
    ClientProcesses,
    StreamedRequest,
    auto_client_processes,
    open_connections,
    open_session,
    stream_bodies,
)
from planner.workloads import Arrivals, Workload, make_prompts


async def served_model_name(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(f"{url}/v1/models") as response:
        response.raise_for_status()
        return (await response.json())["data"][0]["id"]


async def run_http_workload_async(url: str, workload: Workload, vocab_size: int, arrivals: Arrivals,
                                  slo: SLOTargets, seed: int, max_seconds: float | None,
                                  max_concurrency: int | None, api_key: str | None = None,
                                  client_processes: int = 1, warm_connections: bool = False,
                                  warm_up: bool = True) -> dict:
    async with open_session(api_key) as session:
        bodies, times = await workload_requests(session, url, workload, vocab_size, arrivals, seed)
        if warm_up:
            await send_warm_up(session, url, bodies[0]["model"], workload, vocab_size, seed)
        if client_processes > 1:
            # NOTE: the processes start (seconds of imports) before the window the server's counters are read over
            clients = await asyncio.to_thread(ClientProcesses, url, bodies, times, max_seconds, max_concurrency,
                                              client_processes, api_key, warm_connections)
            try:
                metrics_before = await scrape(session, url)
                records, elapsed, truncated = await asyncio.to_thread(clients.run)
                started_at = clients.started_at
            finally:
                clients.close()
        else:
            if warm_connections:
                await open_connections(session, url, min(len(bodies), max_concurrency or len(bodies)))
            metrics_before = await scrape(session, url)
            started_at = time.monotonic()
            records, elapsed, truncated = await stream_bodies(session, url, bodies, times, max_seconds,
                                                              max_concurrency, start=started_at)
        metrics_after = await scrape(session, url)
    result = summarize_http(records, len(workload.lengths), elapsed, arrivals, slo, truncated)
    cpu = router_cpu(router_cpu_seconds(metrics_before), router_cpu_seconds(metrics_after),
                     sum(r.num_tokens for r in records), sum(len(r.chunk_at) for r in records))
    return (result | cpu | prefix_cache_hit_rate(metrics_before, metrics_after)
            | node_loop(metrics_before, metrics_after) | server_means(metrics_before, metrics_after, records)
            | {"client_processes": client_processes, "warm_connections": warm_connections,
               "started_at_monotonic": round(started_at, 4)})


async def stream_workload(session: aiohttp.ClientSession, url: str, workload: Workload, vocab_size: int,
                          arrivals: Arrivals, seed: int, max_seconds: float | None,
                          max_concurrency: int | None) -> tuple[list[StreamedRequest], float, bool]:
    """Every request of the workload streamed at its arrival time from this process -> (what each request that
    arrived saw, seconds, whether the run was cut at max_seconds)."""
    bodies, times = await workload_requests(session, url, workload, vocab_size, arrivals, seed)
    return await stream_bodies(session, url, bodies, times, max_seconds, max_concurrency)


async def workload_requests(session: aiohttp.ClientSession, url: str, workload: Workload, vocab_size: int,
                            arrivals: Arrivals, seed: int) -> tuple[list[dict], list[float]]:
    """The workload's streaming /v1/completions bodies (token-id prompts, the engine bench's) and arrival times."""
    prompts = make_prompts(workload, vocab_size, seed)
    return request_bodies(await served_model_name(session, url), prompts), arrivals.times(len(prompts))


def warm_up_server(url: str, workload: Workload, vocab_size: int, seed: int = 0, api_key: str | None = None) -> None:
    """send_warm_up on its own, for a caller that reads the server's counters between it and the run (then
    run_http_bench(..., warm_up=False)), so they count the workload's requests alone."""
    async def warm() -> None:
        async with open_session(api_key) as session:
            await send_warm_up(session, url, await served_model_name(session, url), workload, vocab_size, seed)
    asyncio.run(warm())


async def send_warm_up(session: aiohttp.ClientSession, url: str, model: str, workload: Workload, vocab_size: int,
                       seed: int) -> None:
    """The engine bench's warm-up (benchmarks/harness.py warm_up) through the front door, before the clock starts:
    a few prompts of the workload for 2 tokens each, so that kernels compiled at first use and the clients' and
    router's first-request costs are not paid by whichever run comes first, as the engine bench's runs never pay
    them. The prompts are drawn with another seed, so no prefix of the measured ones is cached by them (a server
    without /reset_prefix_cache, vLLM's, is measured cold too)."""
    prompts = make_prompts(workload, vocab_size, seed + 1)
    bodies = [body | {"max_tokens": min(2, body["max_tokens"])}
              for body in request_bodies(model, warm_up_prompts(prompts))]
    records, _, _ = await stream_bodies(session, url, bodies, [0.0] * len(bodies), None, None)
    errors = [record.error for record in records if record.error]
    if errors:
        raise ValueError(f"the warm-up requests to {url} failed: {errors[:3]}")


def request_bodies(model: str, prompts) -> list[dict]:
    return [{"model": model, "prompt": token_ids, "max_tokens": params.max_tokens,
             "temperature": params.temperature, "seed": params.seed, "ignore_eos": params.ignore_eos,
             "stream": True, "return_token_ids": True}
            for _, token_ids, params in prompts]


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, list[float]]:
    """Every sample of the server's /metrics by name ({} when it has none)."""
    async with session.get(f"{url}/metrics") as response:
        if response.status != 200:
            return {}
        return metric_samples(await response.text())


def metric_samples(text: str) -> dict[str, list[float]]:
    """Prometheus text -> every sample's value by sample name."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample.value)
    return samples


def router_cpu_seconds(samples: dict[str, list[float]]) -> float | None:
    """The router's CPU seconds: corun_router_process_cpu_seconds summed over its router processes (several on one
    port: one series each), else process_cpu_seconds_total (one process: vLLM's); None when it has neither
    (another server behind the URL)."""
    for name in ("corun_router_process_cpu_seconds", "process_cpu_seconds_total"):
        if name in samples:
            return sum(samples[name])
    return None


def prefix_cache_hit_rate(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict:
    """Prompt tokens served from the nodes' prefix caches over those looked up during the run (vLLM's
    vllm:prefix_cache_hits/queries counters); None where the server has no such counters."""
    def delta(name: str) -> float | None:
        full = f"vllm:prefix_cache_{name}_total"
        return sum(after[full]) - sum(before[full]) if full in after and full in before else None

    hits, queries = delta("hits"), delta("queries")
    if hits is None or queries is None:
        return {"hit_rate": None}
    return {"prefix_cache_hit_tokens": int(hits), "hit_rate": round(hits / queries, 4) if queries else 0.0}


SERVER_LATENCIES = {"ttft_s": "vllm:time_to_first_token_seconds", "queue_s": "vllm:request_queue_time_seconds",
                    "prefill_s": "vllm:request_prefill_time_seconds"}
"""vLLM's latency histograms as the router observes them (TTFT from the prompt's start on the router, after its body
is read and parsed; queue: in the prefill node's queue; prefill: from scheduled to the first token)."""


def server_means(before: dict[str, list[float]], after: dict[str, list[float]],
                 records: list[StreamedRequest]) -> dict:
    """The mean of each of the server's latency histograms over the run beside the client's mean TTFT ({} where the
    server has none): the client's TTFT less the router's is what the request spent before the router started its
    prompt (the client's send, HTTP, the body's parse) and on the way back."""
    means = {}
    for key, name in SERVER_LATENCIES.items():
        total, count = (sum(after.get(f"{name}_{part}", [0.0])) - sum(before.get(f"{name}_{part}", [0.0]))
                        for part in ("sum", "count"))
        if count > 0:
            means[key] = round(total / count, 4)
    ttfts = [r.chunk_at[0] - r.arrived_at for r in records if r.chunk_at]
    if not means or not ttfts:
        return {}
    return {"server_means": means | {"client_ttft_s": round(sum(ttfts) / len(ttfts), 4)}}


NODE_LOOP_COUNTERS = {**{f"{phase}_s": f"corun_node_loop_{phase}_seconds_total"
                         for phase in ("receive", "schedule", "run", "postprocess", "turns")},
                      "prefill_forwards": "corun_node_num_prefill_forwards_total",
                      "decode_steps": "corun_node_num_decode_steps_total"}
"""Where the nodes' loops spent the run (node_core/server.py NodeServer.turn), summed over the nodes."""


def node_loop(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict:
    """The nodes' loop phases and forwards over the run ({} where the server has no such counters): what a front
    door's per-request work costs the node that serves it, next to the engine bench's forward counts."""
    deltas = {key: round(sum(after[name]) - sum(before[name]), 4)
              for key, name in NODE_LOOP_COUNTERS.items() if name in after and name in before}
    return {"node_loop": deltas} if deltas else {}


def router_cpu(before: float | None, after: float | None, num_tokens: int, num_chunks: int) -> dict:
    """The router's CPU over the run, per streamed token and per SSE chunk (a chunk carries several tokens when
    the router fell behind the decode steps). NOTE: the whole process's CPU over the window, idle ticks included."""
    if before is None or after is None or num_tokens == 0:
        return {"router_cpu_s": None, "router_cpu_us_per_token": None, "router_cpu_us_per_chunk": None}
    cpu_s = after - before
    return {"router_cpu_s": round(cpu_s, 3), "router_cpu_us_per_token": round(1e6 * cpu_s / num_tokens, 2),
            "router_cpu_us_per_chunk": round(1e6 * cpu_s / max(1, num_chunks), 2)}


def outcome(record: StreamedRequest) -> RequestOutcome:
    ttft = record.chunk_at[0] - record.arrived_at if record.chunk_at else None
    tpot = (record.chunk_at[-1] - record.chunk_at[0]) / (record.num_tokens - 1) if record.num_tokens > 1 else None
    return RequestOutcome(record.finish_reason is not None and record.error is None, ttft, tpot)


def summarize_http(records: list[StreamedRequest], num_requests: int, elapsed: float, arrivals: Arrivals,
                   slo: SLOTargets, truncated: bool) -> dict:
    itls = [b - a for record in records for a, b in zip(record.chunk_at, record.chunk_at[1:])]
    num_tokens = sum(record.num_tokens for record in records)
    errors = [record.error for record in records if record.error]
    result = outcome_summary([outcome(record) for record in records], num_requests, num_tokens, elapsed, slo)
    return result | {
        "itl_ms": {"p50": round(1e3 * percentile(itls, 0.5), 3), "p99": round(1e3 * percentile(itls, 0.99), 3)},
        "arrivals": arrivals.describe(), "prefill_path": "served", "num_errors": len(errors),
        "first_errors": errors[:3], "truncated": truncated or len(records) < num_requests}


def run_http_bench(url: str, workloads: list[Workload], vocab_size: int, max_model_len: int, *,
                   arrivals: Arrivals, slo: SLOTargets, seed: int = 0, max_seconds: float | None = None,
                   max_concurrency: int | None = None, label: str | None = None,
                   api_key: str | None = None, client_processes: int | None = None,
                   warm_connections: bool = False, warm_up: bool = True) -> dict:
    """One report in the engine bench's schema, its one mode named after the URL. client_processes: how many
    processes send the requests (benchmarks/http_clients.py; None: auto_client_processes()). warm_connections: the
    connections the requests will use are opened before the run starts (http_clients.open_connections)."""
    from benchmarks.harness import progress_line
    from planner.workloads import check_fits

    if client_processes is not None and client_processes < 1:
        raise ValueError(f"client_processes (--client-processes) must be at least 1, not {client_processes}")
    for workload in workloads:
        check_fits(workload, max_model_len)
    mode = label or f"served@{url}"
    report = {"url": url, "arrivals": arrivals.describe(), "slo_targets": slo.describe(), "modes": {mode: {}}}
    for workload in workloads:
        try:
            result = asyncio.run(run_http_workload_async(url, workload, vocab_size, arrivals, slo, seed,
                                                         max_seconds, max_concurrency, api_key,
                                                         client_processes or auto_client_processes(),
                                                         warm_connections, warm_up))
        except (aiohttp.ClientError, OSError) as error:
            raise ValueError(f"cannot reach the router at {url}: {error}") from None
        if math.isnan(result["ttft_s"]["p50"]):  # NOTE: not one token came back: a report of NaNs helps no one
            raise ValueError(f"no request to {url} produced a token ({workload.name}): {result['first_errors']}")
        report["modes"][mode][workload.name] = result
        print(progress_line(mode, workload.name, result), file=sys.stderr, flush=True)
    return report
