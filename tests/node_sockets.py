"""What the in-process node tests share: the small engine their nodes run and a router's socket to a node."""

import contextlib
from collections.abc import Iterator

import zmq

from wire import protocol
from wire.config import CacheConfig, EngineConfig, SchedulerConfig


def small_engine(model_dir: str) -> EngineConfig:
    """The tiny model on one thread, 8 slots, 16-token chunks: prompts of a few chunks stay fast."""
    return EngineConfig(model=model_dir, num_threads=1, cache=CacheConfig(num_blocks=64),
                        scheduler=SchedulerConfig(max_num_seqs=8, max_model_len=256, prefill_chunk_size=16))


@contextlib.contextmanager
def router_socket(address: str) -> Iterator[zmq.Socket]:
    """A DEALER connected to a node's address, as a router's; closed on exit."""
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(address)
    try:
        yield socket
    finally:
        socket.close()


def deliver(node, socket: zmq.Socket, message, timeout_s: float = 10.0) -> None:
    """Send a message and wait until it waits on the node's socket, so the node's next step receives it.

    NOTE: a step that finds nothing waits only IDLE_RECEIVE_MS (none while busy); on a loaded host the message can
    take longer than that to cross loopback TCP, and a test that sent then stepped once saw no message (CI)."""
    socket.send(protocol.encode(message))
    if not node.sockets.server.poll(int(timeout_s * 1000)):
        raise AssertionError(f"{type(message).__name__} did not reach {node.config.node_id} in {timeout_s} s")
