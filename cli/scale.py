"""`corun scale`: add or remove a node of a running `corun serve` (started with --admin-port)."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

from launch.cluster import STARTUP_TIMEOUT_S
from launch.removals import FINAL_STATES, POLL_S
from wire.auth import API_KEY_ENV, bearer_headers, check_api_key, resolve_api_key

CALL_TIMEOUT_S = 120.0
"""One call of the control port (adding a node starts its process: seconds)."""


def add_scale(commands) -> None:
    cmd = commands.add_parser("scale", help="add a node to a running cluster, or drain one and stop it")
    cmd.add_argument("--control", required=True, help="corun serve's control URL, e.g. http://127.0.0.1:8001 "
                     "(its --admin-port)")
    cmd.add_argument("--api-key", default=None, help=f"corun serve's --api-key (default: ${API_KEY_ENV})")
    action = cmd.add_subparsers(dest="action", required=True)
    add = action.add_parser("add", help="start one more node of a role and add it to the router's pool")
    add.add_argument("role", choices=["prefill", "decode", "colocated"], help="the new node's role")
    add.add_argument("--no-wait", action="store_true", help="return once the node is started and in the routers' "
                     "pools, before it answers (by default: once every router has it answering, so that it takes "
                     "requests)")
    add.add_argument("--timeout-s", type=float, default=STARTUP_TIMEOUT_S,
                     help="how long to wait for the added node to answer (its model load)")
    remove = action.add_parser("remove", help="drain a node (no new requests; what it holds finishes), then stop it")
    remove.add_argument("node_id", help="e.g. decode-1")
    cmd.set_defaults(run=run_scale)


def run_scale(args) -> int:
    url = args.control.rstrip("/")
    api_key = resolve_api_key(args.api_key, os.environ)
    check_api_key(api_key)
    headers = bearer_headers(api_key)
    if args.action == "add":
        added = call(url, urllib.request.Request(f"{url}/nodes", json.dumps({"role": args.role}).encode(),
                                                 {"Content-Type": "application/json", **headers}, method="POST"))
        node_id = added["node_id"]
        if args.no_wait:
            print(node_id, "started")
            return 0
        wait_until_serving(url, headers, node_id, args.timeout_s)
        print(node_id, "added")
        return 0
    removal = call(url, urllib.request.Request(f"{url}/nodes/{args.node_id}", headers=headers, method="DELETE"))
    # NOTE: the drain runs in corun serve (its drain_timeout_s ends it); this only watches it
    while removal["state"] not in FINAL_STATES:
        time.sleep(POLL_S)
        removal = call(url, urllib.request.Request(f"{url}/nodes/{args.node_id}", headers=headers))
    if removal["state"] != "removed":
        raise ValueError(f"{args.node_id} not removed: {removal['message']}")
    print(args.node_id, "removed")
    return 0


def wait_until_serving(url: str, headers: dict, node_id: str, timeout_s: float) -> None:
    """Until every router has the added node answering. NOTE: until then it takes no requests: a removal of the
    role's other node (add, then remove) would leave nothing serving."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            state, why = call(url, urllib.request.Request(f"{url}/nodes/{node_id}", headers=headers))["state"], ""
        except ValueError as error:  # NOTE: a router being restarted, say: asked again until the timeout
            state, why = "starting", f" (its state could not be read: {error})"
        if state == "serving":
            return
        if state != "starting":
            raise ValueError(f"{node_id} was started but is {state}: see corun serve's log")
        if time.monotonic() >= deadline:
            raise ValueError(f"{node_id} was started but did not answer within {timeout_s:g} s{why}; it stays in "
                             "the pool and takes requests once it answers")
        time.sleep(POLL_S)


def call(url: str, request: urllib.request.Request) -> dict:
    try:
        with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise ValueError(json.loads(error.read()).get("error", f"HTTP {error.code}")) from None
    except (urllib.error.URLError, TimeoutError) as error:
        raise ValueError(f"cannot reach corun serve's control port at {url}: "
                         f"{getattr(error, 'reason', error)}") from None
