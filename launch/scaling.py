"""Scaling a running cluster: the router's /admin/nodes API (router/api/admin.py) as the launchers use it, and
`corun serve`'s control port that `corun scale` talks to.

Imports neither torch nor ray.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import queue
import urllib.error
import urllib.request

from launch.cluster import ClusterConfig, StartupError
from launch.control_port import Answer, ControlServer
from wire.auth import bearer_headers

logger = logging.getLogger(__name__)

ADMIN_PATHS = {"DRAIN": "/admin/nodes/drain", "GIVE_UP": "/admin/nodes/given_up"}
"""router_admin's own methods: POSTs to these paths."""


def router_admin(url: str, method: str, body: dict | None = None, api_key: str | None = None) -> dict:
    """One call of the router's /admin/nodes API (router/api/admin.py): GET, POST, DELETE, or DRAIN and GIVE_UP
    (POSTs to /admin/nodes/drain and /admin/nodes/given_up); ValueError with its message if refused."""
    path = ADMIN_PATHS.get(method, "/admin/nodes")
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}{path}", data, {"Content-Type": "application/json",
                                                            **bearer_headers(api_key)},
                                     method="POST" if method in ADMIN_PATHS else method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        message = f"the router answered {error.code} to {method} {path}"
        with contextlib.suppress(ValueError, KeyError, TypeError):  # NOTE: a body that is not the router's JSON
            message = json.loads(error.read())["error"]["message"]
        raise ValueError(message) from None


class ScaleControl:
    """`corun serve`'s control port (`corun scale`), with an API key only for `Authorization: Bearer KEY` (else
    401):

        POST   /nodes     {"role": ROLE}   add a node; 200 {"node_id"} once it is started and in every router
        DELETE /nodes/ID                   begin its removal; 202 {"node_id", "state": "draining"} (409: refused)
        GET    /nodes/ID                   its state: {"node_id", "state", "message"}: its latest removal's, one of
                                           launch/removals.py's (removed, or returned to service: final), else
                                           starting, serving (every router has it answering) or given_up

    Commands run on the serve loop's thread, between its restarts of dead nodes, so the launcher's state has one
    writer; a drain then waits in a thread of its own (launch/removals.py), never on that loop. The port itself
    is launch/control_port.py: bounded connections, timeouts, the key checked before anything else."""

    def __init__(self, config: ClusterConfig):
        self.commands: queue.Queue = queue.Queue()
        self.server = ControlServer(config.host, config.admin_port, config.api_key, self.handle,
                                    config.admin_max_connections, config.admin_timeout_s)

    async def handle(self, method: str, path: str, body: bytes) -> Answer:
        node_id = path.removeprefix("/nodes/") if path.startswith("/nodes/") else None
        if method == "POST" and path == "/nodes":
            role = json_field(body, "role")
            if role not in ("prefill", "decode", "colocated"):
                return 400, {"error": 'POST /nodes with {"role": "prefill" | "decode" | "colocated"}'}
            return await self.submit("add_node", role)
        if method in ("DELETE", "GET") and node_id:
            return await self.submit("begin_removal" if method == "DELETE" else "node_state", node_id)
        return 404, {"error": "POST /nodes, DELETE /nodes/NODE_ID or GET /nodes/NODE_ID"}

    async def submit(self, command: str, argument: str) -> Answer:
        """From the control port's loop: run on the serve loop, wait for its answer."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self.commands.put((command, argument, done))
        return await asyncio.wrap_future(done)

    def run_pending(self, cluster) -> None:
        while not self.commands.empty():
            command, argument, done = self.commands.get()
            if command != "node_state":  # NOTE: polled (corun scale add, corun scale remove): not logged
                logger.info("scale: %s %s", command, argument)
            done.set_result(run_command(cluster, command, argument))

    def close(self) -> None:
        self.server.close()
        while not self.commands.empty():  # NOTE: the serve loop is stopping: nobody will run them
            self.commands.get()[2].set_result((503, {"error": "corun serve is stopping"}))


def run_command(cluster, command: str, argument: str) -> Answer:
    try:
        if command == "add_node":
            return 200, {"node_id": cluster.add_node(argument), "done": command}
        if command == "begin_removal":
            return 202, cluster.begin_removal(argument).answer()
        return node_state(cluster, argument)
    except (ValueError, StartupError, OSError) as error:  # NOTE: OSError: a router or a process did not answer
        logger.warning("scale: %s %s failed: %s", command, argument, error)
        return 409, {"error": str(error)}


def node_state(cluster, node_id: str) -> Answer:
    """GET /nodes/ID (ScaleControl)."""
    removal = cluster.removals.by_node_id.get(node_id)
    if removal is not None:
        return 200, removal.answer()
    address = cluster.node_address(node_id)
    if address is None:
        return 404, {"error": f"no node {node_id!r}"}
    return 200, {"node_id": node_id, "state": cluster.routers.node_state(address), "message": ""}


def json_field(body: bytes, name: str):
    try:
        return json.loads(body or b"{}").get(name)
    except (ValueError, AttributeError):
        return None
