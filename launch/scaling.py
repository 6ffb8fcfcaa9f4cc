"""Scaling a running cluster: the router's /admin/nodes API (router/api/admin.py) as the launchers use it, and
`corun serve`'s control port that `corun scale` talks to.

Imports neither torch nor ray.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request

from launch.cluster import StartupError
from wire.auth import API_KEY_ENV, bearer_headers, is_authorized

logger = logging.getLogger(__name__)


def router_admin(url: str, method: str, body: dict | None = None, api_key: str | None = None) -> dict:
    """One call of the router's /admin/nodes API (router/api/admin.py); ValueError with its message if refused."""
    path = "/admin/nodes/drain" if method == "DRAIN" else "/admin/nodes"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}{path}", data, {"Content-Type": "application/json",
                                                            **bearer_headers(api_key)},
                                     method="POST" if method == "DRAIN" else method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        message = f"the router answered {error.code} to {method} {path}"
        with contextlib.suppress(ValueError, KeyError, TypeError):  # NOTE: a body that is not the router's JSON
            message = json.loads(error.read())["error"]["message"]
        raise ValueError(message) from None


def drain_and_remove(urls: list[str], address: str, timeout_s: float, api_key: str | None = None) -> None:
    """Stop sending the node new requests, wait until it holds nothing, then drop it from the pool: in every
    router (urls: each router's own address), since each one sends the node requests."""
    for url in urls:
        router_admin(url, "DRAIN", {"address": address}, api_key)
    deadline = time.monotonic() + timeout_s
    for url in urls:
        while True:
            entry = next(n for n in router_admin(url, "GET", api_key=api_key)["nodes"] if n["address"] == address)
            if entry["drained"]:
                break
            if time.monotonic() > deadline:
                raise StartupError(f"{address} still holds work after {timeout_s} s of draining")
            time.sleep(0.2)
    for url in urls:
        router_admin(url, "DELETE", {"address": address}, api_key)


class ScaleControl:
    """`corun serve`'s control port (`corun scale`): POST /nodes {"role": ROLE} adds a node, DELETE /nodes/ID
    drains and removes one; with an API key, only for `Authorization: Bearer KEY` (else 401). Commands run on the
    serve loop's thread, between its restarts of dead nodes, so the launcher's state has one writer."""

    def __init__(self, host: str, port: int, api_key: str | None = None):
        self.commands: queue.Queue = queue.Queue()
        control = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                if not self.authorized():
                    return
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    role = json.loads(self.rfile.read(length) or b"{}").get("role")
                except (ValueError, AttributeError):
                    role = None
                if self.path != "/nodes" or role not in ("prefill", "decode", "colocated"):
                    return self.answer(400, {"error": 'POST /nodes with {"role": "prefill" | "decode" | "colocated"}'})
                self.answer(*control.submit("add_node", role))

            def do_DELETE(self):  # noqa: N802
                if not self.authorized():
                    return
                if not self.path.startswith("/nodes/"):
                    return self.answer(400, {"error": "DELETE /nodes/NODE_ID"})
                self.answer(*control.submit("remove_node", self.path.removeprefix("/nodes/")))

            def authorized(self) -> bool:
                if api_key is None or is_authorized(self.headers.get("Authorization"), api_key):
                    return True
                self.answer(401, {"error": "a valid API key is required: send `Authorization: Bearer <key>` "
                                           f"(corun scale: --api-key or ${API_KEY_ENV})"})
                return False

            def answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:  # NOTE: the serve log says what each command did
                pass

        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="scale control", daemon=True)
        self.thread.start()

    def submit(self, command: str, argument: str) -> tuple[int, dict]:
        """From a request thread: run on the serve loop, wait for its answer."""
        done: queue.Queue = queue.Queue(maxsize=1)
        self.commands.put((command, argument, done))
        return done.get()

    def run_pending(self, cluster) -> None:
        while not self.commands.empty():
            command, argument, done = self.commands.get()
            logger.info("scale: %s %s", command, argument)
            try:
                result = getattr(cluster, command)(argument)
                done.put((200, {"node_id": result if command == "add_node" else argument, "done": command}))
            except (ValueError, StartupError) as error:
                logger.warning("scale: %s %s failed: %s", command, argument, error)
                done.put((409, {"error": str(error)}))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
