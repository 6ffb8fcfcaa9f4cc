"""The prefix cache on against off (issue 25): the shared-prefix workloads (planner/prefix_workloads.py) and a
control with no shared prefix, once with the cache on and once off; one JSON whose "modes" maps cache_on and
cache_off to the workloads' results (corun bench's fields, and each workload's hit_rate).

    python -m benchmarks.prefix_cache --model DIR --out benchmarks/results/cpu_prefix_cache.json [engine flags]
    python -m benchmarks.prefix_cache --model random:qwen3-8b --device cuda --dtype bfloat16 --max-num-seqs 256 \
        --max-model-len 6144 --kv-cache-mib 60000 --variants fixed_shape:prefill_chunk_size=256 --determinism \
        --paths engine,http --out benchmarks/results/h200_prefix_cache.json

- The engine (`corun bench`'s run_bench, each run starting cold) at the engine flags given; --variants: more mode
  specs (benchmarks.harness.scheduler_for: e.g. another prefill_chunk_size), each on and off, under "variants".
- --paths http: a colocated node (`corun serve --prefill 0 --decode 0 --colocated 1`, --routers K) on the same device,
  cache on then off, through HTTP (`corun bench --url`), its cache reset before each workload: under "http".
- --determinism: prompts of the shared-prefix workloads on the engine, cache off (each alone) against cache on
  (each alone after the others of its group, all at once, after a reset), token ids and logprobs bitwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import tempfile
import urllib.request
from collections.abc import Callable

import torch

from benchmarks.harness import DEFAULT_ARRIVALS, SLOTargets, run_bench
from benchmarks.http_bench import run_http_bench
from corun import LLM, SamplingParams
from corun.models.presets import PRESETS, is_random_spec, make_random_model_dir
from planner.prefix_workloads import SHARED_PREFIX_WORKLOADS
from planner.workloads import make_prompts, make_workload
from wire.config import EngineConfig
from wire.engine_args import add_engine_args, engine_config_from_args

CONTROL = "256x32"
"""No shared prefix: the cache's cost where it cannot hit."""
CACHE_MODES = {"on": ("cache_on", True), "off": ("cache_off", False)}
"""--cache's names: each run's label and whether the cache is on."""
DETERMINISM_PARAMS = SamplingParams(temperature=0.7, seed=11, max_tokens=16, logprobs=5, ignore_eos=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prefix_cache", description=__doc__.split("\n\n")[0])
    add_engine_args(parser)
    parser.add_argument("--workloads", default=",".join([*SHARED_PREFIX_WORKLOADS, CONTROL]))
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=None, help="cut each run (the JSON marks it truncated)")
    parser.add_argument("--variants", default="", help="more mode specs to run on and off (comma-separated)")
    parser.add_argument("--paths", default="engine", help="engine, http (a colocated node on the device) or both")
    parser.add_argument("--routers", type=int, default=1, help="router processes in front of the node (--paths http)")
    parser.add_argument("--client-processes", type=int, default=None,
                        help="--paths http: processes that send the requests (default: one per 4 cores, 1 to 8)")
    parser.add_argument("--warm-connections", action="store_true",
                        help="--paths http: the clients open their connections before each run starts, as an "
                             "evaluation harness's session holds them (benchmarks/http_clients.py, open_connections)")
    parser.add_argument("--log-prefill-batches", action="store_true",
                        help="--paths http: the node logs each prefill forward (NodeSettings.log_prefill_batches)")
    parser.add_argument("--cache", default="on,off", help="on, off or both: the cache's settings run, in order (a "
                        "ratio needs both; one alone measures a change that moves only the other's figures)")
    parser.add_argument("--determinism", action="store_true", help="also cold vs warm bitwise on the engine")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    base = engine_config_from_args(args)
    cache_modes = [CACHE_MODES[name] for name in args.cache.split(",")]
    workloads = [make_workload(name, args.num_requests, args.seed) for name in args.workloads.split(",")]
    report = {"command": "python -m benchmarks.prefix_cache " + " ".join(sys.argv[1:] if argv is None else argv)}

    def save() -> None:
        if args.out:
            with open(args.out, "w") as f:
                f.write(json.dumps(report, indent=2, default=str) + "\n")

    if args.determinism:
        report["determinism"] = determinism(base, workloads, args.seed)
        print(json.dumps(report["determinism"]), file=sys.stderr, flush=True)
        save()
    paths = args.paths.split(",")
    if "engine" in paths:
        report |= on_and_off(base, "fixed_shape", workloads, args.max_seconds, cache_modes)
        save()
        for spec in filter(None, args.variants.split(",")):
            report.setdefault("variants", {})[spec] = on_and_off(base, spec, workloads, args.max_seconds, cache_modes)
            save()
    if "http" in paths:
        def saved_so_far(http: dict) -> None:
            report["http"] = http
            save()

        through_http(base, workloads, args.max_seconds, args.routers, args.client_processes, args.warm_connections,
                     on_workload=saved_so_far, cache_modes=cache_modes, log_prefill_batches=args.log_prefill_batches)
    print(json.dumps({"speedup": report.get("speedup"), "http": report.get("http", {}).get("speedup"),
                      "variants": {k: v["speedup"] for k, v in report.get("variants", {}).items()},
                      "determinism": report.get("determinism", {}).get("identical")}, indent=2))
    return 0


def with_cache(config: EngineConfig, enabled: bool) -> EngineConfig:
    return dataclasses.replace(config, cache=dataclasses.replace(config.cache, enable_prefix_caching=enabled))


def on_and_off(base: EngineConfig, spec: str, workloads, max_seconds: float | None,
               cache_modes=tuple(CACHE_MODES.values())) -> dict:
    """The engine at one mode spec, the cache on then off: {"modes": {cache_on, cache_off}, "speedup", ...}."""
    report = {"modes": {}}
    for label, enabled in cache_modes:
        run = run_bench(with_cache(base, enabled), [spec], workloads, max_seconds=max_seconds)
        [mode] = run["modes"]
        report["modes"][label] = run["modes"][mode]
        for key in ("engine", "hardware", "torch", "gpu", "prefill_paths"):
            report.setdefault(key, run[key])
    report["speedup"] = speedups(report["modes"])
    return report


def speedups(modes: dict) -> dict:
    """cache_on against cache_off per workload: throughput (output tokens/s; the same requests), TTFT p50, and the
    hit rate. None where a workload has no cache-off row (yet)."""
    def ratio(a, b):
        return round(a / b, 3) if a is not None and b else None

    def speedup(on: dict, off: dict) -> dict:
        return {"throughput_x": ratio(on["output_tok_per_s"], off.get("output_tok_per_s")),
                "ttft_p50_x": ratio(on["ttft_s"]["p50"], off.get("ttft_s", {}).get("p50")),
                "hit_rate": on["hit_rate"]}

    return {name: speedup(on, modes.get("cache_off", {}).get(name, {}))
            for name, on in modes.get("cache_on", {}).items()}


# --- through HTTP -------------------------------------------------------------------------------------------------
def through_http(base: EngineConfig, workloads, max_seconds: float | None, num_routers: int = 1,
                 client_processes: int | None = None, warm_connections: bool = False,
                 on_workload: Callable[[dict], None] | None = None, cache_modes=tuple(CACHE_MODES.values()),
                 log_prefill_batches: bool = False) -> dict:
    """The workloads through a router and a colocated node, the cache on then off. on_workload gets the report as it
    stands after each workload (so a run cut short, e.g. by a device call's time limit, still leaves its rows).
    log_prefill_batches: the node logs each prefill forward, on the clock of each run's started_at_monotonic."""
    from launch.cluster import ClusterConfig, free_port
    from launch.local import LocalCluster

    config = dataclasses.replace(base, model=model_dir(base.model))
    vocab = PRESETS[base.model.removeprefix("random:")]["vocab_size"] if is_random_spec(base.model) else None
    gpus = (base.device.partition(":")[2] or "0",) if base.device.startswith("cuda") else ()
    report = {"deployment": f"corun serve --prefill 0 --decode 0 --colocated 1 --routers {num_routers}", "modes": {}}
    for label, enabled in cache_modes:
        cluster_config = ClusterConfig(with_cache(config, enabled), num_prefill=0, num_decode=0, num_colocated=1,
                                       num_routers=num_routers, port=free_port("127.0.0.1"), colocated_gpus=gpus,
                                       startup_timeout_s=900, log_prefill_batches=log_prefill_batches)
        report["modes"][label] = {}
        with LocalCluster(cluster_config) as cluster:
            for workload in workloads:
                reset_prefix_cache(cluster.url)
                run = run_http_bench(cluster.url, [workload], vocab or vocab_of(config), base.scheduler.max_model_len,
                                     arrivals=DEFAULT_ARRIVALS, slo=SLOTargets(), max_seconds=max_seconds,
                                     label=label, client_processes=client_processes,
                                     warm_connections=warm_connections)
                report["modes"][label][workload.name] = run["modes"][label][workload.name]
                report["speedup"] = speedups(report["modes"])
                if on_workload is not None:
                    on_workload(report)
    return report


def model_dir(model: str) -> str:
    """A node process loads a checkpoint directory: a random preset is written to one first."""
    if not is_random_spec(model):
        return model
    preset = model.removeprefix("random:")
    return str(make_random_model_dir(preset, tempfile.mkdtemp(prefix=f"random-{preset}-")))


def vocab_of(config: EngineConfig) -> int:
    with open(f"{config.model}/config.json") as f:
        return json.load(f)["vocab_size"]


def reset_prefix_cache(url: str) -> None:
    request = urllib.request.Request(f"{url}/reset_prefix_cache", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


# --- bitwise ------------------------------------------------------------------------------------------------------
def determinism(base: EngineConfig, workloads, seed: int) -> dict:
    """The shared-prefix workloads' prompts (up to 32 of each): with the cache off each alone; with it on, each alone
    in order (later prompts of a group hit what earlier ones cached), all at once, and after a reset."""
    cold_llm = LLM.from_config(with_cache(base, False))
    vocab = cold_llm.engine.runner.model.cfg.vocab_size
    prompts = [token_ids for workload in workloads if workload.name in SHARED_PREFIX_WORKLOADS
               for _, token_ids, _ in make_prompts(workload, vocab, seed)[:32]]

    def run(llm: LLM, together: bool) -> list[tuple]:
        results = llm.generate(prompts, DETERMINISM_PARAMS) if together else \
            [llm.generate([p], DETERMINISM_PARAMS)[0] for p in prompts]
        return [(r.outputs[0].token_ids, r.outputs[0].logprobs) for r in results]

    cold = run(cold_llm, together=False)
    del cold_llm
    free_memory()
    llm = LLM.from_config(with_cache(base, True))
    warm = {"alone_in_order": run(llm, together=False), "all_at_once": run(llm, together=True)}
    num_hit_tokens = llm.engine.block_manager.prefix_cache.num_hit_tokens
    llm.reset_prefix_cache()
    warm["after_reset_all_at_once"] = run(llm, together=True)
    differing = {name: sum(a != b for a, b in zip(outputs, cold, strict=True)) for name, outputs in warm.items()}
    del llm
    free_memory()
    return {"prompts": len(prompts), "prompts_differing": differing, "hit_tokens": num_hit_tokens,
            "identical": not any(differing.values())}


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
