"""`corun serve`: a cluster of prefill servers, decode servers and the router, on this host or on Ray."""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING

from wire.auth import API_KEY_ENV, resolve_api_key
from wire.config import NodeConfig, RouterConfig
from wire.engine_args import (
    add_engine_args,
    add_transfer_args,
    engine_config_from_args,
    parse_names,
    transfer_config_from_args,
)

if TYPE_CHECKING:
    from launch.cluster import ClusterConfig
    from launch.ray_cluster import RayClusterConfig

RAY_FLAGS = {"ray_address": "address", "placement_strategy": "placement_strategy", "cpus_per_node": "cpus_per_node",
             "gpus_per_node": "gpus_per_node", "prefill_resource": "prefill_resource",
             "decode_resource": "decode_resource"}
"""--launcher ray flag (argparse dest) -> RayClusterConfig field. NOTE: the flags default to None so that the
defaults live in RayClusterConfig alone."""


def add_serve(commands) -> None:
    cmd = commands.add_parser("serve", help="a cluster: prefill servers, decode servers and the router")
    add_engine_args(cmd)
    add_transfer_args(cmd)
    cmd.add_argument("--prefill", type=int, default=1, help="number of prefill servers")
    cmd.add_argument("--decode", type=int, default=1, help="number of decode servers")
    cmd.add_argument("--colocated", type=int, default=0, help="servers that prefill and decode a request in one "
                     "process (the engine's co-run schedule): beside the P/D pools, or alone with --prefill 0 --decode "
                     "0 (one GPU served by one process, no KV hand-off)")
    cmd.add_argument("--routers", type=int, default=1, help="router processes serving --port (SO_REUSEPORT: the "
                     "kernel spreads connections over them), for a front door that one process cannot carry")
    cmd.add_argument("--host", default="127.0.0.1", help="the router's interface (and the local nodes')")
    cmd.add_argument("--port", type=int, default=8000)
    cmd.add_argument("--admin-port", type=int, default=None, help="control port for `corun scale` (add or remove "
                     "nodes at run time); default: none")
    cmd.add_argument("--served-model-name", default=RouterConfig.served_model_name)
    cmd.add_argument("--max-pending-requests", type=int, default=RouterConfig.max_pending_requests)
    cmd.add_argument("--strict-fields", action="store_true", help="unknown request fields are a 400 (default: "
                     "ignored with a warning, as vLLM does)")
    cmd.add_argument("--api-key", default=None, help="the router and --admin-port need `Authorization: Bearer KEY` "
                     f"(default: ${API_KEY_ENV}, which keeps the key out of `ps`; neither: no key)")
    cmd.add_argument("--enable-node-pinning", action="store_true", help="the router honours X-CoRun-Prefill-Node / "
                     "X-CoRun-Decode-Node (a test hook; without this flag they are a 400)")
    cmd.add_argument("--kv-lease-seconds", type=float, default=NodeConfig.kv_lease_seconds)
    gpus = cmd.add_argument_group("--device cuda")
    gpus.add_argument("--prefill-gpus", type=parse_names, default=(), help="local launcher: each prefill node's GPU "
                      "index, comma-separated (one for all; nodes may share a GPU)")
    gpus.add_argument("--decode-gpus", type=parse_names, default=(), help="local launcher: each decode node's GPU")
    gpus.add_argument("--colocated-gpus", type=parse_names, default=(), help="local launcher: each colocated "
                      "node's GPU")
    gpus.add_argument("--prefill-kv-cache-mib", type=int, default=None, help="each prefill node's KV cache "
                      "(default --kv-cache-mib)")
    gpus.add_argument("--decode-kv-cache-mib", type=int, default=None, help="each decode node's KV cache")
    cmd.add_argument("--launcher", default="local", choices=["local", "ray"],
                     help="local: every process on this host; ray: the nodes on a Ray cluster, the router here")
    ray_flags = cmd.add_argument_group("--launcher ray")
    ray_flags.add_argument("--ray-address", help="'auto', ray://HOST:PORT or HOST:PORT (default: a local Ray head)")
    ray_flags.add_argument("--placement-strategy", choices=["SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK"],
                           help="how the nodes' bundles lie over hosts (default SPREAD)")
    ray_flags.add_argument("--cpus-per-node", type=float, help="CPUs each node reserves (default 1)")
    ray_flags.add_argument("--gpus-per-node", type=float, help="--device cuda: the share of a GPU each node reserves "
                           "(default 1; 0.5: two nodes per GPU)")
    ray_flags.add_argument("--prefill-resource", help="custom Ray resource the prefill nodes need, e.g. corun_prefill")
    ray_flags.add_argument("--decode-resource", help="custom Ray resource the decode nodes need")
    cmd.set_defaults(run=run_serve)


def run_serve(args) -> int:
    from launch.cluster import ClusterConfig, check_model, check_port_free

    logging.basicConfig(level=logging.INFO, format="%(asctime)s serve %(levelname)s %(message)s")
    config = ClusterConfig(
        engine=engine_config_from_args(args), num_prefill=args.prefill, num_decode=args.decode,
        num_colocated=args.colocated, num_routers=args.routers, host=args.host,
        port=args.port, served_model_name=args.served_model_name, max_pending_requests=args.max_pending_requests,
        strict_fields=args.strict_fields, api_key=resolve_api_key(args.api_key, os.environ),
        enable_node_pinning=args.enable_node_pinning,
        kv_lease_seconds=args.kv_lease_seconds, transfer=transfer_config_from_args(args),
        prefill_gpus=args.prefill_gpus, decode_gpus=args.decode_gpus, colocated_gpus=args.colocated_gpus,
        admin_port=args.admin_port,
        prefill_kv_cache_mib=args.prefill_kv_cache_mib, decode_kv_cache_mib=args.decode_kv_cache_mib)
    if args.launcher != "ray" and (given := [f"--{dest.replace('_', '-')}" for dest in RAY_FLAGS
                                             if getattr(args, dest) is not None]):
        raise ValueError(f"{', '.join(given)}: only with --launcher ray")
    if args.launcher == "ray" and config.engine.backend == "vllm":
        raise ValueError("--engine vllm runs with the local launcher (.venv-vllm has no Ray; its placement of vLLM "
                         "nodes was not tried)")
    ray_config = ray_config_from_args(args, config) if args.launcher == "ray" else None
    check_model(config.engine.model)  # NOTE: after the flags, before any process starts
    check_port_free(config.host, config.port)
    if config.admin_port is not None:
        check_port_free(config.host, config.admin_port)
    if ray_config is not None:
        from launch import ray_cluster

        return ray_cluster.serve_forever(ray_config)
    from launch import local

    return local.serve_forever(config)


def ray_config_from_args(args: argparse.Namespace, cluster: ClusterConfig) -> RayClusterConfig:
    from launch.ray_cluster import RayClusterConfig

    given = {field: getattr(args, dest) for dest, field in RAY_FLAGS.items() if getattr(args, dest) is not None}
    return RayClusterConfig(cluster=cluster, **given)
