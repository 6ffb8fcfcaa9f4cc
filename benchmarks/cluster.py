"""The cluster on this host: router overhead, and TTFT/throughput of 1P1D vs the colocated engine.

    python -m benchmarks.cluster --out benchmarks/results/cluster_cpu.json

(a) router overhead: the same short request, one at a time, over HTTP (streaming off) vs through
    router.generation.pipeline.generate on the same nodes from this process; p50/p90 of each and the p50 difference.
(b) 64 requests submitted at once: per-request TTFT (first streamed token) and output tokens/s, 1P1D over HTTP
    vs the colocated engine in this process (both with one compute thread per engine process).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time

import aiohttp

from benchmarks.report import emit
from corun import LLM, SamplingParams
from corun.models.tiny import make_tiny_model
from launch.local import LocalCluster, LocalClusterConfig, free_port
from router.generation.pipeline import generate
from router.nodes.pool import NodePool
from tests.conftest import varied_prompts
from tests.launch.cluster_client import MAX_MODEL_LEN, engine_config
from wire.config import RouterConfig
from wire.tokenizer import load_tokenizer


def percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50_ms": round(1e3 * statistics.median(ordered), 3), "p90_ms": round(1e3 * pick(0.9), 3),
            "p99_ms": round(1e3 * pick(0.99), 3), "n": len(ordered)}


async def http_latencies(url: str, prompt_ids: list[int], num: int, max_tokens: int) -> list[float]:
    body = {"model": "corun-tiny", "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0.6, "seed": 1,
            "ignore_eos": True}
    latencies = []
    async with aiohttp.ClientSession() as session:
        for _ in range(num):
            start = time.perf_counter()
            async with session.post(f"{url}/v1/completions", json=body) as response:
                await response.read()
                assert response.status == 200, await response.text()
            latencies.append(time.perf_counter() - start)
    return latencies


async def direct_latencies(cluster: LocalCluster, model: str, prompt_ids, num: int, max_tokens: int) -> list[float]:
    pool = NodePool(RouterConfig(model=model, prefill_addresses=tuple(cluster.prefill_addresses),
                                 decode_addresses=tuple(cluster.decode_addresses)))
    await pool.start()
    await pool.wait_until_healthy(30)
    params = SamplingParams(temperature=0.6, seed=1, max_tokens=max_tokens, ignore_eos=True)
    latencies = []
    try:
        for i in range(num):
            start = time.perf_counter()
            async for _ in generate(pool, f"direct-{i}", prompt_ids, params, 1):
                pass
            latencies.append(time.perf_counter() - start)
    finally:
        await pool.close()
    return latencies


async def streamed_ttfts(url: str, prompts: list[str], max_tokens: int) -> dict:
    async def one(session, prompt):
        body = {"model": "corun-tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.6, "seed": 42,
                "ignore_eos": True, "stream": True, "return_token_ids": True}
        start, ttft, num_tokens = time.perf_counter(), None, 0
        async with session.post(f"{url}/v1/completions", json=body) as response:
            async for line in response.content:
                if line.startswith(b"data: {"):
                    chunk = json.loads(line[6:])
                    num_tokens += sum(len(c.get("token_ids") or []) for c in chunk["choices"])
                    ttft = ttft or time.perf_counter() - start
        return ttft, num_tokens

    start = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        results = await asyncio.gather(*(one(session, p) for p in prompts))
    elapsed = time.perf_counter() - start
    num_tokens = sum(n for _, n in results)
    return {"ttft": percentiles([t for t, _ in results]), "output_tokens": num_tokens,
            "seconds": round(elapsed, 3), "output_tok_per_s": round(num_tokens / elapsed, 1)}


def colocated_ttfts(model: str, prompts: list[str], max_tokens: int) -> dict:
    llm = LLM(model, max_num_seqs=32, max_model_len=MAX_MODEL_LEN, prefill_chunk_size=64, num_threads=1)
    llm.generate(prompts[:2], SamplingParams(max_tokens=2))  # warm-up
    params = SamplingParams(temperature=0.6, seed=42, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    requests = [llm.add(p, params) for p in prompts]
    first_token_at: dict[str, float] = {}
    while llm.engine.has_unfinished():
        llm.engine.step()
        now = time.perf_counter()
        for r in requests:
            if r.output_token_ids and r.request_id not in first_token_at:
                first_token_at[r.request_id] = now - start
    elapsed = time.perf_counter() - start
    num_tokens = sum(len(r.output_token_ids) for r in requests)
    return {"ttft": percentiles(list(first_token_at.values())), "output_tokens": num_tokens,
            "seconds": round(elapsed, 3), "output_tok_per_s": round(num_tokens / elapsed, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--num-latency-samples", type=int, default=100)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_tiny_model(tmp))
        prompt_ids = load_tokenizer(model).encode(varied_prompts(1, seed=5, min_words=20, max_words=20)[0])
        prompts = varied_prompts(args.num_requests, seed=3)
        report = {"args": vars(args), "colocated": colocated_ttfts(model, prompts, args.output_len)}
        config = LocalClusterConfig(engine_config(model), served_model_name="corun-tiny", port=free_port("127.0.0.1"))
        with LocalCluster(config) as cluster:
            asyncio.run(http_latencies(cluster.url, prompt_ids, 5, 4))  # warm-up
            http = asyncio.run(http_latencies(cluster.url, prompt_ids, args.num_latency_samples, 4))
            direct = asyncio.run(direct_latencies(cluster, model, prompt_ids, args.num_latency_samples, 4))
            report["router_overhead"] = {"request": "20-word prompt, max_tokens 4, sequential",
                                         "http": percentiles(http), "direct": percentiles(direct),
                                         "p50_overhead_ms": round(1e3 * (statistics.median(http)
                                                                          - statistics.median(direct)), 3)}
            report["1p1d"] = asyncio.run(streamed_ttfts(cluster.url, prompts, args.output_len))
    emit(report, args.out)


if __name__ == "__main__":
    main()
