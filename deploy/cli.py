"""The `corun` command: the core's subcommands, the launcher (`serve`) and the capacity planner (`profile`, `plan`)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from corun import cli as core_cli
from corun.config import NodeConfig, RouterConfig
from corun.engine_args import add_engine_args, engine_config_from_args

if TYPE_CHECKING:
    from deploy.launch import ClusterConfig
    from deploy.ray_cluster import RayClusterConfig

RAY_FLAGS = {"ray_address": "address", "placement_strategy": "placement_strategy", "cpus_per_node": "cpus_per_node",
             "prefill_resource": "prefill_resource", "decode_resource": "decode_resource"}
"""--launcher ray flag (argparse dest) -> RayClusterConfig field. NOTE: the flags default to None so that the
defaults live in RayClusterConfig alone."""


def add_serve(commands) -> None:
    cmd = commands.add_parser("serve", help="a cluster: prefill servers, decode servers and the router")
    add_engine_args(cmd)
    cmd.add_argument("--prefill", type=int, default=1, help="number of prefill servers")
    cmd.add_argument("--decode", type=int, default=1, help="number of decode servers")
    cmd.add_argument("--host", default="127.0.0.1", help="the router's interface (and the local nodes')")
    cmd.add_argument("--port", type=int, default=8000)
    cmd.add_argument("--served-model-name", default=RouterConfig.served_model_name)
    cmd.add_argument("--max-pending-requests", type=int, default=RouterConfig.max_pending_requests)
    cmd.add_argument("--kv-lease-seconds", type=float, default=NodeConfig.kv_lease_seconds)
    cmd.add_argument("--launcher", default="local", choices=["local", "ray"],
                     help="local: every process on this host; ray: the nodes on a Ray cluster, the router here")
    ray_flags = cmd.add_argument_group("--launcher ray")
    ray_flags.add_argument("--ray-address", help="'auto', ray://HOST:PORT or HOST:PORT (default: a local Ray head)")
    ray_flags.add_argument("--placement-strategy", choices=["SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK"],
                           help="how the nodes' bundles lie over hosts (default SPREAD)")
    ray_flags.add_argument("--cpus-per-node", type=float, help="CPUs each node reserves (default 1)")
    ray_flags.add_argument("--prefill-resource", help="custom Ray resource the prefill nodes need, e.g. corun_prefill")
    ray_flags.add_argument("--decode-resource", help="custom Ray resource the decode nodes need")
    cmd.set_defaults(run=run_serve)


def run_serve(args) -> int:
    from deploy.launch import ClusterConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s serve %(levelname)s %(message)s")
    config = ClusterConfig(
        engine=engine_config_from_args(args), num_prefill=args.prefill, num_decode=args.decode, host=args.host,
        port=args.port, served_model_name=args.served_model_name, max_pending_requests=args.max_pending_requests,
        kv_lease_seconds=args.kv_lease_seconds)
    if args.launcher == "ray":
        from deploy import ray_cluster

        return ray_cluster.serve_forever(ray_config_from_args(args, config))
    if given := [f"--{dest.replace('_', '-')}" for dest in RAY_FLAGS if getattr(args, dest) is not None]:
        raise ValueError(f"{', '.join(given)}: only with --launcher ray")
    from deploy import local

    return local.serve_forever(config)


def ray_config_from_args(args: argparse.Namespace, cluster: ClusterConfig) -> RayClusterConfig:
    from deploy.ray_cluster import RayClusterConfig

    given = {field: getattr(args, dest) for dest, field in RAY_FLAGS.items() if getattr(args, dest) is not None}
    return RayClusterConfig(cluster=cluster, **given)


def add_plan(commands) -> None:
    cmd = commands.add_parser("plan", help="prefill and decode instances for a workload under TTFT/TPOT targets")
    source = cmd.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", help="performance profile JSON (from --profile-out, or "
                        "benchmarks/derive_h200_profile.py)")
    source.add_argument("--model", help="checkpoint to profile now, on a corun engine built from the flags below")
    workload = cmd.add_mutually_exclusive_group(required=True)
    workload.add_argument("--workload", help="named workload of `corun bench` (1024x128, ..., burstgpt)")
    workload.add_argument("--lengths", help="(input, output) samples: JSON [[in, out], ...] or lines 'in,out'")
    cmd.add_argument("--rate", type=float, required=True, help="arrivals per second (Poisson)")
    cmd.add_argument("--num-samples", type=int, default=2000, help="samples drawn from a named workload")
    cmd.add_argument("--ttft-p99", type=float, required=True, help="TTFT p99 target, seconds")
    cmd.add_argument("--tpot", type=float, required=True, help="TPOT p99 target, milliseconds")
    add_profiling_flags(cmd)
    cmd.add_argument("--max-utilization", type=float, default=0.9, help="busiest a pool may be planned")
    cmd.add_argument("--simulate-requests", type=int, default=20000,
                     help="requests in the simulation that checks the plan (0: no simulation)")
    cmd.add_argument("--seed", type=int, default=0, help="seed of the named workload's samples and the simulation")
    cmd.add_argument("--profile-out", default=None, help="profiling: save the measured profile here")
    cmd.set_defaults(run=run_plan)


def add_profiling_flags(cmd) -> None:
    """The engine a profile is measured on (and, for `plan --profile`, overrides of the profile's config)."""
    cmd.add_argument("--max-num-seqs", type=int, default=None, help="N (default: the profile's; 32 to profile)")
    cmd.add_argument("--max-model-len", type=int, default=None, help="default: the profile's; 1024 to profile")
    cmd.add_argument("--kv-capacity-tokens", type=int, default=None, help="KV tokens per decode instance "
                     "(default: the profile's)")
    cmd.add_argument("--prefill-chunk-size", type=int, default=None, help="default: the profile's; 512 to profile")
    cmd.add_argument("--block-size", type=int, default=None)
    cmd.add_argument("--device", default="cpu", help="profiling: device")
    cmd.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    cmd.add_argument("--num-threads", type=int, default=None)
    cmd.add_argument("--profile-lengths", default=None, help="profiling: prompt lengths, e.g. 64,256,1024")
    cmd.add_argument("--profile-contexts", default=None, help="profiling: decode contexts, e.g. 256,1024")
    cmd.add_argument("--profile-rows", default=None, help="profiling: active decode rows, e.g. 1,16,32")


def add_profile(commands) -> None:
    cmd = commands.add_parser("profile", help="measure a corun engine's prefill and decode-step costs for `plan`")
    cmd.add_argument("--model", required=True, help="checkpoint to profile (or a random: preset)")
    cmd.add_argument("--out", dest="profile_out", required=True, help="where to write the profile JSON")
    add_profiling_flags(cmd)
    cmd.set_defaults(run=run_profile)


def run_plan(args) -> int:
    from deploy.plan_command import run_plan_command

    return run_plan_command(args)


def run_profile(args) -> int:
    from deploy.plan_command import measure_profile

    profile = measure_profile(args)
    print(f"profile of {args.model} written to {args.profile_out} ({len(profile.prefill_points)} prefill points, "
          f"{len(profile.decode_points)} decode points)")
    return 0


def main(argv: list[str] | None = None) -> int:
    return core_cli.main(argv, extra_commands=[add_serve, add_profile, add_plan])


if __name__ == "__main__":
    sys.exit(main())
