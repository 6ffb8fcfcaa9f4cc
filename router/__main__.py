"""`python -m router --model DIR --prefill-address ADDR ... --decode-address ADDR ... --port P`: the HTTP front door.

(`corun serve --prefill N --decode N` counts nodes; here each flag is one node's address.)"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping

from aiohttp import web

from router.api.handlers import STATE_KEY
from router.app import create_app, create_control_app, start_site
from wire.config import RouterConfig
from wire.flags import add_flags, config_from_args
from wire.gc_heap import freeze_startup_heap, spread_full_collections
from wire.supervision import end_with_supervisor

logger = logging.getLogger("router")


def parse_config(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> RouterConfig:
    """The RouterConfig of the flags (one per field) and of environ (os.environ by default): the API key's
    VLLM_API_KEY, which keeps it out of `ps`, and PROMETHEUS_MULTIPROC_DIR, which prometheus_client reads when it
    is imported."""
    parser = argparse.ArgumentParser(prog="python -m router", description="CoRun router (OpenAI-compatible).")
    add_flags(parser, RouterConfig)
    # NOTE: the environment is read here, at the process' boundary, and nowhere deeper
    return config_from_args(RouterConfig, parser.parse_args(argv), os.environ if environ is None else environ)


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
        freeze_startup_heap()
        spread_full_collections()
        app[STATE_KEY].metrics.collection_pauses.start()
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
        if config.supervisor_pid is not None:
            end_with_supervisor(config.supervisor_pid)
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
