"""One node's connection: a zmq DEALER, a receive loop routing each reply to its request's queue (ReplyQueue), a
watchdog ending silent waits, and the node's health (from its connection and its latest Pong).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import zmq
import zmq.asyncio
import zmq.utils.monitor

from wire.config import Role
from wire.node_auth import ClusterKey
from wire.protocol import (
    ErrorReply,
    NodeCapacity,
    Pong,
    PrefixCacheReset,
    ProtocolError,
    ResetPrefixCache,
    StepTokens,
    decode,
    encode,
)

logger = logging.getLogger(__name__)

HEALTHY_WITHIN_S = 3.0
"""A node is healthy when it is connected, has answered a ping, and the router last heard from it (a Pong or any
other message) at most this long ago: three missed pings make a busy or hung node unhealthy; a dead one is known at
once, by its connection. NOTE: any message counts, not only Pongs: a router behind its offered load reads a node's
Pong only after the node's queued StepTokens, while the node is fine (the H200 host's 16 cores, 2048 streams into
one router: 260 requests waiting on a healthy prefill node failed, with a 504 that claimed 600 s of silence)."""
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
    timer per wait: a timer per streamed token cost the router more than the token's own bookkeeping.

    push (set by the consumer): the receive loop hands it a reply at once, while the consumer waits with nothing
    queued (so nothing is ahead of the reply); push returns False for a reply it leaves to the consumer, which is
    then queued. NOTE: the streamed token's fast path (issue 21): waking the consumer's coroutine for each token cost
    the router more than the token's detokenizing, framing and write together."""

    def __init__(self):
        super().__init__()
        self.waiting_since: float | None = None
        self.deadline = 0.0
        self.timeout_s = 0.0
        self.ended_unhealthy = False
        """The latest wait ended with SILENT because its node stopped answering, not at its deadline."""
        self.push: Callable[[object], bool] | None = None

    def offer(self, reply, now: float) -> None:
        """A reply from the node (now: the loop's time): pushed when push takes it, else queued for the consumer."""
        # NOTE: the deque itself (as peek), not empty(): a method call fewer per streamed token
        if self.push is not None and self.waiting_since is not None and not self._queue:
            try:
                pushed = self.push(reply)
            except Exception:  # NOTE: the node's receive loop must outlive any one request's failure
                logger.exception("pushing a reply failed; its request ends")
                self.push = None
                self.put_nowait(ErrorReply(getattr(reply, "request_id", ""), 500, "the router failed this request"))
                return
            if pushed:
                # NOTE: the wait goes on, but the node spoke: its silence counts from now
                self.waiting_since, self.deadline = now, now + self.timeout_s
                return
        self.put_nowait(reply)

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
        self.waiting_since, self.deadline, self.timeout_s = now, now + timeout_s, timeout_s
        try:
            return await self.get()
        finally:
            self.waiting_since = None

    def end_wait_if_silent(self, now: float, node_healthy: bool) -> None:
        if self.waiting_since is not None and (
                now >= self.deadline or (not node_healthy and now - self.waiting_since >= UNHEALTHY_WAIT_S)):
            self.waiting_since = None
            self.ended_unhealthy = now < self.deadline
            self.put_nowait(SILENT)


MAX_MESSAGES_PER_WAKEUP = 64
"""Messages the receive loop takes in one turn of the event loop when they have queued up (RECEIVE_TURN_S bounds
the turn's time too)."""
RECEIVE_TURN_S = 0.005
"""The receive loop stops taking queued messages once a turn has lasted this long: a StepTokens of 2048 rows costs the
router tens of ms, so 64 of them in one turn held its event loop for seconds, and every other task (pings, HTTP,
other nodes' replies) waited."""
SILENT = object()
"""What ReplyQueue.next_within returns when the wait ended without a reply."""


class NodeClient:
    """One node: a DEALER socket, a receive loop routing replies to per-request queues, and a work count."""

    def __init__(self, context: zmq.asyncio.Context, role: Role, index: int, address: str,
                 key: ClusterKey | None = None, instance_gone: Callable[[NodeClient, Pong], None] | None = None):
        """instance_gone(this client, the gone process' latest Pong): called when a process of this node is known to
        be gone (_take_pong)."""
        self.role, self.index, self.address = role, index, address
        self.key = key
        self.instance_gone = instance_gone
        self.outstanding_work = 0
        self.draining = False
        """No new requests: it is being removed (router/admin.py)."""
        self.given_up = False
        """The launcher gave up restarting this node (router/api/admin.py): it stays listed, unhealthy."""
        self.router_closing = False
        """The router is stopping (NodePool.begin_closing): a send this node cannot take now fails at once."""
        self._context = context
        self._socket: zmq.asyncio.Socket | None = None
        self._request_queues: dict[str, ReplyQueue] = {}
        self._resets: dict[int, asyncio.Future] = {}
        """ResetPrefixCache nonce -> the future its PrefixCacheReset answers."""
        self._latest_pong: Pong | None = None
        self._latest_pong_time: float | None = None
        self._latest_heard_time = 0.0
        """time.monotonic() of the latest message read from the node, of any kind."""
        self._connected = False
        self._receive_task: asyncio.Task | None = None
        self._monitor_task: asyncio.Task | None = None
        self._watch_task: asyncio.Task | None = None
        self.num_lost = 0
        """Times the node was lost (its connection closed, or a Pong came from another instance)."""
        self.identity_version = 0
        """Counts the Pongs that reported other model facts or another fingerprint than the one before (the first
        one included): what the pool agrees on changes only with it (NodePool.identity)."""
        self._num_disconnects = 0
        self._disconnects_at_pong = 0
        """How many times the connection had closed when the latest Pong came: a Pong from another instance with no
        close since the previous one means the node restarted unseen (the requests sent to it are gone)."""

    @property
    def name(self) -> str:
        """What client-facing messages call this node: its role and id (as /health shows them), never its address
        (logs have that)."""
        node_id = self._latest_pong.node_id if self._latest_pong is not None else f"#{self.index}"
        return f"{self.role} node {node_id}"

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
        if self._socket is not None:
            # NOTE: the monitor is stopped before its own socket closes (the monitor task's end, which does the same;
            # this covers a task cancelled before it ran). The other order can hang for good: libzmq's blocking send
            # of its stop event to a peer that is gone, inside zmq_socket_monitor, which holds the GIL (pyzmq#1020)
            self._socket.disable_monitor()
        for task in (self._receive_task, self._monitor_task, self._watch_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._socket is not None:
            self._socket.close()

    def send(self, message) -> asyncio.Future:
        """Send; the future is done once the node's connection took the message: at once, unless the node is
        unreachable (callers bound the wait)."""
        return self._socket.send(encode(message))

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

    async def reset_prefix_cache(self, nonce: int, timeout_s: float) -> PrefixCacheReset | None:
        """Ask the node to forget its cached prompt chunks; its answer, or None when none came within timeout_s."""
        answer = self._resets[nonce] = asyncio.get_running_loop().create_future()
        try:
            self.post(ResetPrefixCache(nonce))
            return await asyncio.wait_for(answer, timeout_s)
        except asyncio.TimeoutError:
            return None
        finally:
            del self._resets[nonce]

    def status(self, now: float | None = None) -> NodeStatus:
        now = time.monotonic() if now is None else now
        age = None if self._latest_pong_time is None else now - self._latest_pong_time
        return NodeStatus(self.index, self.role, self.address, self._healthy_at(now), self.draining,
                          self._latest_pong, age)

    def _healthy_at(self, now: float) -> bool:
        return self._connected and self._latest_pong_time is not None and now - self._latest_heard_time <= (
            HEALTHY_WITHIN_S)

    @property
    def latest_pong(self) -> Pong | None:
        """The node's latest Pong, None before one."""
        return self._latest_pong

    @property
    def latest_pong_time(self) -> float | None:
        """time.monotonic() of the latest Pong (None before one)."""
        return self._latest_pong_time

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
        """NOTE: asked of every candidate node for every request: no NodeStatus is built for it."""
        return self._healthy_at(time.monotonic())

    @property
    def capacity(self) -> NodeCapacity | None:
        """What the node can hold, from its latest Pong (None before one, or from a node that does not say)."""
        return None if self._latest_pong is None else self._latest_pong.capacity

    async def _receive_loop(self) -> None:
        # NOTE: an awaited receive costs a future and pyzmq's event bookkeeping (~1/6 of the router's CPU per
        # request under load, measured with py-spy); what has already arrived is taken without them, a bounded run
        # of messages at a time so that other tasks get their turn
        receive_now = zmq.Socket.shadow(self._socket.underlying).recv_multipart
        clock = asyncio.get_running_loop().time
        while True:
            self._take(await self._socket.recv_multipart())
            if self._take_queued(receive_now, clock, clock() + RECEIVE_TURN_S):
                # NOTE: an awaited receive that finds a message queued returns without yielding: a backlog taken
                # by awaits alone held the event loop until it was gone (seconds, on the H200 host)
                await asyncio.sleep(0)

    def _take_queued(self, receive_now: Callable, clock: Callable[[], float], turn_ends: float) -> bool:
        """Take messages already queued, until none is left (-> False) or the turn is over (-> True)."""
        for _ in range(MAX_MESSAGES_PER_WAKEUP - 1):
            if clock() >= turn_ends:
                return True
            try:
                frames = receive_now(zmq.NOBLOCK)
            except zmq.Again:
                return False
            self._take(frames)
        return True

    def _take(self, frames: list[bytes]) -> None:
        self._latest_heard_time = time.monotonic()
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
                    self._num_disconnects += 1
                    self.fail_open_requests("its connection closed")
        finally:
            self._socket.disable_monitor()  # NOTE: first: see close()
            monitor.close()

    def fail_open_requests(self, why: str) -> None:
        """The node died (or restarted and forgot them): every request open on it gets a 503 now (the router
        re-runs it elsewhere) instead of waiting for replies that will never come."""
        self.num_lost += 1
        if self._request_queues:
            logger.warning("%s node %s lost (%s): failing its %d open request(s) over", self.role, self.address, why,
                           len(self._request_queues))
        for request_id, queue in self._request_queues.items():
            queue.put_nowait(ErrorReply(request_id, 503, f"{self.name} was lost: {why}"))

    def _take_pong(self, pong: Pong) -> None:
        """The node's latest Pong. One from another instance means the node restarted: the requests sent to the
        previous instance are gone. If its connection closed since the previous Pong, they were failed over then,
        and every request open now was sent after that close, to the new instance: nothing more fails (issue 23:
        the new instance's first Pong failed the retries just sent to it). Else the restart went unseen, and every
        open request fails over.

        The previous instance is then known to be gone (instance_gone): the new one could bind this address only once
        that one had closed its sockets, which a node does only as it leaves its loop for good (or the kernel does,
        as it dies), and a launcher starts a node again only once its process ended (launch/local.py,
        launch/ray_node.py). NOTE: silence proves nothing: a stopped process misses pings, then resumes."""
        previous, disconnects_then = self._latest_pong, self._disconnects_at_pong
        if previous is not None and pong.nonce < previous.nonce:
            # NOTE: an answer to an older ping than the latest answer taken: stale (a process answers pings in the
            # order sent, and one started on this address receives only pings sent after those its predecessor
            # answered). Taken, a late Pong of a replaced process would read as the live one being gone.
            return
        if previous is None or (previous.model_facts, previous.fingerprint) != (pong.model_facts, pong.fingerprint):
            self.identity_version += 1
        self._latest_pong, self._latest_pong_time = pong, time.monotonic()
        self._disconnects_at_pong = self._num_disconnects
        restarted = previous is not None and previous.instance_id != pong.instance_id
        if restarted and self._num_disconnects == disconnects_then:
            self.fail_open_requests(f"it restarted (instance {pong.instance_id[:8]}) with its connection open")
        if restarted and previous.instance_id and self.instance_gone is not None:
            self.instance_gone(self, previous)

    def _dispatch(self, message) -> None:
        if type(message) is StepTokens:
            queues, now = self._request_queues, asyncio.get_running_loop().time()
            for event in message.events:
                queue = queues.get(event.request_id)
                if queue is not None:  # NOTE: None: aborted or timed out meanwhile, as below
                    queue.offer(event, now)
            return
        if isinstance(message, Pong):
            self._take_pong(message)
            return
        if isinstance(message, PrefixCacheReset):
            waiting = self._resets.get(message.nonce)
            if waiting is not None and not waiting.done():
                waiting.set_result(message)
            return
        queue = self._request_queues.get(getattr(message, "request_id", None))
        if queue is None:
            # NOTE: late replies of aborted or timed-out requests land here; nobody waits for them.
            logger.debug("no request waits for %s from %s", type(message).__name__, self.address)
            return
        queue.put_nowait(message)
