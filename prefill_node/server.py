"""Prefill server: fixed_shape prefill, tenants in turn (each one's prompts FIFO, those the prefix cache serves
first); token 1 sampled here; KV leased to decode.

Isolated (the paper, and bucketed): one prompt's chunk per forward. Packed (prefill_pack_tokens): the next chunk
of several prompts in one forward of exactly T rows; a prompt's bits do not depend on its company (see
corun/model_runner.py), so the cluster gives what the colocated engine gives with the same settings.

Lifecycle of a request (queues; the leases are the KV transport's sender, self.transport: transfer/leases.py):
  compiling (a structured-output constraint not compiled yet: on a worker thread, node_core/grammar_waits.py)
      --compiled--> waiting; --does not compile--> ErrorReply(400)
  waiting (tenant by tenant, each one's prompts the prefix cache serves first: fair_order) --KV blocks for the
      prompt free--> prefilling (one chunk per loop turn; alone unless packed; from the end of the prompt's longest
      cached full-chunk prefix, whose chunks it holds: corun/prefix_cache.py)
  prefilling --last chunk: token 1 of each of the n samples sampled, PrefillResult to the router--> leased
      (blocks kept until a deadline)
  leased --ClaimKV from a decode node--> claimed (a new deadline, kv_lease_seconds on: decode nodes end their READ
      within half of it, so a lease that outlives it has a dead or lost claimer)
  claimed --the transport's done notification (protocol.KVReadDone) from the reading decode node-->
      freed (kv_released += 1)
  claimed --ReleaseKV from the claimer (its READ failed, timed out or was aborted)--> freed (num_released_unread += 1)
  claimed --InstanceGone from a router naming the claimer's process (ClaimKV's node id and instance id: the decode
      node was replaced on its address, so that process left its loop or died and reads nothing more)-->
      freed (num_released_unread += 1); leases claimed by any other process are left alone
  leased or claimed --deadline passes--> freed (lease_expiries += 1); a later claim is refused, the router re-prefills
  A PrefillRequest of an id the node holds in any of these (but aborted) is a 409: later messages name a request by
  its id.
  Abort from the router (the client left, or the decode ended before its decode node read the KV: a refusal, a
      failure, a lost node): waiting -> dropped; prefilling -> freed when its last chunk ran; leased -> freed;
      claimed -> left to the claimer (it may be reading the blocks right now), to InstanceGone and to the deadline.
  A request every sample of which token 1 finished (stop token or max_tokens == 1) is freed at once, kv=None.
A decode node's handshake gets this node's compat facts and the transport's own fields (its handshake payload).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from corun.model_runner import SampledToken
from corun.request import Request
from corun.scheduler import PrefillChunk, RequestRejected, check_fits_cache, check_request, pack_prefill_chunks
from corun.waiting_order import CachedFirst
from node_core.grammar_waits import GrammarWaits
from node_core.server import STALLED_RECEIVE_MS, NodeServer
from node_core.serving import refusal
from node_core.tenant_turns import TenantTurns
from transfer.compat import IncompatiblePeer, check_compatible
from transfer.leases import Claimer
from transfer.transport import KVSender
from wire import protocol
from wire.config import NodeConfig

logger = logging.getLogger(__name__)


@dataclass
class PendingPrefill:
    router: bytes
    request: Request
    arrived: float = field(default_factory=time.monotonic)
    queue_seconds: float = 0.0
    """From arrival to admission (its first chunk scheduled)."""
    tenant: str = ""
    """The router's client of the request (PrefillRequest.tenant)."""
    aborted: bool = False
    """Aborted mid-prefill: its blocks are freed when its last chunk ran, and nobody is answered."""


class PrefillServer(NodeServer):
    role = "prefill"
    transport: KVSender
    compiling: GrammarWaits[PendingPrefill]

    def __init__(self, config: NodeConfig):
        super().__init__(config, runs_decode=False)
        self.waiting: deque[PendingPrefill] = deque()
        self.prefilling: list[PendingPrefill] = []
        self.num_prefills = 0
        self.turns = TenantTurns()
        self.cached_first = CachedFirst(self.block_manager)
        self.prefill_seconds_total = 0.0
        """Seconds of prefill forwards (token 1 sampled included), summed: / num_prefills = per prompt."""
        self.stalled = False
        """The last schedule found prompts waiting and none it could start: their blocks are held by leases."""

    # --- the loop: schedule -> run -> postprocess -------------------------------------------------------------
    def busy(self) -> bool:
        return bool(self.prefilling or self.waiting)

    def receive_timeout_ms(self) -> int:
        """NOTE: prompts waiting for blocks wait for a lease to end (a message, or a read seen by after_step's poll):
        a turn that took only what had arrived spun a core at 66-68k turns a second on this repository's 2-core host,
        two thirds of it in schedule (benchmarks/results/cpu_prefill_stall_turns_stop56.json: 870 turns and 0.07
        CPU-s a second with the wait), and spent 3.1 s of a 12-s 1P1D run on one H100 in schedule
        (h100_front_door_stop56.json)."""
        return STALLED_RECEIVE_MS if self.stalled else super().receive_timeout_ms()

    def run(self, chunks: list[PrefillChunk]) -> list:
        start = time.perf_counter()
        sampled = self.runner.run_prefill(chunks)
        self.prefill_seconds_total += time.perf_counter() - start
        return sampled

    def num_prompt_tokens(self, chunks: list[PrefillChunk]) -> int:
        return sum(chunk.num_tokens for chunk in chunks)

    def prefill_chunks_of(self, chunks: list[PrefillChunk]) -> list[PrefillChunk]:
        return chunks

    def num_waiting(self) -> int:
        return len(self.waiting)

    def after_step(self) -> None:
        """The leases that ended: read by their claimer, or past their deadline."""
        for lease in self.transport.poll():
            self.free(lease.holder)

    def schedule(self) -> list[PrefillChunk]:
        """The engine's prefill forward (corun.scheduler.pack_prefill_chunks): the next chunk of the prompts being
        prefilled, then of newly admitted ones (waiting in fair_order, while their prompts' blocks fit)."""
        self.waiting.extend(self.take_compiled())
        chunks = pack_prefill_chunks(self.config.engine.scheduler, self.block_manager,
                                     [p.request for p in self.prefilling], (p.request for p in self.fair_order()),
                                     self.admit, multi_chunk=self.runner.multi_chunk_prefill)
        if chunks:
            self.cached_first.forward_ran()
        self.stalled = not chunks and bool(self.waiting)
        return chunks

    def fair_order(self) -> list[PendingPrefill]:
        """The waiting prompts in the order they may start: tenant by tenant (node_core/tenant_turns.py), each
        tenant's those the prefix cache serves first (corun/waiting_order.py)."""
        waiting = self.cached_first.order(self.waiting, lambda pending: pending.request)
        active = {p.tenant for p in self.waiting} | {p.tenant for p in self.prefilling}
        return self.turns.order(list(waiting), lambda pending: pending.tenant, active)

    def admit(self, request: Request) -> bool:
        """NOTE: KV for the prompt alone (its longest cached full-chunk prefix held, the rest new): the decode node
        reserves the rest of the sequence."""
        if not self.block_manager.allocate_request(request, request.num_prompt_tokens):
            return False
        pending = next(p for p in self.waiting if p.request is request)
        self.waiting.remove(pending)
        pending.queue_seconds = time.monotonic() - pending.arrived
        self.turns.admitted(pending.tenant)
        self.prefilling.append(pending)
        return True

    def postprocess(self, chunks: list[PrefillChunk], sampled: list[SampledToken]) -> None:
        """The full chunks the forward completed go to the prefix cache; every prompt whose last chunk ran has token 1
        of each sample: lease its KV (the cached chunks it holds too: held until the lease ends) and answer the
        router."""
        for chunk in chunks:
            self.block_manager.cache_prefilled(chunk.request, chunk.start, chunk.start + chunk.num_tokens)
        finished: dict[int, list[SampledToken]] = {}
        for item in sampled:
            finished.setdefault(id(item.request), []).append(item)
        for pending in [p for p in self.prefilling if id(p.request) in finished]:
            self.prefilling.remove(pending)
            self.finish_prefill(pending, finished[id(pending.request)])

    def finish_prefill(self, pending: PendingPrefill, samples: list[SampledToken]) -> None:
        request = pending.request
        first_tokens = [protocol.FirstToken(item.index, item.token_id, item.logprobs,
                                            request.finish_reason_for(item.token_id, 1)) for item in samples]
        self.num_prefills += 1
        if pending.aborted:
            self.free(request)
            return
        kv = None
        if any(first.finish_reason is None for first in first_tokens):
            kv = protocol.KVHandle(self.config.node_id, self.config.address, tuple(request.block_ids),
                                   request.num_prompt_tokens, self.compat_hash, self.instance_id)
            self.transport.lease(request.request_id, request, request.block_ids)
        else:
            self.free(request)
        prompt_logprobs = request.prompt_logprobs if request.params.prompt_logprobs is not None else None
        self.sockets.reply(pending.router, protocol.PrefillResult(request.request_id, first_tokens, kv,
                                                                  prompt_logprobs, pending.queue_seconds,
                                                                  request.num_cached_tokens))

    # --- messages -----------------------------------------------------------------------------------------------
    def on_prefill(self, identity: bytes, message: protocol.PrefillRequest) -> None:
        if self.holds(message.request_id):
            # NOTE: leases, aborts and claims name a request by its id: a second one would take the first's place
            # and its blocks would never come back
            self.sockets.reply(identity, protocol.ErrorReply(
                message.request_id, 409, f"request id {message.request_id!r} is already in use on prefill node "
                                         f"{self.config.node_id} (waiting, prefilling, or its KV leased)"))
            return
        request = Request.create(message.request_id, message.prompt_token_ids, message.params, message.seed,
                                 self.eos_token_ids)
        try:
            self.check_admissible(request)
        except RequestRejected as error:
            self.sockets.reply(identity, refusal(message.request_id, error))
            return
        pending = PendingPrefill(identity, request, tenant=message.tenant)
        if message.params.structured is None:
            self.waiting.append(pending)
        else:
            self.compiling.add(pending, identity, message.request_id, message.params.structured, [request],
                               message.tenant)

    def holds(self, request_id: str) -> bool:
        """Whether a request of this id is waiting, prefilling or leased here. NOTE: one aborted mid-prefill does not
        count: nothing names it by its id again (its blocks are freed as its last chunk ends), and a client that
        gave up on it may send its id again at once."""
        return request_id in self.transport.leases or self.compiling.holds(request_id) or any(
            pending.request.request_id == request_id and not pending.aborted
            for pending in itertools.chain(self.waiting, self.prefilling))

    def check_admissible(self, request: Request) -> None:
        check_request(request.request_id, request.prompt_token_ids, request.params, self.config.engine,
                      self.runner.arch.vocab_size)
        check_fits_cache(request.request_id, self.block_manager, request.num_prompt_tokens)

    def on_handshake(self, identity: bytes, message: protocol.HandshakeRequest) -> None:
        try:
            check_compatible(self.compat, message.compat, message.node_id)
        except IncompatiblePeer as error:
            logger.error("prefill %s: refusing %s", self.config.node_id, error)
            self.sockets.reply(identity, protocol.HandshakeRefused(self.config.node_id, str(error)))
            return
        self.sockets.reply(identity, protocol.HandshakeReply(
            self.config.node_id, self.compat, self.compat_hash, self.transport.transport,
            self.transport.handshake_payload(), self.instance_id, self.config.kv_lease_seconds))

    def on_claim(self, identity: bytes, message: protocol.ClaimKV) -> None:
        claim = self.transport.claim(message.request_id, Claimer(message.node_id, message.instance_id))
        self.sockets.reply(identity, protocol.ClaimReply(message.request_id, claim.ok, claim.block_ids, claim.reason))

    def on_release(self, identity: bytes, message: protocol.ReleaseKV) -> None:
        lease = self.transport.release(message.request_id, message.reason)
        if lease is not None:
            self.free(lease.holder)

    def on_instance_gone(self, identity: bytes, message: protocol.InstanceGone) -> None:
        """A decode process is gone (a router saw another instance answer on its address): none of the leases it
        claimed will be read, and their blocks come back now rather than at their deadline."""
        claimer = Claimer(message.node_id, message.instance_id)
        reason = f"its claimer {message.node_id} (instance {message.instance_id[:8]}) is gone"
        for lease in self.transport.release_claims_of(claimer, reason):
            self.free(lease.holder)

    def on_abort(self, identity: bytes, message: protocol.Abort) -> None:
        request_id = message.request_id
        for pending in self.compiling.items():
            if pending.request.request_id == request_id:
                self.compiling.remove(pending)
        for pending in list(self.waiting):
            if pending.request.request_id == request_id:
                self.waiting.remove(pending)
        for pending in self.prefilling:
            pending.aborted |= pending.request.request_id == request_id
        lease = self.transport.abort(request_id)  # NOTE: only an unclaimed one: a claimed lease may be being read
        if lease is not None:
            self.free(lease.holder)

    handled_during_forward = frozenset({protocol.ClaimKV, protocol.PrefillRequest})
    """A decode node's claim names a lease that no forward touches: answered while a prefill forward runs, so the
    hand-off does not wait for it (on_claim changes the lease's state only). A new prompt is read, checked and
    queued meanwhile too (on_prefill touches the waiting queue only, which no forward reads), as vLLM's engine core
    takes requests in on a thread of its own: a burst's prompts are not taken in between forwards, with the GPU
    idle."""
    handlers = {protocol.PrefillRequest: on_prefill, protocol.HandshakeRequest: on_handshake,
                protocol.ClaimKV: on_claim, protocol.ReleaseKV: on_release, protocol.Abort: on_abort,
                protocol.InstanceGone: on_instance_gone, protocol.Ping: NodeServer.on_ping,
                protocol.ResetPrefixCache: NodeServer.on_reset_prefix_cache}

    ROLE_COUNTERS = ("num_prefills", "prefill_seconds_total", "num_released_unread")

    def role_stats(self) -> dict:
        leases = self.transport.leases
        # NOTE: vLLM counts a request waiting for its grammar as waiting
        return {"num_prefills": self.num_prefills, "num_waiting": len(self.waiting) + len(self.compiling),
                "num_compiling_grammars": len(self.compiling), "num_leased": len(leases),
                "num_claimed": sum(lease.claimed for lease in leases.values()),
                "num_released_unread": self.transport.num_released_unread,
                "prefill_seconds_total": round(self.prefill_seconds_total, 6)}
