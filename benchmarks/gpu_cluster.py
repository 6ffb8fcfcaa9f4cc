"""The disaggregated cluster on one GPU through its HTTP endpoint, next to the colocated engines on the same GPU.

    python -m benchmarks.gpu_cluster --preset qwen3-8b --out benchmarks/results/h200_cluster_1p1d.json

1. 1P1D on one GPU (two processes, both on GPU 0, the KV over NIXL's CUDA-IPC path), a random-weight model
   directory of the preset's shape (`corun make-random-model`), bf16.
2. Determinism through HTTP: each prompt alone, then all of them concurrently (bs1 vs bsN), and a needle (one
   prompt among others at several batch sizes); then the same prompts on the colocated fixed_shape engine on the
   same GPU: the cluster must equal it bitwise. Inverse: the colocated mixed engine, alone vs batched, differs.
3. `corun bench --url` on the workloads, then the colocated fixed_shape and mixed engines on the same workloads,
   each run cut at --max-seconds; per request, the KV read time next to the prefill time (node counters).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import tempfile
import time

import aiohttp
import torch

from benchmarks.gpu_determinism import token_prompts
from benchmarks.harness import DEFAULT_ARRIVALS, SLOTargets, gpu_name, run_bench, scheduler_for
from benchmarks.http_bench import run_http_bench, served_model_name
from corun import LLM, SamplingParams
from corun.models.presets import PRESETS, make_random_model_dir
from launch.cluster import ClusterConfig, free_port
from launch.local import LocalCluster
from planner.workloads import make_workload
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

PARAMS = {"temperature": 0.7, "seed": 5, "max_tokens": 24, "logprobs": 5}


async def complete(session: aiohttp.ClientSession, url: str, model: str, prompt: list[int], params: dict) -> dict:
    body = {"model": model, "prompt": prompt, "ignore_eos": True, "return_token_ids": True, **params}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        choice = (await response.json())["choices"][0]
    return {"token_ids": choice["token_ids"], "logprobs": choice["logprobs"]["token_logprobs"],
            "top": choice["logprobs"]["top_logprobs"]}


async def served_outputs(url: str, prompts: list[list[int]], params: dict, concurrent: bool) -> list[dict]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        model = await served_model_name(session, url)
        if concurrent:
            return list(await asyncio.gather(*(complete(session, url, model, p, params) for p in prompts)))
        return [await complete(session, url, model, p, params) for p in prompts]


def needle_outputs(url: str, target: list[int], others: list[list[int]], sizes: list[int]) -> list[dict]:
    """The target's output when sent among size - 1 concurrent others, per size."""
    outputs = []
    for size in sizes:
        batch = others[:size - 1] + [target]
        outputs.append(asyncio.run(served_outputs(url, batch, PARAMS, concurrent=True))[-1])
    return outputs


def differing(first: list[dict], second: list[dict]) -> int:
    return sum(a["token_ids"] != b["token_ids"] or a["logprobs"] != b["logprobs"]
               for a, b in zip(first, second, strict=True))


def colocated_outputs(llm: LLM, prompts: list[list[int]], one_by_one: bool) -> list[dict]:
    params = SamplingParams(**PARAMS, ignore_eos=True)
    outputs = [llm.generate([p], params)[0] for p in prompts] if one_by_one else llm.generate(prompts, params)
    return [{"token_ids": o.outputs[0].token_ids, "logprobs": [lp.logprob for lp in o.outputs[0].logprobs]}
            for o in outputs]


def node_costs(url: str) -> dict:
    """Per request: prefill seconds on the prefill node, KV read seconds and bytes on the decode node."""
    import urllib.request

    time.sleep(2.0)  # NOTE: the router's view of node stats is its last pong: let one more arrive
    with urllib.request.urlopen(f"{url}/admin/nodes", timeout=10) as response:  # NOTE: /health has no stats
        nodes = {node["role"]: node["stats"] for node in json.loads(response.read())["nodes"]}
    prefill, decode = nodes["prefill"], nodes["decode"]
    reads, prefills = max(1, decode["reads_completed"]), max(1, prefill["num_prefills"])
    return {"prefills": prefill["num_prefills"],
            "prefill_ms_per_request": round(1e3 * prefill["prefill_seconds_total"] / prefills, 3),
            "note": "kv_read_ms: post to the decode loop's poll that saw it done (includes waiting for that poll); "
                    "kv_transfer_ms: NIXL's telemetry of the READ itself",
            "reads": decode["reads_completed"], "read_failures": decode["read_failures"],
            "kv_read_ms_per_request": round(1e3 * decode["read_seconds_total"] / reads, 3),
            "kv_mb_per_request": round(decode["bytes_read"] / reads / 1e6, 3),
            "kv_read_gb_per_s": round(decode["bytes_read"] / max(1e-9, decode["read_seconds_total"]) / 1e9, 2),
            "kv_transfer_ms_per_request": round(1e3 * decode["read_transfer_seconds_total"] / reads, 3),
            "kv_post_ms_per_request": round(1e3 * decode["read_post_seconds_total"] / reads, 3),
            "kv_transfer_ms_max": round(1e3 * decode["read_transfer_seconds_max"], 3),
            "reads_over_1ms": decode["reads_over_1ms"],
            "descriptors_per_read": round(decode["descriptors_posted"] / max(1, decode["reads_started"]), 2),
            "probe_read_gbps": decode["kv_probe_read_gbps_min"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="qwen3-8b", choices=sorted(PRESETS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=6144)
    parser.add_argument("--prefill-chunk-size", type=int, default=4096)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--fixed-shape-spec", "--corun-spec", default="fixed_shape",
                        help="the cluster's and the colocated fixed_shape engine's mode spec "
                        "(benchmarks.harness.scheduler_for; default: the defaults a user gets)")
    parser.add_argument("--prefill-kv-cache-mib", type=int, default=16000)
    parser.add_argument("--decode-kv-cache-mib", type=int, default=60000)
    parser.add_argument("--colocated-kv-cache-mib", type=int, default=60000)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=1500)
    parser.add_argument("--workloads", default="burstgpt,1024x2048")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--max-seconds", type=float, default=30.0)
    parser.add_argument("--skip-colocated-bench", action="store_true")
    parser.add_argument("--skip-served-bench", action="store_true", help="determinism and node costs only")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    model_dir = str(make_random_model_dir(args.preset, tempfile.mkdtemp(prefix=f"random-{args.preset}-")))
    vocab = PRESETS[args.preset]["vocab_size"]
    base = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                           prefill_chunk_size=args.prefill_chunk_size,
                           max_num_batched_tokens=args.max_num_batched_tokens)
    engine = EngineConfig(model=model_dir, dtype=args.dtype, device=args.device, num_threads=1,
                          scheduler=scheduler_for(base, args.fixed_shape_spec))
    prompts = token_prompts(args.num_prompts, vocab - 1, 1, args.prompt_len)  # NOTE: never the EOS id (the last)
    workloads = [make_workload(name, args.num_requests) for name in args.workloads.split(",")]
    report = {"gpu": gpu_name() if torch.cuda.is_available() else None, "command": vars(args),
              "engine": dataclasses.asdict(engine)}

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2, default=str)

    gpus = ("0",) if args.device.startswith("cuda") else ()
    cluster_config = ClusterConfig(engine, port=free_port("127.0.0.1"), prefill_gpus=gpus, decode_gpus=gpus,
                                   prefill_kv_cache_mib=args.prefill_kv_cache_mib,
                                   decode_kv_cache_mib=args.decode_kv_cache_mib, startup_timeout_s=300)
    start = time.perf_counter()
    with LocalCluster(cluster_config) as cluster:
        report["cluster_start_s"] = round(time.perf_counter() - start, 1)
        alone = asyncio.run(served_outputs(cluster.url, prompts, PARAMS, concurrent=False))
        together = asyncio.run(served_outputs(cluster.url, prompts, PARAMS, concurrent=True))
        needles = needle_outputs(cluster.url, prompts[0], prompts[1:], [2, 9, len(prompts)])
        report["determinism"] = {"prompts": len(prompts), "bs1_vs_bsn_differing": differing(alone, together),
                                 "needle_trials": len(needles),
                                 "needle_differing": differing([alone[0]] * len(needles), needles)}
        report["costs_after_determinism"] = node_costs(cluster.url)
        save()
        if args.skip_served_bench:
            return save()
        served = run_http_bench(cluster.url, workloads, vocab, args.max_model_len, arrivals=DEFAULT_ARRIVALS,
                                slo=SLOTargets(), max_seconds=args.max_seconds, label="cluster_1p1d")
        report["modes"] = served["modes"]
        report["costs_after_bench"] = node_costs(cluster.url)
        save()
    colocated_engine = dataclasses.replace(engine, cache=CacheConfig(memory_budget_bytes=args.colocated_kv_cache_mib
                                                                     * 2**20))
    llm = LLM.from_config(colocated_engine)
    reference = colocated_outputs(llm, prompts, one_by_one=False)
    report["determinism"]["cluster_vs_colocated_differing"] = differing(alone, reference)
    del llm
    mixed = LLM.from_config(dataclasses.replace(colocated_engine, scheduler=scheduler_for(base, "mixed")))
    report["determinism"]["inverse_mixed_bs1_vs_bsn_differing"] = differing(
        colocated_outputs(mixed, prompts, one_by_one=True), colocated_outputs(mixed, prompts, one_by_one=False))
    del mixed
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    save()
    if not args.skip_colocated_bench and "modes" in report:
        colocated = run_bench(colocated_engine, [args.fixed_shape_spec, "mixed"], workloads,
                              max_seconds=args.max_seconds)
        report["modes"].update({f"colocated_{mode}": runs for mode, runs in colocated["modes"].items()})
    save()
    print(json.dumps({"determinism": report["determinism"], "costs": report["costs_after_bench"],
                      "tok_per_s": {mode: {w: r["output_tok_per_s"] for w, r in runs.items()}
                                    for mode, runs in report["modes"].items()}}, indent=2))


if __name__ == "__main__":
    main()
