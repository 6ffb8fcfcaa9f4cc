"""POST /reset_prefix_cache (vLLM's): every prefill and colocated node forgets its cached prompt chunks.

The router holds no KV: it asks the nodes over the protocol (ResetPrefixCache) and answers 200 once every node
did, 503 naming those that did not answer in time. Outputs never change: a reset only makes the next prompts
prefill their chunks again, to the same bits.
"""

from __future__ import annotations

from aiohttp import web

from router.api.errors import error_body
from router.api.handlers import STATE_KEY

RESET_TIMEOUT_S = 10.0
"""How long a node may take to answer (it answers between two forwards: a long prefill delays it)."""


def add_prefix_cache_routes(app: web.Application) -> None:
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)


async def reset_prefix_cache(request: web.Request) -> web.Response:
    answers = await request.app[STATE_KEY].pool.reset_prefix_caches(RESET_TIMEOUT_S)
    silent = [node.name for node, answer in answers.items() if answer is None]
    if silent:
        return web.json_response(error_body(503, f"no answer within {RESET_TIMEOUT_S:g} s from: "
                                                 f"{', '.join(silent)}"), status=503)
    freed = {answer.node_id: answer.num_blocks_freed for answer in answers.values()}
    return web.json_response({"nodes": freed})
