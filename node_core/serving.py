"""Pieces every node server shares: its control sockets and the fingerprint of what determines its outputs."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import signal
import sys

import torch
import zmq

from corun.cublas import split_k_in_effect
from corun.models.context import model_context
from corun.scheduler import RequestRejected
from corun.shared_weights import SharedWeightsError
from wire import protocol
from wire.config import KV_POOL_SIZING, EngineConfig, NodeConfig
from wire.flags import add_flags, config_from_args
from wire.gc_heap import freeze_startup_heap
from wire.node_auth import ClusterKey, admit_only_members
from wire.supervision import end_with_supervisor

logger = logging.getLogger(__name__)


def engine_fingerprint(config: EngineConfig, model_digest: str) -> str:
    """A hash of everything that determines outputs (engine_facts)."""
    return hashlib.sha256(json.dumps(engine_facts(config, model_digest), sort_keys=True).encode()).hexdigest()[:16]


def engine_facts(config: EngineConfig, model_digest: str) -> dict:
    """Everything that determines outputs: weights, engine config (N, dtype, chunking...), software versions."""
    engine = dataclasses.asdict(config)
    engine.pop("model")  # NOTE: the path does not matter, the digest of what is in it does
    # NOTE: how many KV blocks a node holds changes where a request's KV lives, not what is computed from it
    # (attention reads a request's blocks in table order, wherever they are): prefill and decode nodes of one pool
    # may have different KV budgets. The block size stays: it shapes the paged reads.
    for sizing in KV_POOL_SIZING:
        engine["cache"].pop(sizing)
    engine["scheduler"].pop("async_scheduling")  # NOTE: when the host reads a step's tokens, not what they are
    engine["scheduler"].pop("decode_rides_prefill")  # NOTE: which forward carries a step, joined only where verified
    engine["scheduler"].pop("multi_chunk_prefill")  # NOTE: how many chunks a forward carries, only where verified
    # NOTE: the CPU thread count changes GEMM reductions (measured: logprobs of 7 of 32 prompts moved between 1
    # and 2 threads), so the effective count is part of what determines outputs.
    engine["num_threads"] = torch.get_num_threads()
    engine["mkl_cbwr"] = os.environ.get("MKL_CBWR")  # NOTE: MKL's reproducibility mode picks its CPU kernels too
    # NOTE: what the process runs, which can differ from what was asked where CUDA started first (corun/cublas.py)
    engine["cublas_split_k"] = split_k_in_effect() if config.device.startswith("cuda") else None
    facts = {"model_digest": model_digest, "engine": engine, "torch": torch.__version__,
             "protocol": protocol.PROTOCOL_VERSION, "gpu": None}
    if config.backend == "vllm":  # NOTE: vLLM's version and every setting made for it (its kernels, its shapes)
        from corun.vllm_backend.engine_args import vllm_kv_layout

        facts["vllm"] = vllm_kv_layout(config)
    if config.device.startswith("cuda"):  # NOTE: Triton compiles the CUDA kernels: its version changes their bits
        import triton

        facts["gpu"] = {"name": torch.cuda.get_device_name(), "triton": triton.__version__,
                        "cuda": torch.version.cuda}
    return facts


def refusal(request_id: str, error: RequestRejected) -> protocol.ErrorReply:
    """A request this node can never run, as its router is told: a 400 with the reason (a constraint that does not
    compile: the grammar library's reason in a field of its own, ErrorReply.constraint_reason)."""
    return protocol.ErrorReply(request_id, 400, str(error), constraint_reason=error.constraint_reason)


class NodeSockets:
    """A ROUTER socket for requests (router, peers) plus DEALER sockets to peers, under one poller; with a cluster
    key, every one of them CURVE-authenticated (only cluster members get in)."""

    def __init__(self, bind_address: str, key: ClusterKey | None = None):
        # NOTE: a context of its own: one ZAP handler per context, and in-process tests run several nodes
        self.context = zmq.Context.instance() if key is None else zmq.Context()
        self.key = key
        self.authenticator = None if key is None else admit_only_members(self.context, key)
        self.server = self.context.socket(zmq.ROUTER)
        self.server.setsockopt(zmq.LINGER, 0)
        # NOTE: a ROUTER socket drops, silently, what it sends to a peer whose queue holds SNDHWM messages (1000 by
        # default): a decode node sends one TokenEvent per request per step, so a router lagging a few steps behind
        # 256 streams lost tokens and their streams ended short with no error (measured with
        # benchmarks/router_throughput.py at 1024 streams: 54 events). Unbounded here: what waits is bounded by the
        # tokens of the requests in flight, and the router's RCVHWM is unbounded to match.
        self.server.setsockopt(zmq.SNDHWM, 0)
        if key is not None:
            key.serve(self.server)
        self.server.bind(bind_address)
        self.poller = zmq.Poller()
        self.poller.register(self.server, zmq.POLLIN)
        self.peers: dict[str, zmq.Socket] = {}
        self.held: list[tuple[bytes, object]] = []
        """Messages the liveness thread took off the server socket (node_core/liveness.py) for the loop's next poll."""

    def connect_peer(self, address: str) -> zmq.Socket:
        if address not in self.peers:
            socket = self.context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            if self.key is not None:
                self.key.connect(socket)
            socket.connect(address)
            self.poller.register(socket, zmq.POLLIN)
            self.peers[address] = socket
        return self.peers[address]

    def poll(self, timeout_ms: int) -> list[tuple[bytes | str, object]]:
        """Messages received: (client identity, message) from the server socket, (peer address, message) else;
        those the liveness thread held first (they arrived first)."""
        received, self.held = self.held, []
        for socket, _ in self.poller.poll(0 if received else timeout_ms):
            while True:
                try:
                    frames = socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                source = frames[0] if socket is self.server else self._address_of(socket)
                message = self._decode(source, frames[-1])
                if message is not None:
                    received.append((source, message))
        return received

    def take_server_messages(self) -> list[tuple[bytes, object]]:
        """Every message waiting on the server socket now (a malformed one is refused, as in poll)."""
        taken = []
        while True:
            try:
                frames = self.server.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return taken
            message = self._decode(frames[0], frames[-1])
            if message is not None:
                taken.append((frames[0], message))

    def hold(self, identity: bytes, message) -> None:
        """Keep a message taken off the server socket for the loop's next poll."""
        self.held.append((identity, message))

    def dispatch(self, server, timeout_ms: int) -> None:
        """Hand each received message to server.handlers[type](server, source, message)."""
        for source, message in self.poll(timeout_ms):
            self.handle(server, source, message)

    def dispatch_peer_replies(self, server) -> None:
        """Hand what has arrived on the peer sockets (only) to server.peer_handlers; the server socket's messages wait
        for the next dispatch."""
        for address, socket in list(self.peers.items()):
            while True:
                try:
                    frames = socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                message = self._decode(address, frames[-1])
                if message is not None:
                    self.handle(server, address, message)

    def handle(self, server, source: bytes | str, message) -> None:
        """NOTE: a handler that raises costs its message, never the node: it is logged and, when the sender is a
        client of the server socket, answered with a 500 naming the request."""
        # NOTE: a peer's replies are taken only from that peer's socket: the server socket is open to every
        # member, and a "reply" arriving there is no answer to anything this node asked
        handlers = server.handlers if isinstance(source, bytes) else server.peer_handlers
        handler = handlers.get(type(message))
        if handler is None:
            logger.warning("%s: unexpected %s", server.config.node_id, type(message).__name__)
            self._refuse(source, getattr(message, "request_id", ""), f"unexpected {type(message).__name__}")
            return
        try:
            handler(server, source, message)
        except Exception as error:
            logger.exception("%s: handling %s failed", server.config.node_id, type(message).__name__)
            self._refuse(source, getattr(message, "request_id", ""), f"{type(error).__name__}: {error}", 500)

    def reply(self, identity: bytes, message) -> None:
        self.server.send_multipart([identity, protocol.encode(message)])

    def send_peer(self, address: str, message) -> None:
        self.connect_peer(address).send(protocol.encode(message))

    def close(self) -> None:
        for socket in [self.server, *self.peers.values()]:
            socket.close(linger=0)
        if self.authenticator is not None:
            self.authenticator.stop()
            self.context.term()

    def _address_of(self, socket) -> str:
        return next(address for address, s in self.peers.items() if s is socket)

    def _decode(self, source: bytes | str, data: bytes):
        try:
            return protocol.decode(data)
        except protocol.ProtocolError as error:
            logger.warning("refusing a message: %s", error)
            self._refuse(source, protocol.request_id_of(data), str(error))
            return None

    def _refuse(self, source: bytes | str, request_id: str, reason: str, status: int = 400) -> None:
        """An ErrorReply to a client of the server socket (a peer's DEALER gets none: it is not waiting on one)."""
        if isinstance(source, bytes):
            self.reply(source, protocol.ErrorReply(request_id, status, reason))


def compat_fields(config: EngineConfig, arch, model_digest: str) -> dict:
    """The engine's share of the KV compatibility check (transfer.compat.compat_info takes these)."""
    return {"model_digest": model_digest, "dtype": config.dtype, "num_layers": arch.num_layers,
            "num_kv_heads": arch.num_kv_heads, "head_dim": arch.head_dim, "block_size": config.cache.block_size,
            "max_num_seqs": config.scheduler.max_num_seqs, "prefill_chunk_size": config.scheduler.prefill_chunk_size,
            "max_model_len": config.scheduler.max_model_len}


def node_arg_parser(role: str) -> argparse.ArgumentParser:
    """`python -m {role}_node`'s flags: one per NodeConfig field (its engine's and its transfer's included)."""
    parser = argparse.ArgumentParser(prog=f"{role}_node", description=f"CoRun {role} server")
    add_flags(parser, NodeConfig)
    return parser


def run_node(role: str, server_factory, argv: list[str] | None = None) -> int:
    """Parse flags, build the server, loop step() until SIGTERM/SIGINT."""
    args = node_arg_parser(role).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.node_id} %(levelname)s %(message)s")
    config = config_from_args(NodeConfig, args, role=role)
    if config.supervisor_pid is not None:
        end_with_supervisor(config.supervisor_pid)
    return serve(role, server_factory, config)


def kv_cache_line(engine: EngineConfig, num_blocks: int, context_tokens: int | None = None) -> str:
    """What a node's KV cache holds, as vLLM logs it at start-up: tokens, and how many requests of max_model_len fit
    at once (a resolved config); and, where the model is made for longer sequences (context_tokens), that
    --max-model-len sets the limit: it does not follow the model, as vLLM's does (the README says why)."""
    cache, sched = engine.cache, engine.scheduler
    tokens = num_blocks * cache.block_size
    line = (f"KV cache: {num_blocks} blocks of {cache.block_size} tokens = {tokens} tokens, "
            f"{tokens / sched.max_model_len:.2f}x max_model_len ({sched.max_model_len}) at once, "
            f"{sched.max_num_seqs} decode rows")
    if context_tokens is not None and context_tokens > sched.max_model_len:
        line += (f"; requests are limited to {sched.max_model_len} tokens of the model's {context_tokens} "
                 f"(--max-model-len)")
    return line


def serve(role: str, server_factory, config: NodeConfig) -> int:
    try:
        server = server_factory(config)
    except Exception as error:  # NOTE: a bad model, a port in use...: one line; the traceback at debug level
        logger.debug("start-up failed", exc_info=True)
        print(f"{role}_node {config.node_id}: error: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        return 2
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    logger.info("%s node %s serving on %s (reached at %s)", role, config.node_id, config.bind_address, config.address)
    runner = server.runner  # NOTE: the resolved shapes ('auto' settings become these on the node's device)
    sizes = getattr(runner, "decode_sizes", "vLLM's")
    decode = f"at {sizes} rows" if getattr(runner, "runs_decode", True) else "none (prefill only)"
    logger.info("%s node %s shapes: prefill %s, decode steps %s, %d (decode, pack) pairs joined", role,
                config.node_id, getattr(runner, "prefill_path", "vLLM's"), decode,
                len(getattr(runner, "joined_shapes", ())))
    context = model_context(config.engine.model)
    logger.info("%s node %s %s", role, config.node_id, kv_cache_line(
        server.config.engine, server.capacity.num_kv_blocks, None if context is None else context[0]))
    freeze_startup_heap()  # NOTE: the model's modules and the graphs' bookkeeping are never walked again
    try:
        while not stopping:
            server.step()
    except SharedWeightsError as error:  # NOTE: expected when the node holding its weights ends: one line
        print(f"{role}_node {config.node_id}: stopping: {error}", file=sys.stderr, flush=True)
        return 3
    finally:
        server.close()
    return 0
