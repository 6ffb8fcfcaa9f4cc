"""The cluster through its HTTP front door next to the engine behind it, on one GPU (issue 21).

    python -m benchmarks.front_door --preset qwen3-8b --out benchmarks/results/h200_front_door.json

In one run, one after the other on GPU 0, the same workloads (each cut at --max-seconds):
1. `engine`: the colocated engine in fixed_shape mode (`corun bench`'s run_bench), the defaults a user gets;
2. `colocated_nodes_http`: `corun serve --prefill 0 --decode 0 --colocated 1` through HTTP (`corun bench --url`);
3. `1p1d_http`: `corun serve --prefill 1 --decode 1` on the same GPU through HTTP, and the KV hand-off per request
   under the ShareGPT-like load (the decode node's read-time buckets: kv_handoff_ms_p50 is the smallest bucket
   holding half the reads).
Determinism through both clusters: each prompt alone vs all concurrently, and the cluster vs the engine, bitwise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import tempfile
import time
import urllib.request

import torch

from benchmarks.gpu_cluster import PARAMS, colocated_outputs, differing, served_outputs
from benchmarks.gpu_determinism import token_prompts
from benchmarks.harness import DEFAULT_ARRIVALS, SLOTargets, gpu_name, run_bench, scheduler_for
from benchmarks.http_bench import run_http_bench, warm_up_server
from corun import LLM
from corun.models.presets import PRESETS, make_random_model_dir
from launch.cluster import ClusterConfig, free_port
from launch.local import LocalCluster
from node_core.server import LOOP_PHASES
from planner.workloads import make_workload
from transfer.counters import READ_MS_BUCKETS
from wire.config import CacheConfig, EngineConfig, SchedulerConfig, TransferConfig

HANDOFF_WORKLOAD = "sharegpt"


def role_stats(url: str) -> dict[str, dict]:
    """role -> the stats of the cluster's one node of that role."""
    time.sleep(2.0)  # NOTE: the router's copy of node stats is its last pong: let one more arrive
    with urllib.request.urlopen(f"{url}/admin/nodes", timeout=10) as response:
        return {node["role"]: node["stats"] for node in json.loads(response.read())["nodes"]}


def loop_breakdown(before: dict, after: dict) -> dict:
    """Where a node's loop spent the workload's time (seconds per phase), and its forwards."""
    seconds = {phase: round(after[f"loop_{phase}_seconds_total"] - before[f"loop_{phase}_seconds_total"], 3)
               for phase in LOOP_PHASES}
    counts = {key: after.get(key, 0) - before.get(key, 0)
              for key in ("num_decode_steps", "num_prefill_forwards", "num_decoded_rows", "num_preemptions",
                          "num_blocks_swapped_out")}
    rows = round(counts["num_decoded_rows"] / counts["num_decode_steps"], 1) if counts["num_decode_steps"] else None
    return {"seconds": seconds, **counts, "rows_per_decode_step": rows,
            "swap_space_blocks": after.get("swap_space_blocks")}


def handoff(before: dict, after: dict) -> dict:
    """The KV reads between two decode-node stats: count, mean, and the bucket holding the median."""
    reads = after["reads_completed"] - before["reads_completed"]
    within = {ms: after[f"reads_within_{ms}ms"] - before[f"reads_within_{ms}ms"] for ms in READ_MS_BUCKETS}
    p50 = next((ms for ms in READ_MS_BUCKETS if reads and within[ms] >= reads / 2), None)
    seconds = after["read_seconds_total"] - before["read_seconds_total"]
    transfer = after["read_transfer_seconds_total"] - before["read_transfer_seconds_total"]
    return {"reads": reads, "kv_handoff_ms_mean": round(1e3 * seconds / max(1, reads), 3),
            "kv_handoff_ms_p50_at_most": p50, "reads_within_ms": within,
            "kv_transfer_ms_mean": round(1e3 * transfer / max(1, reads), 3),
            "reads_over_1ms": after["reads_over_1ms"] - before["reads_over_1ms"],
            "reads_on_gpu": after.get("reads_on_gpu", 0) - before.get("reads_on_gpu", 0),
            "gpu_copy_ms_mean": round(1e3 * (after.get("read_copy_seconds_total", 0.0)
                                             - before.get("read_copy_seconds_total", 0.0)) / max(1, reads), 3),
            "note": "hand-off: post to the decode node's poll that saw the READ done (polled every 0.2 ms while a "
                    "decode step runs, else once per loop turn); transfer: NIXL's telemetry of the READ itself (of a "
                    "read copied on the GPU, reads_on_gpu: post to the poll that saw its event)"}


def itl_against_target(modes: dict) -> dict:
    """Each HTTP run's streamed ITL p99 against issue 21's bound (1.5 x its TPOT p99 + 5 ms), beside the engine's own
    ITL p99 on the workload: the gaps its schedule makes (a prefill forward between decode steps), which no front
    door can remove."""
    engine = modes["engine"]

    def against(name: str, run: dict) -> dict:
        itl_p99, bound = run["itl_ms"]["p99"], 1.5 * run["tpot_ms"]["p99"] + 5
        return {"itl_p99": itl_p99, "bound": round(bound, 3), "met": itl_p99 <= bound,
                "engine_itl_p99": engine.get(name, {}).get("itl_ms", {}).get("p99")}
    return {mode: {name: against(name, run) for name, run in runs.items()}
            for mode, runs in modes.items() if mode != "engine"}


def swap_spaces(text: str) -> list[int | None]:
    """--1p1d-swap-spaces: None for auto, else MiB."""
    try:
        return [None if part == "auto" else int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a swap space is auto or MiB, got {text!r}") from None


def kv_splits(text: str) -> list[tuple[int, int] | None]:
    """--1p1d-kv-splits: None for auto, else (prefill MiB, decode MiB)."""
    splits = []
    for part in text.split(","):
        if part == "auto":
            splits.append(None)
            continue
        try:
            prefill_mib, decode_mib = (int(mib) for mib in part.split("/"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"a split is auto or PREFILL_MIB/DECODE_MIB, got {part!r}") from None
        splits.append((prefill_mib, decode_mib))
    return splits


def serve_cluster(report: dict, save, config: ClusterConfig, mode: str, workloads, prompts, reference, vocab: int,
                  max_model_len: int, served: dict) -> None:
    """One cluster on the GPU through HTTP, under report's modes[mode]: determinism, then each workload with its
    nodes' loops (by role) and, where a decode node reads KV, the hand-off (kv_handoff_ms_p50 from the auto 1P1D
    split's ShareGPT-like run)."""
    with LocalCluster(config) as cluster:
        report["determinism"][mode] = served_determinism(cluster.url, prompts, reference)
        report["modes"][mode] = {}
        for workload in workloads:
            warm_up_server(cluster.url, workload, vocab)  # NOTE: before the counters are read: they count the run's
            before = role_stats(cluster.url)
            runs = run_http_bench(cluster.url, [workload], vocab, max_model_len, label=mode, warm_up=False, **served)
            report["modes"][mode].update(runs["modes"][mode])
            after = role_stats(cluster.url)
            for role in after:
                loops = report.setdefault("node_loops", {}).setdefault(mode, {}).setdefault(role, {})
                loops[workload.name] = loop_breakdown(before[role], after[role]) | {
                    "usable_blocks": after[role]["num_usable_blocks"]}
            if "decode" in after:
                costs = handoff(before["decode"], after["decode"])
                report.setdefault("kv_handoff", {}).setdefault(mode, {})[workload.name] = costs
                if mode == "1p1d_http" and workload.name == HANDOFF_WORKLOAD:
                    report["kv_handoff_ms_p50"] = costs["kv_handoff_ms_p50_at_most"]
            save()


def empty_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


GPU_GIVEN_BACK_TIMEOUT_S = 60.0


def free_gpu_bytes() -> int | None:
    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None


def wait_until_gpu_free(free_bytes: int | None, report: dict) -> None:
    """Before a cluster starts: until the GPU has free_bytes free again, or GPU_GIVEN_BACK_TIMEOUT_S passed (the
    seconds waited go in report["gpu_waits_s"]). NOTE: at stop 51, a cluster started right after another one stopped
    found a process holding 40.29 GiB, to the GiB the stopped cluster's decode node, whose exit LocalCluster.stop had
    waited for: nodes sizing their KV must not find the last cluster's memory still held."""
    if free_bytes is None:
        return
    started = time.monotonic()
    while free_gpu_bytes() < free_bytes and time.monotonic() - started < GPU_GIVEN_BACK_TIMEOUT_S:
        time.sleep(0.5)
    report.setdefault("gpu_waits_s", []).append(round(time.monotonic() - started, 1))


def served_determinism(url: str, prompts: list[list[int]], reference: list[dict]) -> dict:
    alone = asyncio.run(served_outputs(url, prompts, PARAMS, concurrent=False))
    together = asyncio.run(served_outputs(url, prompts, PARAMS, concurrent=True))
    return {"prompts": len(prompts), "bs1_vs_bsn_differing": differing(alone, together),
            "vs_engine_differing": differing(alone, reference)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default=None, choices=sorted(PRESETS),
                        help="default: qwen3-8b on CUDA, qwen3-tiny on CPU (an 8B model in float32 fills a small host)")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of the whole script")
    parser.add_argument("--dtype", default="auto", help="default: the engine's (auto: bfloat16 on CUDA for a preset)")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="default: the engine's (auto: 256 on CUDA); runs until stop 45 passed 256")
    parser.add_argument("--max-model-len", type=int, default=6144)
    parser.add_argument("--prefill-chunk-size", type=int, default=None,
                        help="default: the engine's (auto: 32 on CUDA, packed prefill forwards of 2048 rows); runs "
                        "until stop 43 passed 4096, which made every prefill forward 4096 rows, not what a user gets")
    parser.add_argument("--kv-cache-mib", type=int, default=None,
                        help="the engine's and each decoding node's (default: auto, sized on the GPU as a user's "
                        "nodes size it; runs until stop 45 passed 60000)")
    parser.add_argument("--1p1d-kv-splits", dest="kv_splits", type=kv_splits, default=[None],
                        help="the 1P1D clusters to serve, one after the other beside one engine run: each `auto` (the "
                        "nodes size their KV on the GPU as a user's do; the decode node takes --kv-cache-mib where "
                        "given) or PREFILL_MIB/DECODE_MIB, another split of the GPU's memory, e.g. auto,8000/80000 "
                        "(until stop 45 runs passed 16000 for the prefill node)")
    parser.add_argument("--1p1d-swap-spaces", dest="swap_spaces", type=swap_spaces, default=[None],
                        help="for each split, the 1P1D clusters to serve by the decode node's swap space "
                        "(--swap-space-mib): auto (as a user's nodes take it) or MiB, e.g. auto,0 (0: admission keeps "
                        "every whole sequence within the KV cache, as before stop 52)")
    parser.add_argument("--1p1d-share-weights", dest="share_weights", default="auto",
                        help="for each split and swap space, the 1P1D clusters to serve by their share_weights: "
                        "auto (as a user's: one copy of the weights for both nodes on the GPU) and off (each node "
                        "its own, as before stop 53), e.g. auto,off")
    parser.add_argument("--1p1d-copy-on-gpu", dest="copy_on_gpu", default="on",
                        help="for each of the above, the 1P1D clusters to serve by the decode node's KV reads: on (a "
                        "user's: its own copy from the prefill node's KV mapped over CUDA IPC) and off (NIXL's READ, "
                        "as before stop 53), e.g. on,off")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=1500)
    parser.add_argument("--workloads", default="sharegpt,burstgpt,1024x2048")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--max-seconds", type=float, default=20.0)
    parser.add_argument("--async-scheduling", default="on", choices=("on", "off"),
                        help="the engine's and every node's (SchedulerConfig.async_scheduling)")
    parser.add_argument("--deployments", default="colocated,1p1d",
                        help="which to serve beside the engine: colocated (one colocated node), 1p1d (a prefill and a "
                        "decode node on the one GPU)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    deployments = set(args.deployments.split(","))
    if not deployments <= {"colocated", "1p1d"}:
        parser.error(f"--deployments takes colocated and 1p1d, got {args.deployments}")
    preset = args.preset = args.preset or ("qwen3-8b" if args.device.startswith("cuda") else "qwen3-tiny")
    model_dir = str(make_random_model_dir(preset, tempfile.mkdtemp(prefix=f"random-{preset}-")))
    vocab = PRESETS[preset]["vocab_size"]
    base = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                           prefill_chunk_size=args.prefill_chunk_size)
    engine = EngineConfig(model=model_dir, dtype=args.dtype, device=args.device, num_threads=1,
                          scheduler=scheduler_for(base, f"fixed_shape:async_scheduling={args.async_scheduling}"),
                          cache=CacheConfig(memory_budget_bytes=None if args.kv_cache_mib is None
                                            else args.kv_cache_mib * 2**20))
    prompts = token_prompts(args.num_prompts, vocab - 1, 1, args.prompt_len)  # NOTE: never the EOS id (the last)
    workloads = [make_workload(name, args.num_requests) for name in args.workloads.split(",")]
    gpu = ("0",) if args.device.startswith("cuda") else ()
    report = {"gpu": gpu_name() if gpu else None, "torch": torch.__version__, "command": vars(args),
              "engine": dataclasses.asdict(engine), "modes": {}, "determinism": {}}

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2, default=str)

    llm = LLM.from_config(engine)
    reference = colocated_outputs(llm, prompts, one_by_one=False)
    del llm
    empty_cache()
    engine_run = run_bench(engine, ["fixed_shape"], workloads, max_seconds=args.max_seconds)
    report["modes"]["engine"] = engine_run["modes"]["fixed_shape"]
    # NOTE: its KV blocks as it ran: an engine sized beside a first one not yet freed ran 61 rows (stop 54)
    report["engine_resolved"] = engine_run["resolved"]["fixed_shape"]
    save()
    empty_cache()
    # NOTE: a little under what is free now: the allocator may keep a few MiB it cannot give back
    free_now = free_gpu_bytes()
    free_before_clusters = None if free_now is None else free_now - 256 * 2**20
    served = {"slo": SLOTargets(), "arrivals": DEFAULT_ARRIVALS, "max_seconds": args.max_seconds}
    clusters = []
    if "colocated" in deployments:
        clusters.append(("colocated_nodes_http", ClusterConfig(
            engine, num_prefill=0, num_decode=0, num_colocated=1, colocated_gpus=gpu,
            decode_kv_cache_mib=args.kv_cache_mib, startup_timeout_s=600)))
    if "1p1d" in deployments:
        for split, swap_mib, share, copy in itertools.product(args.kv_splits, args.swap_spaces,
                                                               args.share_weights.split(","),
                                                               args.copy_on_gpu.split(",")):
            prefill_mib, decode_mib = split or (None, args.kv_cache_mib)
            mode = "1p1d_http" if split is None else f"1p1d_http:{prefill_mib}/{decode_mib}"
            mode += "" if swap_mib is None else f":swap{swap_mib}"
            mode += "" if share == "auto" else f":weights-{share}"
            mode += "" if copy == "on" else ":nixl-reads"
            swap = dataclasses.replace(engine.cache, swap_space_bytes=None if swap_mib is None else swap_mib * 2**20)
            clusters.append((mode, ClusterConfig(
                dataclasses.replace(engine, cache=swap), prefill_gpus=gpu, decode_gpus=gpu,
                prefill_kv_cache_mib=prefill_mib, decode_kv_cache_mib=decode_mib, startup_timeout_s=600,
                share_weights=share, transfer=TransferConfig(copy_on_gpu=copy == "on"))))
    for mode, config in clusters:
        wait_until_gpu_free(free_before_clusters, report)
        config = dataclasses.replace(config, port=free_port("127.0.0.1"))  # NOTE: picked just before it is bound
        serve_cluster(report, save, config, mode, workloads, prompts, reference, vocab, args.max_model_len, served)
    report["ratios_to_engine"] = {
        mode: {name: round(run["output_tok_per_s"] / report["modes"]["engine"][name]["output_tok_per_s"], 3)
               for name, run in runs.items() if name in report["modes"]["engine"]}
        for mode, runs in report["modes"].items() if mode != "engine"}
    report["itl_p99_ms"] = itl_against_target(report["modes"])
    save()
    print(json.dumps({"determinism": report["determinism"], "ratios_to_engine": report["ratios_to_engine"],
                      "itl_p99_ms": report["itl_p99_ms"],
                      "kv_handoff": report.get("kv_handoff"), "node_loops": report.get("node_loops")}, indent=2))


if __name__ == "__main__":
    main()
