"""NodeServer: the part of a prefill or decode server that does not depend on its role.

A role's server subclasses it, names its lifecycle queues at the top of its own file, and adds its handlers,
its step() (schedule -> run -> postprocess) and its share of the stats. The node's side of the KV transport
(transfer/transport.py: a prefill node's sender, a decode node's receiver, none for a colocated node) is opened
here, of the transport its TransferConfig names.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import ClassVar

from corun.block_manager import make_block_manager
from corun.device_facts import resolved_on_device
from corun.model_runner import ModelRunner, SampledToken
from corun.models.loader import model_digest
from corun.request import Request
from corun.runner_interface import NodeRunner
from corun.shared_weights import WeightsWatch
from node_core.grammar_waits import GrammarWaits
from node_core.liveness import PingsWhileBusy
from node_core.serving import NodeSockets, compat_fields, engine_fingerprint, refusal
from transfer.compat import KV_LAYOUT, compat_hash, compat_info
from transfer.counters import TransferCounters
from transfer.transport import KVReceiver, KVSender, make_transport
from wire import protocol
from wire.config import EngineConfig, NodeConfig, SharedWeightsConfig, TransferConfig
from wire.iteration_tokens import STAT_KEY as ITERATION_TOKENS_KEY
from wire.iteration_tokens import IterationTokenCounts
from wire.node_auth import ClusterKey

logger = logging.getLogger(__name__)

IDLE_RECEIVE_MS = 5
"""How long an idle node waits for a message per turn (a busy one only takes what has arrived)."""
STALLED_RECEIVE_MS = 1
"""How long a node whose work waits for something outside its loop (a prefill node's prompts for blocks that leases
hold) waits for a message per turn: what frees the blocks is a message or a transport event its turn polls, so it
looks at least this often, without spinning a core."""

LOOP_PHASES = ("receive", "schedule", "run", "postprocess", "turns")

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def transfer_for_host(config: NodeConfig) -> TransferConfig:
    """The node's transfer settings, its UCX devices limited to loopback when the node binds loopback.

    NOTE: UCX's TCP transport listens on every network device it finds: a node meant for this host alone would
    otherwise take KV connections on the host's public interface too (measured: a listener on 192.0.2.2)."""
    transfer = config.transfer
    if transfer.ucx_devices or config.host not in LOOPBACK_HOSTS:
        return transfer
    return dataclasses.replace(transfer, ucx_devices=("lo",))


def make_model_runner(config: EngineConfig, runs_prefill: bool, runs_decode: bool,
                      weights: SharedWeightsConfig = SharedWeightsConfig()) -> NodeRunner:
    """runs_prefill, runs_decode: what the node's forwards do (a colocated node both); weights: its own, or shared by
    the nodes on its GPU (the native engine's)."""
    if config.backend == "vllm":
        if weights.holding != "own":
            raise ValueError("the vllm engine loads its own weights (--weights-holding own)")
        from corun.vllm_backend.runner import VllmModelRunner  # NOTE: only in scripts/setup_vllm.sh's venv

        return VllmModelRunner(config, capture_decode_graph=runs_decode)
    return ModelRunner(config, runs_prefill=runs_prefill, runs_decode=runs_decode, weights=weights)


def kv_layout(config: EngineConfig) -> str:
    """The compat field naming what a KV block's bytes mean: the native engine's layout, or vLLM's with its version and
    the hash of every vLLM setting (two vLLM builds or configurations may lay out or compute KV differently)."""
    if config.backend == "vllm":
        from corun.vllm_backend.engine_args import vllm_kv_layout

        return vllm_kv_layout(config)
    return KV_LAYOUT


def run_decode_step(runner: NodeRunner, requests: list[Request],
                    while_waiting: Callable[[], None] | None = None) -> tuple[list[SampledToken], int]:
    """The decode step of requests (a decode or colocated node's), ahead of the host where it may (async scheduling):
    -> the tokens read now (the step before's, when ahead) and the rows launched (0: every row had its last token in
    flight). while_waiting: called while the host waits for the step before (only when ahead)."""
    if runner.overlaps(requests):
        sampled = runner.run_decode_ahead(requests, while_waiting)
        launched = runner.decode_in_flight
        return sampled, 0 if launched is None else len(launched.requests)
    return runner.run_decode(requests), len(requests)


class NodeServer:
    role: ClassVar[str]
    handlers: ClassVar[dict]
    """Message type -> handler(self, client identity, message) for what arrives on the server socket."""
    handled_during_forward: ClassVar[frozenset[type]] = frozenset()
    """Messages the liveness thread handles while a forward runs (node_core/liveness.py), under the node's lock: their
    handlers touch nothing a forward uses."""
    peer_handlers: ClassVar[dict] = {}
    """Message type -> handler(self, peer address, message) for replies on the sockets this node opened to peers."""

    def __init__(self, config: NodeConfig, runs_prefill: bool = True, runs_decode: bool = True):
        # NOTE: 'auto' shapes resolve here, on the node's own device, before the fingerprint hashes them
        self.config = config = dataclasses.replace(config, engine=resolved_on_device(config.engine))
        self.instance_id = uuid.uuid4().hex
        """This process: a node restarted on the same address gets another one."""
        self.runner: NodeRunner = make_model_runner(config.engine, runs_prefill, runs_decode, config.weights)
        self.config = config = dataclasses.replace(config, engine=self.runner.config)  # NOTE: the KV budget, sized
        # NOTE: a decode node's prompt KV is read from prefill nodes, never computed here: nothing to share
        self.block_manager = make_block_manager(config.engine, self.runner.kv_cache.num_blocks,
                                                shares_prefixes=self.role != "decode")
        self.eos_token_ids = frozenset(self.runner.arch.eos_token_ids)
        digest = model_digest(config.engine.model)
        self.fingerprint = engine_fingerprint(config.engine, digest)
        self.compat = compat_info(**compat_fields(config.engine, self.runner.arch, digest),
                                  kv_layout=kv_layout(config.engine))
        self.compat_hash = compat_hash(self.compat)
        self.transport: KVSender | KVReceiver | None = make_transport(
            self.role, transfer_for_host(config), config.node_id, self.runner.kv_cache.data,
            lease_seconds=config.kv_lease_seconds, blocks=self.block_manager)
        key = None if config.cluster_key_file is None else ClusterKey.load(config.cluster_key_file)
        self.sockets = NodeSockets(config.bind_address, key)
        self.loop_seconds = dict.fromkeys(LOOP_PHASES, 0.0)
        """Seconds the loop spent per phase, summed (turns: whole turns, idle waits included): where a node's time
        goes beside its forwards (run: the forward and sampling, as the host waits for them)."""
        self.compiling = GrammarWaits(config.engine.model, self.runner.arch.vocab_size)
        """Requests whose structured-output constraint compiles off the loop (the role's own queue item each)."""
        self.model_facts = protocol.ModelFacts(config.engine.scheduler.max_model_len,
                                               self.runner.arch.vocab_size, config.engine.max_logprobs)
        cache = self.block_manager.prefix_cache
        self.capacity = protocol.NodeCapacity(config.engine.scheduler.max_num_seqs,
                                              self.block_manager.num_usable_blocks, config.engine.cache.block_size,
                                              0 if cache is None else cache.chunk_size)
        self.lock = threading.Lock()
        """Held by the loop for its whole turn but the forward: whoever holds it may use the node's state and server
        socket (the liveness thread answers pings with it while a long forward runs)."""
        self.forward_started: float | None = None
        """time.monotonic() when the forward now running started; None between forwards."""
        self.pings_while_busy = PingsWhileBusy(self)
        self.iteration_tokens = IterationTokenCounts()
        self.frees_after_step: list[Request] = []
        """Requests whose blocks wait for the decode step in flight to be read (free)."""
        """Tokens each forward computed (vLLM's vllm:iteration_tokens_total, summed over the nodes by the router)."""

    def receive(self, timeout_ms: int) -> None:
        self.sockets.dispatch(self, timeout_ms)

    def on_ping(self, identity: bytes, message: protocol.Ping) -> None:
        self.sockets.reply(identity, protocol.Pong(message.nonce, self.config.node_id, self.role, self.fingerprint,
                                                   self.model_facts, self.stats(), self.counters, self.instance_id,
                                                   self.capacity))

    def free(self, request: Request) -> None:
        """Return a request's KV blocks (if it still holds any) to the pool: its own are freed, the prefix cache's
        chunks it held are let go (kept, evictable once nobody holds them). A request in the decode step in flight
        keeps them until that step is read (free_settled): the step still writes its KV, and blocks given to a new
        request may be written by a KV transfer that does not wait for this process's kernels."""
        in_flight = self.runner.decode_in_flight
        if in_flight is not None and in_flight.holds(request):
            self.frees_after_step.append(request)
        elif request.block_ids:
            self.block_manager.release(request)

    def free_settled(self) -> None:
        """Free what waited for the decode step in flight, now that the step it was in has been read."""
        waiting, self.frees_after_step = self.frees_after_step, []
        for request in waiting:
            self.free(request)

    def on_reset_prefix_cache(self, identity: bytes, message: protocol.ResetPrefixCache) -> None:
        """Forget every cached prompt chunk; chunks requests still hold (a lease being read) are freed when they end."""
        freed = self.block_manager.reset_prefix_cache()
        self.sockets.reply(identity, protocol.PrefixCacheReset(message.nonce, self.config.node_id, freed))

    def stats(self) -> dict:
        blocks = self.block_manager
        loop = {f"loop_{phase}_seconds_total": round(seconds, 6) for phase, seconds in self.loop_seconds.items()}
        return {**self.role_stats(), **loop, "num_free_blocks": blocks.num_free_blocks,
                "num_usable_blocks": blocks.num_usable_blocks,
                "num_pongs_while_busy": self.pings_while_busy.num_answered,
                "num_handled_during_forward": self.pings_while_busy.num_handled,
                "forward_running_seconds": round(self.forward_seconds(), 3),
                "kv_cache_usage_perc": round(1 - blocks.num_free_blocks / blocks.num_usable_blocks, 6),
                **self.prefix_cache_stats(), **self.prefix_cache_gauges(),
                ITERATION_TOKENS_KEY: self.iteration_tokens.as_stat(),
                **self.runner.forward_counts(), **self.transfer_counters.as_dict()}

    def role_stats(self) -> dict:
        raise NotImplementedError

    def prefix_cache_stats(self) -> dict:
        """vLLM's prefix cache counters, in prompt tokens (0 where there is no cache: a decode node, or turned off)."""
        cache = self.block_manager.prefix_cache
        return {"prefix_cache_queries": 0 if cache is None else cache.num_queried_tokens,
                "prefix_cache_hits": 0 if cache is None else cache.num_hit_tokens}

    def prefix_cache_gauges(self) -> dict:
        cache = self.block_manager.prefix_cache
        return {"prefix_caching_enabled": int(cache is not None),
                "num_cached_chunks": 0 if cache is None else len(cache.chunks)}

    ROLE_COUNTERS: ClassVar[tuple[str, ...]] = ()
    """The role's stats that only ever grow."""

    @functools.cached_property
    def counters(self) -> tuple[str, ...]:
        """Stats that only ever grow: the transfer counters, the forward counts and the role's (fixed names)."""
        loop = {f"loop_{phase}_seconds_total" for phase in LOOP_PHASES}
        return tuple(sorted({*self.transfer_counters.as_dict(), *self.runner.forward_counts(), *self.ROLE_COUNTERS,
                             *loop, "num_pongs_while_busy", "num_handled_during_forward",
                             *self.prefix_cache_stats()}))

    @property
    def transfer_counters(self) -> TransferCounters:
        """The transport's counters; a colocated node's are zeros (it moves no KV), so every node has the names."""
        return TransferCounters() if self.transport is None else self.transport.counters

    # --- the loop: schedule -> run -> postprocess (the role fills each in) ------------------------------------
    def step(self) -> None:
        """One turn: the messages that arrived (waiting a little only when idle), one forward, the timers; under
        self.lock but for the forward."""
        with self.lock:
            self.turn()

    def turn(self) -> None:
        loop = self.loop_seconds
        started = time.perf_counter()
        self.receive(timeout_ms=self.receive_timeout_ms())
        received = time.perf_counter()
        batch = self.schedule()
        scheduled = time.perf_counter()
        if batch:
            forward_started = time.monotonic() if self.config.log_prefill_batches else 0.0
            sampled = self.run_unlocked(batch)
            self.check_weights()
            ran = time.perf_counter()
            if self.config.log_prefill_batches:
                self.log_prefill_forward(batch, forward_started, ran - scheduled)
            # NOTE: vLLM's count: the prompt tokens the forward computed plus the tokens it sampled
            num_tokens = self.iteration_tokens_of(batch, sampled)
            if num_tokens:  # NOTE: 0: no forward launched (every row had its last token in flight)
                self.iteration_tokens.observe(num_tokens)
            self.postprocess(batch, sampled)
            self.free_settled()
            loop["run"] += ran - scheduled
            loop["postprocess"] += time.perf_counter() - ran
        self.after_step()
        loop["receive"] += received - started
        loop["schedule"] += scheduled - received
        loop["turns"] += time.perf_counter() - started

    def log_prefill_forward(self, batch, started: float, seconds: float) -> None:
        """The prefill batch line (NodeSettings.log_prefill_batches) of a forward that ran prompt chunks."""
        chunks = self.prefill_chunks_of(batch)
        if not chunks:
            return
        first_pieces = [c for c in chunks if c.start == c.request.num_cached_tokens]
        logger.info("%s prefill forward at %.4f (monotonic) took %.1f ms: #seq %d (%d new, %d finishing), "
                    "#token %d, #cached-token %d, #decode-row %d, #queue-req %d", self.config.node_id, started,
                    seconds * 1e3, len(chunks), len(first_pieces), sum(c.is_last for c in chunks),
                    sum(c.num_tokens for c in chunks), sum(c.request.num_cached_tokens for c in first_pieces),
                    self.decode_rows_of(batch), self.num_waiting())

    def prefill_chunks_of(self, batch) -> list:
        """The prompt chunks a batch (what schedule() returned) runs: none where the role runs no prefill."""
        return []

    def decode_rows_of(self, batch) -> int:
        """The decode rows a batch runs beside its prompt chunks."""
        return 0

    def num_waiting(self) -> int:
        """Requests waiting to start."""
        return 0

    def check_weights(self) -> None:
        """Where this node maps another's weights: stop (SharedWeightsError) if that node has begun to exit. Called
        once a forward's outputs are on the host, before they leave the node."""
        watch: WeightsWatch | None = getattr(self.runner, "weights_watch", None)  # NOTE: the vLLM runner has none
        if watch is not None:
            watch.check()

    def read_decode_in_flight(self) -> list[SampledToken]:
        """The tokens of the decode step in flight (none: []), checked as a forward's are (check_weights)."""
        sampled = self.runner.finish_decode_in_flight()
        self.check_weights()
        return sampled

    def forward_seconds(self) -> float:
        """How long the forward now running has run (0 between forwards): a loop hung in one shows here, while its
        pings are still answered."""
        started = self.forward_started
        return 0.0 if started is None else time.monotonic() - started

    def run_unlocked(self, batch: list) -> list:
        """run(batch) with self.lock released: a long forward's pings are answered meanwhile (node_core/liveness.py).
        NOTE: run() touches neither the server socket nor what stats() reads but the forward counts."""
        self.forward_started = time.monotonic()
        self.lock.release()
        try:
            return self.run(batch)
        finally:
            self.lock.acquire()
            self.forward_started = None

    def busy(self) -> bool:
        raise NotImplementedError

    def receive_timeout_ms(self) -> int:
        """How long this turn waits for a message: not at all while there is work to run."""
        return 0 if self.busy() else IDLE_RECEIVE_MS

    def schedule(self) -> list:
        raise NotImplementedError

    def run(self, batch: list) -> list:
        raise NotImplementedError

    def num_prompt_tokens(self, batch) -> int:
        """Prompt tokens the forward of batch computes (its chunks'), for the default iteration_tokens_of."""
        raise NotImplementedError

    def iteration_tokens_of(self, batch, sampled: list) -> int:
        """The tokens the forward launched this turn computes: its prompt tokens and a token per row it samples
        (vLLM's count per engine step, vllm:iteration_tokens_total)."""
        return self.num_prompt_tokens(batch) + len(sampled)

    def postprocess(self, batch, sampled: list) -> None:
        """After the forward of batch (what schedule() returned), with what it sampled."""
        raise NotImplementedError

    def after_step(self) -> None:
        """Timers and releases that do not wait for a forward."""

    def take_compiled(self) -> list:
        """The items (the role's queue entries) whose grammar finished compiling, in arrival order; a constraint that
        does not compile is refused here."""
        ready, refused = self.compiling.take_finished()
        for entry, error in refused:
            self.sockets.reply(entry.router, refusal(entry.request_id, error))
            self.drop_refused(entry.item)
        return ready

    def drop_refused(self, item) -> None:
        """What else the node holds of an item refused (its constraint does not compile): nothing, where the item
        waits in the compiling queue alone."""

    def close(self) -> None:
        self.compiling.close()
        self.pings_while_busy.stop()
        self.sockets.close()
        if self.transport is not None:
            self.transport.close()
