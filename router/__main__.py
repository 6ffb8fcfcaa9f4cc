"""`python -m router --model DIR --prefill-address ADDR ... --decode-address ADDR ... --port P`: the HTTP front door.

(`corun serve --prefill N --decode N` counts nodes; here each flag is one node's address.)"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys

from aiohttp import web

from router.app import create_app, create_control_app, start_site
from wire.auth import API_KEY_ENV, resolve_api_key
from wire.config import METRICS_DIR_ENV, RouterConfig

logger = logging.getLogger("router")


def parse_config(argv: list[str] | None = None) -> RouterConfig:
    defaults = {field.name: field.default for field in dataclasses.fields(RouterConfig)}
    parser = argparse.ArgumentParser(prog="python -m router", description="CoRun router (OpenAI-compatible).")
    parser.add_argument("--model", required=True, help="checkpoint directory (tokenizer files, config.json)")
    parser.add_argument("--prefill-address", action="append", default=[], metavar="ADDR",
                        help="prefill node zmq address, e.g. tcp://10.0.0.1:7001 (repeat for more)")
    parser.add_argument("--decode-address", action="append", default=[], metavar="ADDR",
                        help="decode node zmq address (repeat for more)")
    parser.add_argument("--colocated-address", action="append", default=[], metavar="ADDR",
                        help="colocated node zmq address (prefill and decode in one process; repeat for more)")
    parser.add_argument("--host", default=defaults["host"])
    parser.add_argument("--port", type=int, default=defaults["port"])
    parser.add_argument("--served-model-name", default=defaults["served_model_name"])
    parser.add_argument("--max-pending-requests", type=int, default=defaults["max_pending_requests"])
    parser.add_argument("--request-timeout-s", type=float, default=defaults["request_timeout_s"])
    parser.add_argument("--base-seed", type=int, default=defaults["base_seed"])
    parser.add_argument("--strict-fields", action="store_true", help="unknown request fields are a 400 (default: "
                        "ignored with a warning, as vLLM does)")
    parser.add_argument("--api-key", default=None, help=f"clients must send `Authorization: Bearer KEY` (default: "
                        f"${API_KEY_ENV}, which keeps the key out of `ps`; neither: no key)")
    parser.add_argument("--enable-node-pinning", action="store_true", help="honour the X-CoRun-Prefill-Node / "
                        "X-CoRun-Decode-Node headers (a test hook; without this flag they are a 400)")
    parser.add_argument("--cluster-key-file", default=None, help="the cluster's CURVE key pair (the launcher "
                        "makes it): what the nodes admit")
    parser.add_argument("--max-request-bytes", type=int, default=defaults["max_request_bytes"])
    parser.add_argument("--header-timeout-s", type=float, default=defaults["header_timeout_s"])
    parser.add_argument("--body-timeout-s", type=float, default=defaults["body_timeout_s"])
    several = parser.add_argument_group("one of several routers on one port (corun serve --routers K)")
    several.add_argument("--reuse-port", action="store_true", help="listen with SO_REUSEPORT")
    several.add_argument("--control-port", type=int, default=None, help="this process' own port (on --host) for "
                         "/health, /metrics and /admin/nodes; the shared port then refuses /admin/nodes")
    several.add_argument("--instance-name", default="", help="prefix of this router's request ids on the nodes, "
                         "unique in the cluster")
    args = parser.parse_args(argv)
    return RouterConfig(
        model=args.model, prefill_addresses=tuple(args.prefill_address), decode_addresses=tuple(args.decode_address),
        colocated_addresses=tuple(args.colocated_address),
        served_model_name=args.served_model_name, host=args.host, port=args.port,
        max_pending_requests=args.max_pending_requests,
        request_timeout_s=args.request_timeout_s, base_seed=args.base_seed, strict_fields=args.strict_fields,
        api_key=resolve_api_key(args.api_key, os.environ), enable_node_pinning=args.enable_node_pinning,
        max_request_bytes=args.max_request_bytes, header_timeout_s=args.header_timeout_s,
        body_timeout_s=args.body_timeout_s, cluster_key_file=args.cluster_key_file, reuse_port=args.reuse_port,
        control_port=args.control_port, instance_name=args.instance_name,
        # NOTE: prometheus_client switches to multiprocess mode on this variable when imported; read here, once
        metrics_dir=os.environ.get(METRICS_DIR_ENV) or None,
    )


async def serve(app: web.Application, config: RouterConfig) -> None:
    """Serve until SIGTERM or SIGINT, then close connections and node clients (node sockets open on startup,
    inside this loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    runner = await start_site(app, config.host, config.port, config.reuse_port)
    control = None
    try:
        if config.control_port is not None:
            control = await start_site(create_control_app(app), config.host, config.control_port)
        logger.info("router %slistening on http://%s:%d (prefill %s, decode %s, colocated %s)",
                    f"{config.instance_name} " if config.instance_name else "", config.host, config.port,
                    ", ".join(config.prefill_addresses) or "-", ", ".join(config.decode_addresses) or "-",
                    ", ".join(config.colocated_addresses) or "-")
        await stop.wait()
    finally:
        logger.info("router shutting down")
        if control is not None:
            await control.cleanup()
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = parse_config(argv)
        app = create_app(config)
    except (ValueError, FileNotFoundError) as error:
        print(f"python -m router: error: {error}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(app, config))
    except OSError as error:  # NOTE: the port is in use, or the host is not this machine's
        print(f"python -m router: error: {error.strerror or error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
