"""`corun serve`: a cluster of prefill servers, decode servers and the router, on this host or on Ray.

Its flags are ClusterConfig's fields (the engine's, the routers' and the nodes' settings included) and, for
--launcher ray, RayClusterConfig's: wire/flags.py generates them, so that a field added to one of those configs
is a flag here with no line written in this module.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping

from launch.cluster import ClusterConfig
from launch.ray_config import RayClusterConfig
from wire.flags import add_flags, config_from_args

SERVE_EXAMPLES = """\
The OpenAI API of a local cluster, until Ctrl-C. For example:
  corun serve --model models/tiny --prefill 1 --decode 1 --port 8000   a prefill and a decode node (the README's)
  corun serve --model DIR --device cuda --prefill 0 --decode 0 --colocated 1   one GPU: a colocated node
  corun serve --model DIR --device cuda --prefill 1 --decode 3 --prefill-gpus 0 --decode-gpus 1,2,3
                                                                        P/D over four GPUs
Every flag below; README.md says which deployment to pick when."""


def add_serve(commands) -> None:
    cmd = commands.add_parser(
        "serve", help="a cluster: prefill servers, decode servers and the router",
        usage="corun serve --model DIR [--prefill P --decode D | --colocated K] [--port PORT] [options]",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=SERVE_EXAMPLES)
    add_flags(cmd, ClusterConfig)
    cmd.add_argument("--launcher", default="local", choices=["local", "ray"],
                     help="local: every process on this host; ray: the nodes on a Ray cluster, the router here")
    # NOTE: only_given: a flag not given has no attribute, so that a Ray flag without --launcher ray is refused and
    # the defaults stay RayClusterConfig's alone
    cmd.set_defaults(run=run_serve, ray_flags=add_flags(cmd.add_argument_group("--launcher ray"), RayClusterConfig,
                                                        exclude=("cluster",), only_given=True))


def cluster_config_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> ClusterConfig:
    """environ: where the API key comes from when --api-key is not given (VLLM_API_KEY)."""
    return config_from_args(ClusterConfig, args, environ)


def run_serve(args) -> int:
    from launch.cluster import check_model, check_port_free

    logging.basicConfig(level=logging.INFO, format="%(asctime)s serve %(levelname)s %(message)s")
    config = cluster_config_from_args(args, os.environ)
    if args.launcher != "ray" and (given := [flag.option for flag in args.ray_flags if hasattr(args, flag.dest)]):
        raise ValueError(f"{', '.join(given)}: only with --launcher ray")
    if args.launcher == "ray" and config.engine.backend == "vllm":
        raise ValueError("--engine vllm runs with the local launcher (.venv-vllm has no Ray; its placement of vLLM "
                         "nodes was not tried)")
    ray_config = ray_config_from_args(args, config) if args.launcher == "ray" else None
    check_model(config.engine)  # NOTE: after the flags, before any process starts
    check_port_free(config.host, config.port)
    if config.admin_port is not None:
        check_port_free(config.host, config.admin_port)
    if ray_config is not None:
        from launch import ray_cluster

        return ray_cluster.serve_forever(ray_config)
    from launch import local

    return local.serve_forever(config)


def ray_config_from_args(args: argparse.Namespace, cluster: ClusterConfig) -> RayClusterConfig:
    return config_from_args(RayClusterConfig, args, cluster=cluster)
