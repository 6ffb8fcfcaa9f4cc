"""The prefix cache on against off (issue 25): `corun bench`'s engine run on the shared-prefix workloads
(planner/prefix_workloads.py) and a control with no shared prefix, once with --enable-prefix-caching and once
without; one JSON whose "modes" maps cache_on and cache_off to the workloads' results (corun bench's fields, and
each workload's hit_rate).

    python -m benchmarks.prefix_cache --model DIR --out benchmarks/results/cpu_prefix_cache.json [bench flags]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from benchmarks.harness import run_bench
from planner.prefix_workloads import SHARED_PREFIX_WORKLOADS
from planner.workloads import make_workload
from wire.engine_args import add_engine_args, engine_config_from_args

CONTROL = "256x32"
"""No shared prefix: the cache's cost where it cannot hit."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prefix_cache", description=__doc__.split("\n\n")[0])
    add_engine_args(parser)
    parser.add_argument("--workloads", default=",".join([*SHARED_PREFIX_WORKLOADS, CONTROL]))
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    base = engine_config_from_args(args)
    workloads = [make_workload(name, args.num_requests, args.seed) for name in args.workloads.split(",")]
    report = {"command": "python -m benchmarks.prefix_cache " + " ".join(sys.argv[1:] if argv is None else argv),
              "modes": {}}
    for label, enabled in (("cache_on", True), ("cache_off", False)):
        config = dataclasses.replace(base, cache=dataclasses.replace(base.cache, enable_prefix_caching=enabled))
        run = run_bench(config, ["fixed_shape"], workloads)
        report["modes"][label] = run["modes"]["fixed_shape"]
        report.setdefault("engine", run["engine"])
        report.setdefault("hardware", run["hardware"])
        report.setdefault("torch", run["torch"])
    report["speedup"] = {name: speedups(report["modes"]["cache_on"][name], report["modes"]["cache_off"][name])
                         for name in report["modes"]["cache_on"]}
    text = json.dumps(report, indent=2, default=str)
    print(json.dumps(report["speedup"], indent=2))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


def speedups(on: dict, off: dict) -> dict:
    """cache_on against cache_off: throughput (the same requests: the inverse ratio of their seconds), TTFT p50, and
    the hit rate."""
    def ratio(a, b):
        return round(a / b, 3) if a is not None and b else None

    return {"throughput_x": ratio(off["seconds"], on["seconds"]), "ttft_p50_x": ratio(on["ttft_s"]["p50"],
                                                                                      off["ttft_s"]["p50"]),
            "hit_rate": on["hit_rate"]}


if __name__ == "__main__":
    sys.exit(main())
