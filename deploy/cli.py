"""The `corun` command: the core's subcommands plus the launchers."""

from __future__ import annotations

import logging
import sys

from corun import cli as core_cli
from corun.engine_args import add_engine_args, engine_config_from_args


def add_serve(commands) -> None:
    cmd = commands.add_parser("serve", help="a local cluster: prefill servers, decode servers and the router")
    add_engine_args(cmd)
    cmd.add_argument("--prefill", type=int, default=1, help="number of prefill servers")
    cmd.add_argument("--decode", type=int, default=1, help="number of decode servers")
    cmd.add_argument("--host", default="127.0.0.1")
    cmd.add_argument("--port", type=int, default=8000)
    cmd.add_argument("--served-model-name", default="corun-tiny")
    cmd.add_argument("--max-pending-requests", type=int, default=256)
    cmd.add_argument("--kv-lease-seconds", type=float, default=60.0)
    cmd.set_defaults(run=run_serve)


def run_serve(args) -> int:
    from deploy.local import LocalClusterConfig, serve_forever

    logging.basicConfig(level=logging.INFO, format="%(asctime)s serve %(levelname)s %(message)s")
    config = LocalClusterConfig(
        engine=engine_config_from_args(args), num_prefill=args.prefill, num_decode=args.decode, host=args.host,
        port=args.port, served_model_name=args.served_model_name, max_pending_requests=args.max_pending_requests,
        kv_lease_seconds=args.kv_lease_seconds)
    return serve_forever(config)


def main(argv: list[str] | None = None) -> int:
    return core_cli.main(argv, extra_commands=[add_serve])


if __name__ == "__main__":
    sys.exit(main())
