"""A node's replies are never dropped because its client reads slowly.

A zmq ROUTER socket drops, without an error, messages to a peer whose queue is full (SNDHWM, 1000 by default, plus
the peer's RCVHWM): a decode node sends a TokenEvent per request per step, so a router that falls a few steps
behind would lose tokens. NodeSockets sets no limit; the inverse shows the drop with zmq's default on this host.
"""

import time

import zmq

from node_core.serving import NodeSockets
from wire import protocol

NUM_REPLIES = 20000
"""More than zmq's default send and receive queues together (1000 + 1000) and, at REPLY_BYTES each, than the
kernel's TCP buffers between them hold (a few MB)."""
REPLY_BYTES = 2000


def replies_received(server: zmq.Socket, client_rcvhwm: int | None) -> int:
    """A client registers, does not read while NUM_REPLIES are sent to it, then reads all it can."""
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    if client_rcvhwm is not None:
        client.setsockopt(zmq.RCVHWM, client_rcvhwm)
    client.connect(server.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        client.send(b"hello")
        identity, _ = server.recv_multipart()
        for i in range(NUM_REPLIES):
            server.send_multipart([identity, protocol.encode(protocol.ErrorReply(f"r{i}", 400, "x" * REPLY_BYTES))])
        time.sleep(0.5)  # NOTE: let the queues fill before anyone reads
        received = 0
        while client.poll(500):
            client.recv()
            received += 1
        return received
    finally:
        client.close()


def test_a_slow_client_gets_every_reply():
    sockets = NodeSockets("tcp://127.0.0.1:0")
    try:
        assert replies_received(sockets.server, client_rcvhwm=0) == NUM_REPLIES
    finally:
        sockets.close()


def test_inverse_zmq_default_limits_drop_replies():
    server = zmq.Context.instance().socket(zmq.ROUTER)
    server.setsockopt(zmq.LINGER, 0)
    server.bind("tcp://127.0.0.1:0")
    try:
        assert replies_received(server, client_rcvhwm=None) < NUM_REPLIES
    finally:
        server.close()
