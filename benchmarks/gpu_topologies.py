"""Issue 13, item 3: the same requests through HTTP on every P/D topology and on the colocated engine, bitwise.

    python -m benchmarks.gpu_topologies --topologies 1P1D,2P1D,1P2D,2P2D --out benchmarks/results/X.json

Each topology is a LocalCluster of random-weight nodes of the preset's shape (bf16), every node on --prefill-gpus /
--decode-gpus (one GPU for all of a role: on one H200 every node shares GPU 0; on a multi-GPU host, e.g.
--prefill-gpus 0 --decode-gpus 1). Per topology: each prompt alone, all concurrently, and a needle among others;
then every topology's outputs against the first's and against the colocated fixed_shape engine on the same GPU.
Inverse: the colocated mixed engine, alone vs batched, on the same prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import tempfile
import time

import torch

from benchmarks.gpu_cluster import PARAMS, colocated_outputs, differing, needle_outputs, served_outputs
from benchmarks.gpu_determinism import token_prompts
from benchmarks.harness import gpu_name, scheduler_for
from corun import LLM
from corun.models.presets import PRESETS, make_random_model_dir
from launch.cluster import ClusterConfig, free_port
from launch.local import LocalCluster
from wire.config import CacheConfig, EngineConfig, SchedulerConfig


def parse_topology(text: str) -> tuple[int, int]:
    prefill, _, decode = text.upper().removesuffix("D").partition("P")
    return int(prefill), int(decode)


def gpus(names: str, engine: EngineConfig) -> tuple[str, ...]:
    return tuple(names.split(",")) if engine.device.startswith("cuda") else ()


def run_topology(engine: EngineConfig, topology: str, prompts: list[list[int]], args) -> tuple[dict, list[dict]]:
    num_prefill, num_decode = parse_topology(topology)
    config = ClusterConfig(engine, num_prefill=num_prefill, num_decode=num_decode, port=free_port("127.0.0.1"),
                           prefill_gpus=gpus(args.prefill_gpus, engine), decode_gpus=gpus(args.decode_gpus, engine),
                           prefill_kv_cache_mib=args.prefill_kv_cache_mib, decode_kv_cache_mib=args.decode_kv_cache_mib,
                           startup_timeout_s=300)
    start = time.perf_counter()
    with LocalCluster(config) as cluster:
        started = time.perf_counter() - start
        alone = asyncio.run(served_outputs(cluster.url, prompts, PARAMS, concurrent=False))
        together = asyncio.run(served_outputs(cluster.url, prompts, PARAMS, concurrent=True))
        needles = needle_outputs(cluster.url, prompts[0], prompts[1:], [2, len(prompts)])
    return {"start_s": round(started, 1), "bs1_vs_bsn_differing": differing(alone, together),
            "needle_differing": differing([alone[0]] * len(needles), needles)}, alone


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="qwen3-8b", choices=sorted(PRESETS))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the code path (no GPUs named)")
    parser.add_argument("--topologies", default="1P1D,2P1D,1P2D,2P2D")
    parser.add_argument("--prefill-gpus", default="0")
    parser.add_argument("--decode-gpus", default="0")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--prefill-chunk-size", type=int, default=1024)
    parser.add_argument("--fixed-shape-spec", "--corun-spec", default="fixed_shape",
                        help="default: the defaults a user gets")
    parser.add_argument("--prefill-kv-cache-mib", type=int, default=6000)
    parser.add_argument("--decode-kv-cache-mib", type=int, default=10000)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=1200)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    model_dir = str(make_random_model_dir(args.preset, tempfile.mkdtemp(prefix=f"random-{args.preset}-")))
    base = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                           prefill_chunk_size=args.prefill_chunk_size)
    engine = EngineConfig(model=model_dir, dtype=args.dtype, device=args.device, num_threads=1,
                          scheduler=scheduler_for(base, args.fixed_shape_spec))
    prompts = token_prompts(args.num_prompts, PRESETS[args.preset]["vocab_size"] - 1, 1, args.prompt_len)
    cuda = torch.cuda.is_available()
    report = {"gpu": gpu_name() if cuda else None, "gpus": torch.cuda.device_count(),
              "command": vars(args), "engine": dataclasses.asdict(engine), "topologies": {}}

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2, default=str)

    outputs = {}
    for topology in args.topologies.split(","):
        report["topologies"][topology], outputs[topology] = run_topology(engine, topology, prompts, args)
        first = next(iter(outputs.values()))
        report["topologies"][topology]["vs_first_topology_differing"] = differing(first, outputs[topology])
        save()
    colocated = dataclasses.replace(engine, cache=CacheConfig(memory_budget_bytes=args.decode_kv_cache_mib * 2**20))
    llm = LLM.from_config(colocated)
    reference = colocated_outputs(llm, prompts, one_by_one=False)
    del llm
    for topology, served in outputs.items():
        report["topologies"][topology]["vs_colocated_differing"] = differing(served, reference)
    mixed = LLM.from_config(dataclasses.replace(colocated, scheduler=scheduler_for(base, "mixed")))
    report["inverse_mixed_bs1_vs_bsn_differing"] = differing(
        colocated_outputs(mixed, prompts, one_by_one=True), colocated_outputs(mixed, prompts, one_by_one=False))
    save()
    print(json.dumps({k: v for k, v in report.items() if k in ("topologies", "inverse_mixed_bs1_vs_bsn_differing")},
                     indent=2))


if __name__ == "__main__":
    main()
