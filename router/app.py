"""The router's aiohttp application: routes, error/metrics middleware, node pool lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from aiohttp import web

from router.api.admin import add_admin_routes
from router.api.auth import api_key_middleware, load_api_keys
from router.api.clients import ClientLimits
from router.api.errors import RequestError, error_body
from router.api.handlers import RESPONSE_HEADERS_KEY, STATE_KEY, chat_completions, completions
from router.api.offload import Offload
from router.api.prefix_cache import add_prefix_cache_routes
from router.api.state import Admission, RouterState
from router.api.tokens import add_token_routes
from router.generation.pipeline import GenerationError
from router.loop_errors import HTTP_LOGGER, install_loop_error_log
from router.metrics import REFRESH_S as METRICS_REFRESH_S
from router.metrics import RouterMetrics
from router.nodes.client import NodeStatus
from router.nodes.pool import NodePool, PoolMismatch
from wire.config import RouterConfig
from wire.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

MAX_HEADER_LINE_BYTES = 8190
"""The request line and each header: longer is a 400 (aiohttp's defaults, named here so that no upgrade loosens
them)."""
MAX_HEADERS = 128
LINGER_S = 2.0
"""After an early answer (413, 408), what still arrives of the body is read and dropped this long, so that the
client sees the answer rather than a reset; then the connection closes (aiohttp's lingering_time; its default,
10 s, would keep a trickling client that much longer)."""
CLIENT_GONE_STATUS = 499
"""What /metrics counts a request whose client hung up before its answer as (nginx's code; never sent)."""
SHUTDOWN_GRACE_S = 5.0
"""On shutdown, requests in flight get this long to finish before they are cancelled (and their decodes aborted)."""


def create_app(config: RouterConfig) -> web.Application:
    """The router app; its node clients and ping loop start with the app and close with it."""
    app = new_application(config)
    app[STATE_KEY] = build_state(config)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    if config.control_port is None:
        add_admin_routes(app)
    else:
        app.router.add_route("*", "/admin/{path:.*}", admin_elsewhere)
    add_token_routes(app)
    add_prefix_cache_routes(app)
    app.on_startup.append(start_pool)
    app.on_shutdown.append(begin_closing)
    app.on_cleanup.append(close_pool)
    return app


def new_application(config: RouterConfig) -> web.Application:
    """An application with the router's middlewares and body limit, no routes yet."""
    # NOTE: the key check runs inside the error middleware, so that a 401 is an OpenAI error and is counted.
    keys = load_api_keys(config)
    middlewares = [error_and_metrics_middleware] + ([api_key_middleware(keys)] if keys else [])
    # NOTE: aiohttp refuses a body of exactly client_max_size bytes; max_request_bytes is the largest accepted.
    return web.Application(middlewares=middlewares, client_max_size=config.max_request_bytes + 1)


def create_control_app(app: web.Application) -> web.Application:
    """What one of several routers answers on its own control port (RouterConfig.control_port): its view of the
    nodes (/health), its own series (/metrics) and the pool's admin API, for the launcher that starts the routers
    and must reach each one. Shares app's state; app's startup and cleanup run the pool."""
    control = new_application(app[STATE_KEY].config)
    control[STATE_KEY] = app[STATE_KEY]
    control.router.add_get("/health", health)
    control.router.add_get("/metrics", own_metrics)
    add_admin_routes(control)
    return control


def build_state(config: RouterConfig) -> RouterState:
    """NOTE: what requests are validated against (max_model_len, vocab size, max logprobs) comes from the
    nodes' Pongs (RouterState.model_info), not from copies of their settings here."""
    pool = NodePool(config)
    admission = Admission(config.max_pending_requests)
    tokenizer = load_tokenizer(config.model)
    metrics = RouterMetrics(pool.statuses, lambda: admission.in_flight, config.metrics_dir,
                            config.served_model_name)
    offload = Offload(config.model, tokenizer, config.parse_timeout_s)
    return RouterState(config, tokenizer, pool, admission, metrics, offload, ClientLimits(config))


async def start_site(app: web.Application, host: str, port: int, reuse_port: bool = False) -> web.AppRunner:
    """Serve app on host:port (port 0: any free one, see runner.addresses); returns the runner to clean up.
    reuse_port: SO_REUSEPORT, so that other router processes may serve the same port."""
    # NOTE: handler_cancellation: a client that hangs up cancels its handler, which aborts its decode.
    # keepalive_timeout: aiohttp closes a connection whose request headers are not complete when it fires (it
    # runs from the connection's start and from each response), which bounds a slowloris' header read.
    # logger: aiohttp's, but a malformed request is one line, not a traceback (router/loop_errors.py)
    install_loop_error_log(asyncio.get_running_loop())
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S,
                           keepalive_timeout=app[STATE_KEY].config.header_timeout_s,
                           max_line_size=MAX_HEADER_LINE_BYTES, max_field_size=MAX_HEADER_LINE_BYTES,
                           max_headers=MAX_HEADERS, lingering_time=LINGER_S, logger=HTTP_LOGGER)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_port=reuse_port or None,
                      backlog=app[STATE_KEY].config.listen_backlog).start()
    return runner


REFRESH_TASK_KEY = web.AppKey("corun_metrics_refresh", asyncio.Task)


async def start_pool(app: web.Application) -> None:
    await app[STATE_KEY].pool.start()
    if app[STATE_KEY].metrics.multiprocess_dir is not None:
        app[REFRESH_TASK_KEY] = asyncio.create_task(refresh_metrics(app[STATE_KEY].metrics), name="metrics refresh")


async def begin_closing(app: web.Application) -> None:
    """NOTE: aiohttp runs on_shutdown once the listening sockets are closed and before it waits for the open
    requests (AppRunner.cleanup): those then end at their first failure."""
    app[STATE_KEY].pool.begin_closing()


async def refresh_metrics(metrics: RouterMetrics) -> None:
    while True:
        metrics.refresh()
        await asyncio.sleep(METRICS_REFRESH_S)


async def close_pool(app: web.Application) -> None:
    if REFRESH_TASK_KEY in app:
        app[REFRESH_TASK_KEY].cancel()
    await app[STATE_KEY].pool.close()
    app[STATE_KEY].offload.close()


@web.middleware
async def error_and_metrics_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Every failure becomes an OpenAI-shaped JSON error; every answer is counted by endpoint and status."""
    try:
        response = await handler(request)
    except RequestError as error:
        response = error_response(error.status, error.message, error.param, error.headers)
    except GenerationError as error:
        logger.warning("%s %s failed: %s", request.method, request.path, error.message)
        response = error_response(error.status, error.message)
    except web.HTTPException as error:
        response = error_response(error.status, error.reason)
    except asyncio.CancelledError:
        raise
    except ConnectionResetError:
        # NOTE: the client hung up (mid-body, mid-parse): nothing to answer, and not the router's fault
        logger.info("%s %s: the client went away", request.method, request.path)
        response = error_response(CLIENT_GONE_STATUS, "the client closed the connection")
    except Exception:
        logger.exception("internal error on %s %s", request.method, request.path)
        response = error_response(500, "internal server error")
    if not response.prepared:
        response.headers.update(request.get(RESPONSE_HEADERS_KEY, {}))
    request.app[STATE_KEY].metrics.requests.labels(endpoint_label(request), str(response.status)).inc()
    return response


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(status, message, param), status=status, headers=headers)


def endpoint_label(request: web.Request) -> str:
    # NOTE: the route's path, never the raw one: random URLs must not grow the label set without bound.
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "other"


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    model = {"id": state.config.served_model_name, "object": "model", "created": int(time.time()),
             "owned_by": "corun", "root": state.config.model}
    with contextlib.suppress(PoolMismatch):
        facts = state.pool.model_facts()  # NOTE: listed once a node has told it; the list never waits for nodes
        if facts is not None:
            model["max_model_len"] = facts.max_model_len
    return web.json_response({"object": "list", "data": [model]})


async def health(request: web.Request) -> web.Response:
    """Whether the cluster can serve, for a load balancer's probe: 200 "ok" when every node answered a ping in
    the last few seconds; 200 "degraded" when some did not (dead, restarting, or given up by the launcher: GET
    /admin/nodes says which) but the healthy ones still take every request (a prefill and a decode node, or a
    colocated one, not draining); 503 "unavailable" when they cannot, or when the nodes disagree on the model
    (with the field they disagree on). Lists the nodes either way.

    NOTE: open to anyone (as vLLM's), so it tells health only: no addresses, no stats (GET /admin/nodes, which
    needs the API key, has those)."""
    pool = request.app[STATE_KEY].pool
    statuses = pool.statuses()
    body = {"status": health_status(statuses), "nodes": [node_health(s) for s in statuses]}
    try:
        pool.model_facts()
    except PoolMismatch as error:
        body["error"], body["status"] = str(error), "unavailable"
    return web.json_response(body, status=503 if body["status"] == "unavailable" else 200)


def health_status(statuses: list[NodeStatus]) -> str:
    """ok, degraded or unavailable (see health)."""
    if statuses and all(s.healthy for s in statuses):
        return "ok"
    serving = {s.role for s in statuses if s.healthy and not s.draining}
    return "degraded" if {"prefill", "decode"} <= serving or "colocated" in serving else "unavailable"


def node_health(status: NodeStatus) -> dict:
    """node_id: None until the node first answered."""
    return {"node_id": status.pong.node_id if status.pong else None, "role": status.role, "healthy": status.healthy}


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    await state.pool.refresh_stats(METRICS_FRESH_STATS_WAIT_S)
    return metrics_response(state.metrics.render())


METRICS_FRESH_STATS_WAIT_S = 0.5
"""How long /metrics waits for the nodes' fresh Pongs (a node that does not answer by then is reported as of its
latest one)."""


async def own_metrics(request: web.Request) -> web.Response:
    return metrics_response(request.app[STATE_KEY].metrics.render_own())


def metrics_response(body: bytes) -> web.Response:
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def admin_elsewhere(request: web.Request) -> web.Response:
    """One of several routers on this port: a pool change made here would reach only the router that took the
    connection."""
    return error_response(409, "this router is one of several serving this port: change the pool through `corun "
                          "scale` (corun serve --admin-port), which tells every router")
