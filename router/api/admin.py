"""Pool membership at run time, for launchers and operators: add a node, drain one, remove it once drained.

    GET    /admin/nodes                                   every node: role, address, id, health, draining, drained,
                                                          its latest stats
    POST   /admin/nodes        {"role": ROLE, "address": ADDR}    a new node (it takes requests once it answers)
    POST   /admin/nodes/drain  {"address": ADDR}          no new requests; what it holds finishes
                               {"address": ADDR, "draining": false}  back in service (a drain that timed out)
    DELETE /admin/nodes        {"address": ADDR}          forget a drained node (409 while it still holds work)
    POST   /admin/nodes/given_up {"address": ADDR}        the launcher gave up restarting it (it keeps dying at
                                                          start): listed as given_up, /health says "degraded"

With an API key set (RouterConfig.api_key), every call needs it (router/api/auth.py).

Draining loses nothing: requests already on the node finish there, and a prefill node counts as drained only once
every decode node has read the KV it leased.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from router.api.errors import RequestError, bad_request, error_body
from router.api.fields import decode_json
from router.api.handlers import STATE_KEY, read_body
from router.nodes.choice import UnknownNode
from router.nodes.client import NodeClient

ROLES = ("prefill", "decode", "colocated")
MAX_ADMIN_BODY_BYTES = 64 * 2**10
"""A role and an address; far more is not an admin request."""


def add_admin_routes(app: web.Application) -> None:
    app.router.add_get("/admin/nodes", list_nodes)
    app.router.add_post("/admin/nodes", add_node)
    app.router.add_post("/admin/nodes/drain", drain_node)
    app.router.add_post("/admin/nodes/given_up", give_up_node)
    app.router.add_delete("/admin/nodes", remove_node)


def node_entry(node: NodeClient) -> dict:
    status = node.status()
    return {"role": node.role, "index": node.index, "address": node.address,
            "node_id": status.pong.node_id if status.pong else None, "healthy": status.healthy,
            "draining": node.draining, "drained": node.is_drained(), "given_up": node.given_up,
            "outstanding_work": node.outstanding_work,
            "open_requests": node.num_open_requests, "stats": status.pong.stats if status.pong else {},
            "capacity": None if node.capacity is None else msgspec.structs.asdict(node.capacity)}


async def list_nodes(request: web.Request) -> web.Response:
    return web.json_response({"nodes": [node_entry(node) for node in request.app[STATE_KEY].pool.nodes]})


async def add_node(request: web.Request) -> web.Response:
    body = await json_body(request, ("role", "address"))
    if body["role"] not in ROLES:
        return refusal(400, f"role must be one of {', '.join(ROLES)}, got {body['role']!r}")
    if not str(body["address"]).startswith("tcp://"):
        return refusal(400, f"address must be tcp://HOST:PORT, got {body['address']!r}")
    try:
        node = request.app[STATE_KEY].pool.add(body["role"], body["address"])
    except ValueError as error:
        return refusal(409, str(error))
    return web.json_response(node_entry(node), status=201)


async def drain_node(request: web.Request) -> web.Response:
    body = await json_body(request, ("address",))
    pool = request.app[STATE_KEY].pool
    try:
        node = pool.find(body["address"])
    except UnknownNode as error:
        return refusal(404, str(error))
    draining = body.get("draining", True)
    if not isinstance(draining, bool):
        return refusal(400, f"draining must be true or false, got {draining!r}")
    siblings = pool.by_role[node.role]
    if draining and all(other.draining or other is node for other in siblings):
        return refusal(409, f"{node.address} is the last {node.role} node that takes requests")
    node.draining = draining
    return web.json_response(node_entry(node))


async def give_up_node(request: web.Request) -> web.Response:
    body = await json_body(request, ("address",))
    try:
        node = request.app[STATE_KEY].pool.find(body["address"])
    except UnknownNode as error:
        return refusal(404, str(error))
    node.given_up = True
    return web.json_response(node_entry(node))


async def remove_node(request: web.Request) -> web.Response:
    body = await json_body(request, ("address",))
    try:
        await request.app[STATE_KEY].pool.remove(body["address"])
    except UnknownNode as error:
        return refusal(404, str(error))
    except ValueError as error:
        return refusal(409, str(error))
    return web.json_response({"removed": body["address"]})


async def json_body(request: web.Request, fields: tuple[str, ...]) -> dict:
    raw = await read_body(request)
    if len(raw) > MAX_ADMIN_BODY_BYTES:
        raise RequestError(413, f"an admin request body is at most {MAX_ADMIN_BODY_BYTES} bytes")
    body = decode_json(raw)  # NOTE: on the loop: a body this small decodes in well under a millisecond
    if not isinstance(body, dict) or any(name not in body for name in fields):
        raise bad_request(f"the body must be a JSON object with {', '.join(fields)}")
    return body


def refusal(status: int, message: str) -> web.Response:
    return web.json_response(error_body(status, message), status=status)
