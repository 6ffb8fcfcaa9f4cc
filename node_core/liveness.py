"""Pings answered while a node's loop runs a long forward: the router tells a busy node from a dead one.

The router counts a node healthy while its latest Pong is at most HEALTHY_WITHIN_S old (router/nodes/client.py),
and fails over the requests waiting on an unhealthy one. The loop answers pings between forwards, so a forward
longer than that (a long prompt's chunk on a loaded host) looked like a dead node (issue 23: a busy prefill node
was declared dead, its requests failed). Now the loop holds NodeServer.lock for its whole turn except the forward
(NodeServer.run_unlocked), and this thread, once a forward has lasted BUSY_FORWARD_S, takes the lock, answers the
pings waiting on the node's socket and hands every other message to the loop's next receive (NodeSockets.hold).

A process that is gone is still known at once: its connection closes (the router's zmq heartbeats are answered by
zmq's I/O thread, which dies with it, or stops with it under SIGSTOP). A loop hung inside a forward keeps answering
pings; its requests end at the router's request timeout (a 504).
"""

from __future__ import annotations

import threading
import time

from wire import protocol

BUSY_FORWARD_S = 0.5
"""A forward running this long has the node's pings answered by the liveness thread (far below the router's
HEALTHY_WITHIN_S; the loop answers them itself between shorter forwards)."""
CHECK_INTERVAL_S = 0.1
"""How often the thread looks at the loop."""


class PingsWhileBusy:
    """The thread; server is a node_core.server.NodeServer (its lock, forward_started, sockets and on_ping)."""

    def __init__(self, server):
        self.server = server
        self.num_answered = 0
        """Pings this thread answered (the loop was in a long forward)."""
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pings {server.config.node_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopping.wait(CHECK_INTERVAL_S):
            started = self.server.forward_started
            if started is None or time.monotonic() - started < BUSY_FORWARD_S:
                continue
            if self.server.lock.acquire(timeout=CHECK_INTERVAL_S):
                try:
                    self._answer_pings()
                finally:
                    self.server.lock.release()

    def _answer_pings(self) -> None:
        """Pings get their Pong now; every other message waits for the loop (in arrival order)."""
        sockets = self.server.sockets
        for identity, message in sockets.take_server_messages():
            if type(message) is protocol.Ping:
                self.server.on_ping(identity, message)
                self.num_answered += 1
            else:
                sockets.hold(identity, message)
