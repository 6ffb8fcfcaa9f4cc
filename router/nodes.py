"""Connections to prefill, decode and colocated nodes: one zmq DEALER per node, replies demultiplexed by request id.

Instance choice is least outstanding work (prefill: prompt tokens not yet answered; decode and colocated: samples
not yet finished), ties to the lowest index. Nodes that answered a recent ping are preferred over silent ones;
draining nodes get no new requests. A request goes to the least loaded colocated node unless a decode node has
less outstanding work (choose_path).

Membership changes at run time (router/admin.py): a node is added, drained (no new requests; what it holds
finishes), and removed once drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import zmq
import zmq.asyncio
import zmq.utils.monitor

from wire.config import Role, RouterConfig
from wire.node_auth import ClusterKey
from wire.protocol import ErrorReply, ModelFacts, Ping, Pong, ProtocolError, StepTokens, decode, encode

logger = logging.getLogger(__name__)

PING_INTERVAL_S = 1.0
FIRST_PING_INTERVAL_S = 0.1
"""Until every node has answered once (connections come up asynchronously), ping faster: /health turns 200
within a fraction of a second of the nodes being up."""
HEALTHY_WITHIN_S = 3.0
"""A node is healthy when it is connected and its latest Pong is at most this old (three missed pings make a busy
or hung node unhealthy; a dead one is known at once, by its connection)."""
HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS = 200, 800
"""zmq heartbeats, answered by the node's zmq I/O thread even while its loop runs a long forward: a host or link
that is gone closes the connection within a second (a killed process closes it at once)."""


@dataclass(frozen=True)
class NodeStatus:
    """What /health and /metrics report about one node."""

    index: int
    role: Role
    address: str
    healthy: bool
    draining: bool
    pong: Pong | None
    """The latest Pong (node id, fingerprint, stats), None before the first one."""
    seconds_since_pong: float | None


UNHEALTHY_WAIT_S = 0.5
"""A request waiting this long on a node that stopped answering pings fails over (it may be gone)."""
WATCH_INTERVAL_S = 0.1
"""How often a node's watchdog looks at the requests waiting on it: a silence ends at most this late."""


class ReplyQueue(asyncio.Queue):
    """A request's replies from its node, in arrival order.

    A consumer waits with next_within(timeout_s); the node's watchdog (NodeClient._watch_loop) ends a wait that
    outlived its timeout, or that waits on an unhealthy node, with SILENT. NOTE: one watchdog per node rather than a
    timer per wait: a timer per streamed token cost the router more than the token's own bookkeeping."""

    def __init__(self):
        super().__init__()
        self.waiting_since: float | None = None
        self.deadline = 0.0

    def peek(self):
        """The next reply without taking it (the queue is not empty)."""
        return self._queue[0]

    async def next_within(self, timeout_s: float):
        """The next reply, or SILENT when none came within timeout_s (or the node stopped answering while the
        wait lasted UNHEALTHY_WAIT_S)."""
        while not self.empty():
            reply = self.get_nowait()
            if reply is not SILENT:  # NOTE: a SILENT found queued came after a reply that ended its wait: stale
                return reply
        now = asyncio.get_running_loop().time()
        self.waiting_since, self.deadline = now, now + timeout_s
        try:
            return await self.get()
        finally:
            self.waiting_since = None

    def end_wait_if_silent(self, now: float, node_healthy: bool) -> None:
        if self.waiting_since is not None and (
                now >= self.deadline or (not node_healthy and now - self.waiting_since >= UNHEALTHY_WAIT_S)):
            self.waiting_since = None
            self.put_nowait(SILENT)


SILENT = object()
"""What ReplyQueue.next_within returns when the wait ended without a reply."""


class NodeClient:
    """One node: a DEALER socket, a receive loop routing replies to per-request queues, and a work count."""

    def __init__(self, context: zmq.asyncio.Context, role: Role, index: int, address: str,
                 key: ClusterKey | None = None):
        self.role, self.index, self.address = role, index, address
        self.key = key
        self.outstanding_work = 0
        self.draining = False
        """No new requests: it is being removed (router/admin.py)."""
        self._context = context
        self._socket: zmq.asyncio.Socket | None = None
        self._request_queues: dict[str, ReplyQueue] = {}
        self._latest_pong: Pong | None = None
        self._latest_pong_time: float | None = None
        self._connected = False
        self._receive_task: asyncio.Task | None = None
        self._monitor_task: asyncio.Task | None = None
        self._watch_task: asyncio.Task | None = None
        self.num_lost = 0
        """Times the node was lost (its connection closed, or a Pong came from another instance)."""

    def start(self) -> None:
        """Connect and start receiving; call from the event loop that will use the client."""
        self._socket = self._context.socket(zmq.DEALER)
        # NOTE: linger 0: closing never waits for a dead node. IMMEDIATE: messages queue only on a live
        # connection, so a request sent while a node is down waits (and times out) instead of reaching the
        # node minutes later, after its client has given up.
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.IMMEDIATE, 1)
        # NOTE: never a limit on what a node's replies may queue here: the node's ROUTER socket would drop tokens
        # past it (node_core/serving.py, NodeSockets)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        self._socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        if self.key is not None:
            self.key.connect(self._socket)
        monitor = self._socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self._socket.connect(self.address)
        self._receive_task = asyncio.create_task(self._receive_loop(), name=f"receive {self.address}")
        self._monitor_task = asyncio.create_task(self._monitor_loop(monitor), name=f"monitor {self.address}")
        self._watch_task = asyncio.create_task(self._watch_loop(), name=f"watch {self.address}")

    async def close(self) -> None:
        for task in (self._receive_task, self._monitor_task, self._watch_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._socket is not None:
            self._socket.disable_monitor()
            self._socket.close()

    async def send(self, message) -> None:
        """Send, waiting while the node is unreachable (callers bound the wait)."""
        await self._socket.send(encode(message))

    def post(self, message) -> None:
        """Send without waiting (pings, aborts; usable in `finally` of a cancelled task); dropped if the node
        cannot take it now."""
        self._socket.send(encode(message), flags=zmq.NOBLOCK).add_done_callback(self._log_if_dropped)

    def _log_if_dropped(self, future: asyncio.Future) -> None:
        if not future.cancelled() and future.exception() is not None:
            logger.debug("dropped a message to %s: %s", self.address, future.exception())

    @contextlib.contextmanager
    def open_request(self, request_id: str, work: int) -> Iterator[ReplyQueue]:
        """Route this request's replies to a fresh queue and count its work until the block ends."""
        if request_id in self._request_queues:
            raise ValueError(f"request id {request_id!r} is already in flight on {self.address}")
        queue = ReplyQueue()
        self._request_queues[request_id] = queue
        self.outstanding_work += work
        try:
            yield queue
        finally:
            self.outstanding_work -= work
            del self._request_queues[request_id]

    def status(self, now: float | None = None) -> NodeStatus:
        now = time.monotonic() if now is None else now
        age = None if self._latest_pong_time is None else now - self._latest_pong_time
        healthy = self._connected and age is not None and age <= HEALTHY_WITHIN_S
        return NodeStatus(self.index, self.role, self.address, healthy, self.draining, self._latest_pong, age)

    @property
    def num_open_requests(self) -> int:
        return len(self._request_queues)

    def is_drained(self) -> bool:
        """Draining, and nothing left on it: no request of ours open, and (from its latest stats) nothing
        waiting, running, transferring or leased (a prefill node's KV stays until its decode node read it)."""
        stats = self._latest_pong.stats if self._latest_pong is not None else {}
        held = sum(stats.get(key, 0) for key in ("num_waiting", "num_running", "num_transferring", "num_leased"))
        return self.draining and not self._request_queues and held == 0

    @property
    def healthy(self) -> bool:
        return self.status().healthy

    async def _receive_loop(self) -> None:
        while True:
            frames = await self._socket.recv_multipart()
            # NOTE: the payload is the last frame, whether or not the node's ROUTER added an empty delimiter.
            try:
                self._dispatch(decode(frames[-1]))
            except ProtocolError as error:
                logger.warning("dropped a message from %s: %s", self.address, error)

    async def _watch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            if self._request_queues:
                now, healthy = loop.time(), self.healthy
                for queue in self._request_queues.values():
                    queue.end_wait_if_silent(now, healthy)

    async def _monitor_loop(self, monitor: zmq.asyncio.Socket) -> None:
        try:
            while True:
                event = zmq.utils.monitor.parse_monitor_message(await monitor.recv_multipart())
                if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self._connected = True
                elif event["event"] == zmq.EVENT_DISCONNECTED and self._connected:
                    self._connected = False
                    self.fail_open_requests("its connection closed")
        finally:
            monitor.close()

    def fail_open_requests(self, why: str) -> None:
        """The node died (or restarted and forgot them): every request open on it gets a 503 now (the router
        re-runs it elsewhere) instead of waiting for replies that will never come."""
        self.num_lost += 1
        if self._request_queues:
            logger.warning("%s node %s lost (%s): failing its %d open request(s) over", self.role, self.address, why,
                           len(self._request_queues))
        for request_id, queue in self._request_queues.items():
            queue.put_nowait(ErrorReply(request_id, 503, f"{self.role} node {self.address} was lost: {why}"))

    def _dispatch(self, message) -> None:
        if type(message) is StepTokens:
            queues = self._request_queues
            for event in message.events:
                queue = queues.get(event.request_id)
                if queue is not None:  # NOTE: None: aborted or timed out meanwhile, as below
                    queue.put_nowait(event)
            return
        if isinstance(message, Pong):
            previous = self._latest_pong
            self._latest_pong, self._latest_pong_time = message, time.monotonic()
            if previous is not None and previous.instance_id != message.instance_id:
                self.fail_open_requests(f"it restarted (instance {message.instance_id[:8]})")
            return
        queue = self._request_queues.get(getattr(message, "request_id", None))
        if queue is None:
            # NOTE: late replies of aborted or timed-out requests land here; nobody waits for them.
            logger.debug("no request waits for %s from %s", type(message).__name__, self.address)
            return
        queue.put_nowait(message)


class NodePool:
    """Every node of the cluster, their ping loop and the instance choice."""

    def __init__(self, config: RouterConfig):
        self.request_timeout_s = config.request_timeout_s
        self._context = zmq.asyncio.Context()
        self.key = None if config.cluster_key_file is None else ClusterKey.load(config.cluster_key_file)
        self.by_role: dict[Role, list[NodeClient]] = {
            role: [NodeClient(self._context, role, index, address, self.key) for index, address in enumerate(addresses)]
            for role, addresses in (("prefill", config.prefill_addresses), ("decode", config.decode_addresses),
                                    ("colocated", config.colocated_addresses))}
        self._ping_task: asyncio.Task | None = None
        self._nonces = itertools.count()

    @property
    def prefill_nodes(self) -> list[NodeClient]:
        return self.by_role["prefill"]

    @property
    def decode_nodes(self) -> list[NodeClient]:
        return self.by_role["decode"]

    @property
    def colocated_nodes(self) -> list[NodeClient]:
        return self.by_role["colocated"]

    @property
    def nodes(self) -> list[NodeClient]:
        return [*self.prefill_nodes, *self.decode_nodes, *self.colocated_nodes]

    async def start(self) -> None:
        for node in self.nodes:
            node.start()
        self._ping_task = asyncio.create_task(self._ping_loop(), name="ping nodes")

    async def close(self) -> None:
        if self._ping_task is not None:
            self._ping_task.cancel()
            await asyncio.gather(self._ping_task, return_exceptions=True)
        await asyncio.gather(*(node.close() for node in self.nodes))
        self._context.term()

    def add(self, role: Role, address: str) -> NodeClient:
        """A new node of the pool (call from the event loop); it takes requests once it answers a ping."""
        nodes = self.by_role[role]
        if any(node.address == address for node in self.nodes):
            raise ValueError(f"{address} is already a node of this pool")
        node = NodeClient(self._context, role, max((n.index for n in nodes), default=-1) + 1, address, self.key)
        node.start()
        nodes.append(node)
        return node

    def find(self, address: str) -> NodeClient:
        for node in self.nodes:
            if node.address == address:
                return node
        raise UnknownNode(f"no node at {address!r}")

    async def remove(self, address: str) -> None:
        """Drop a drained node; ValueError if it still holds work or is the last of its role."""
        node = self.find(address)
        nodes = self.by_role[node.role]
        if not node.is_drained():
            raise ValueError(f"{address} is not drained yet: drain it and wait until it holds nothing")
        nodes.remove(node)
        await node.close()

    def choose_prefill(self, pinned: str | None = None) -> NodeClient:
        return pick(self.prefill_nodes, pinned) if pinned else least_loaded(self.prefill_nodes)

    def choose_decode(self, pinned: str | None = None) -> NodeClient:
        """A decode node, or (pinned only) a colocated one."""
        if pinned:
            return pick(self.decode_nodes + self.colocated_nodes, pinned)
        return least_loaded(self.decode_nodes)

    def choose_colocated(self, placement: Placement) -> NodeClient | None:
        """The colocated node a request goes to, or None for the prefill -> decode path: the least loaded
        colocated node unless a decode node has less outstanding work (or the request is pinned to P/D nodes)."""
        if placement.prefill or placement.decode:
            pinned = self.choose_decode(placement.decode) if placement.decode else None
            return pinned if pinned is not None and pinned.role == "colocated" else None
        colocated = [node for node in self.colocated_nodes if not node.draining]
        decode = [node for node in self.decode_nodes if not node.draining]
        disaggregated = bool(decode) and any(not node.draining for node in self.prefill_nodes)
        if disaggregated:
            # NOTE: a lost colocated node's retry goes to the P/D path rather than back to it
            colocated = [node for node in colocated if node.healthy]
        if not colocated:
            if disaggregated or not self.colocated_nodes:
                return None
            least_loaded(self.colocated_nodes)  # NOTE: raises NoNodeAvailable: every colocated node is draining
        best = least_loaded(colocated)
        if disaggregated and least_loaded(decode).outstanding_work < best.outstanding_work:
            return None
        return best

    def statuses(self) -> list[NodeStatus]:
        now = time.monotonic()
        return [node.status(now) for node in self.nodes]

    def model_facts(self) -> ModelFacts | None:
        """What the nodes report of the model (None before any answered); PoolMismatch if they disagree."""
        pongs = [status.pong for status in self.statuses() if status.pong is not None]
        return agreed_model_facts(pongs) if pongs else None

    async def learned_model_facts(self, timeout_s: float) -> ModelFacts | None:
        """model_facts() once a node has answered (None if none did within timeout_s).

        NOTE: not once every node has: a node that never comes up must not delay every request."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._until_one_answered(), timeout_s)
        return self.model_facts()

    async def _until_one_answered(self) -> None:
        while all(node.status().pong is None for node in self.nodes):
            await asyncio.sleep(0.02)

    def node_fingerprints(self) -> set[str]:
        return {status.pong.fingerprint for status in self.statuses() if status.pong is not None}

    async def wait_until_healthy(self, timeout_s: float) -> None:
        """For direct (non-HTTP) users: wait for every node's first Pong."""
        await asyncio.wait_for(self._until_all_healthy(), timeout_s)

    async def _until_all_healthy(self) -> None:
        while not all(node.healthy for node in self.nodes):
            await asyncio.sleep(0.05)

    async def _ping_loop(self) -> None:
        while True:
            nonce = next(self._nonces)
            for node in self.nodes:
                node.post(Ping(nonce))
            all_answered = all(node.status().pong is not None for node in self.nodes)
            await asyncio.sleep(PING_INTERVAL_S if all_answered else FIRST_PING_INTERVAL_S)


class PoolMismatch(ValueError):
    """The pool's nodes disagree on a model fact or their fingerprint: no request can be served consistently."""


def agreed_model_facts(pongs: list[Pong]) -> ModelFacts:
    """The facts (and fingerprint) every node reports; PoolMismatch names the first field two disagree on."""
    first = pongs[0]
    for pong in pongs[1:]:
        for name in (f.name for f in dataclasses.fields(ModelFacts)):
            ours, theirs = getattr(first.model_facts, name), getattr(pong.model_facts, name)
            if ours != theirs:
                raise PoolMismatch(f"the nodes disagree on {name}: {first.node_id} has {ours}, "
                                   f"{pong.node_id} has {theirs}")
        if pong.fingerprint != first.fingerprint:
            raise PoolMismatch(f"the nodes disagree on fingerprint: {first.node_id} has {first.fingerprint}, "
                               f"{pong.node_id} has {pong.fingerprint}")
    return first.model_facts


def least_loaded(nodes: list[NodeClient]) -> NodeClient:
    """Least outstanding work among healthy nodes (all nodes when none is), ties to the lowest index; never a
    draining node."""
    open_nodes = [node for node in nodes if not node.draining]
    if not open_nodes:
        raise NoNodeAvailable(f"every {nodes[0].role} node is draining" if nodes else "no node of that role")
    candidates = [node for node in open_nodes if node.healthy] or open_nodes
    return min(candidates, key=lambda node: (node.outstanding_work, node.index))


class NoNodeAvailable(ValueError):
    """No node of a role may take a new request (all draining): the request gets a 503."""


@dataclass(frozen=True)
class Placement:
    """Node ids a request is pinned to (X-CoRun-Prefill-Node / X-CoRun-Decode-Node), for tests and debugging."""

    prefill: str | None = None
    decode: str | None = None


class UnknownNode(ValueError):
    pass


def pick(nodes: list[NodeClient], node_id: str) -> NodeClient:
    """The node whose id (from its Pong) or address is node_id."""
    for node in nodes:
        pong = node.status().pong
        if node_id == node.address or (pong is not None and pong.node_id == node_id):
            return node
    raise UnknownNode(f"no {nodes[0].role if nodes else 'such'} node {node_id!r}")
