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

A role may name messages this thread handles as soon as any forward runs (NodeServer.handled_during_forward,
checked every PROMPT_CHECK_S): a prefill node's ClaimKV, so a decode node's claim does not wait out a prefill
forward (a full 8,192-row pack of an 8B model runs ~0.2 s). Such a message from a sender with a message held for
the loop is held too, so each sender's messages keep their order.
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
PROMPT_CHECK_S = 0.002
"""How often it takes the messages handled during a forward, while one runs (where the role names any)."""


class PingsWhileBusy:
    """The thread; server is a node_core.server.NodeServer (its lock, forward_started, sockets and on_ping)."""

    def __init__(self, server):
        self.server = server
        self.num_answered = 0
        """Pings this thread answered (the loop was in a long forward)."""
        self.num_handled = 0
        """Messages of server.handled_during_forward this thread handled while a forward ran."""
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pings {server.config.node_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    def _interval(self) -> float:
        prompt = self.server.handled_during_forward and self.server.forward_started is not None
        return PROMPT_CHECK_S if prompt else CHECK_INTERVAL_S

    def _run(self) -> None:
        while not self._stopping.wait(self._interval()):
            started = self.server.forward_started
            if started is None:
                continue
            long_forward = time.monotonic() - started >= BUSY_FORWARD_S
            if not (long_forward or self.server.handled_during_forward):
                continue
            if self.server.lock.acquire(timeout=CHECK_INTERVAL_S):
                try:
                    if self.server.forward_started is not None:  # NOTE: the loop may have taken the lock back
                        self._answer(long_forward)
                finally:
                    self.server.lock.release()

    def _answer(self, long_forward: bool) -> None:
        """Pings get their Pong once the forward is long, the role's messages of handled_during_forward are handled;
        every other message waits for the loop (in arrival order), and so does every later one of its sender."""
        server, sockets = self.server, self.server.sockets
        waiting_senders = {identity for identity, _ in sockets.held}
        for identity, message in sockets.take_server_messages():
            if type(message) is protocol.Ping and long_forward:
                server.on_ping(identity, message)
                self.num_answered += 1
            elif type(message) in server.handled_during_forward and identity not in waiting_senders:
                sockets.handle(server, identity, message)
                self.num_handled += 1
            else:
                sockets.hold(identity, message)
                waiting_senders.add(identity)
