"""Prefill server: corun prefill, FIFO; token 1 sampled here; KV leased to decode.

Isolated (the paper, and bucketed): one prompt's chunk per forward. Packed (prefill_pack_tokens): the next chunk
of several prompts in one forward of exactly T rows; a prompt's bits do not depend on its company (see
corun/model_runner.py), so the cluster gives what the colocated engine gives with the same settings.

Lifecycle of a request (queues):
  waiting (FIFO) --KV blocks for the prompt free--> prefilling (one chunk per loop turn; alone unless packed)
  prefilling --last chunk: token 1 of each of the n samples sampled, PrefillResult to the router--> leased
      (blocks kept until a deadline)
  leased --ClaimKV from a decode node--> claimed (a new deadline, kv_lease_seconds on: decode nodes end their READ
      within half of it, so a lease that outlives it has a dead or lost claimer)
  claimed --NIXL notification protocol.kv_done_notification(id) from the reading decode node--> freed
      (kv_released += 1)
  claimed --ReleaseKV from the claimer (its READ failed, timed out or was aborted)--> freed (kv_released_unread += 1)
  leased or claimed --deadline passes--> freed (lease_expiries += 1); a later claim is refused, the router re-prefills
  Abort from the router: waiting -> dropped; prefilling -> freed when its last chunk ran; leased -> freed; claimed ->
      left to the claimer (it may be reading the blocks right now) and to the deadline.
  A request every sample of which token 1 finished (stop token or max_tokens == 1) is freed at once, kv=None.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from corun.model_runner import SampledToken
from corun.request import Request
from corun.scheduler import PrefillChunk, RequestRejected, check_fits_cache, check_request, pack_prefill_chunks
from node_core.server import AgentFactory, NodeServer
from transfer.agent import KVTransferAgent
from transfer.compat import IncompatiblePeer, check_compatible
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
    aborted: bool = False
    """Aborted mid-prefill: its blocks are freed when its last chunk ran, and nobody is answered."""


@dataclass
class Lease:
    request: Request
    deadline: float
    claimed: bool = False


class PrefillServer(NodeServer):
    role = "prefill"

    def __init__(self, config: NodeConfig, agent_factory: AgentFactory = KVTransferAgent):
        super().__init__(config, agent_factory, capture_decode_graph=False)
        self.waiting: deque[PendingPrefill] = deque()
        self.prefilling: list[PendingPrefill] = []
        self.leases: dict[str, Lease] = {}
        self.num_prefills = 0
        self.num_released_unread = 0
        self.prefill_seconds_total = 0.0
        """Seconds of prefill forwards (token 1 sampled included), summed: / num_prefills = per prompt."""

    # --- the loop: schedule -> run -> postprocess -------------------------------------------------------------
    def busy(self) -> bool:
        return bool(self.prefilling or self.waiting)

    def run(self, chunks: list[PrefillChunk]) -> list:
        start = time.perf_counter()
        sampled = self.runner.run_prefill(chunks)
        self.prefill_seconds_total += time.perf_counter() - start
        return sampled

    def after_step(self) -> None:
        self.release_notified()
        self.expire_leases()

    def schedule(self) -> list[PrefillChunk]:
        """The engine's prefill forward (corun.scheduler.pack_prefill_chunks): the next chunk of the prompts being
        prefilled, then of newly admitted ones (the head of waiting, if its prompt's blocks fit)."""
        return pack_prefill_chunks(self.config.engine.scheduler, [p.request for p in self.prefilling],
                                   lambda: self.waiting[0].request if self.waiting else None, self.admit_head)

    def admit_head(self) -> Request | None:
        """NOTE: KV for the prompt alone: the decode node reserves the rest of the sequence."""
        block_ids = self.block_manager.allocate(self.waiting[0].request.num_prompt_tokens)
        if block_ids is None:
            return None
        pending = self.waiting.popleft()
        pending.request.block_ids = block_ids
        pending.queue_seconds = time.monotonic() - pending.arrived
        self.prefilling.append(pending)
        return pending.request

    def postprocess(self, sampled: list[SampledToken]) -> None:
        """Every prompt whose last chunk ran has token 1 of each sample: lease its KV and answer the router."""
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
            self.leases[request.request_id] = Lease(request, time.monotonic() + self.config.kv_lease_seconds)
        else:
            self.free(request)
        prompt_logprobs = request.prompt_logprobs if request.params.prompt_logprobs is not None else None
        self.sockets.reply(pending.router, protocol.PrefillResult(request.request_id, first_tokens, kv,
                                                                  prompt_logprobs, pending.queue_seconds))

    # --- messages -----------------------------------------------------------------------------------------------
    def on_prefill(self, identity: bytes, message: protocol.PrefillRequest) -> None:
        request = Request.create(message.request_id, message.prompt_token_ids, message.params, message.seed,
                                 self.eos_token_ids)
        try:
            self.check_admissible(request)
        except RequestRejected as error:
            self.sockets.reply(identity, protocol.ErrorReply(message.request_id, 400, str(error)))
            return
        self.waiting.append(PendingPrefill(identity, request))

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
        agent = self.agent
        self.sockets.reply(identity, protocol.HandshakeReply(
            self.config.node_id, self.compat, self.compat_hash, agent.metadata(), agent.kv_base_addresses,
            agent.num_blocks, agent.block_nbytes, agent.memory_type, agent.device_id,
            self.config.transfer.ucx_environment(vram=agent.memory_type == "VRAM"), self.instance_id,
            self.config.kv_lease_seconds))

    def on_claim(self, identity: bytes, message: protocol.ClaimKV) -> None:
        lease = self.leases.get(message.request_id)
        if lease is None or lease.claimed:
            reason = "KV lease already claimed" if lease else "unknown or expired KV lease"
            reply = protocol.ClaimReply(message.request_id, False, reason=reason)
        else:
            lease.claimed, lease.deadline = True, time.monotonic() + self.config.kv_lease_seconds
            reply = protocol.ClaimReply(message.request_id, True, tuple(lease.request.block_ids))
        self.sockets.reply(identity, reply)

    def on_release(self, identity: bytes, message: protocol.ReleaseKV) -> None:
        lease = self.leases.pop(message.request_id, None)
        if lease is not None:
            logger.info("prefill %s: lease of %s released unread: %s", self.config.node_id, message.request_id,
                        message.reason)
            self.free(lease.request)
            self.num_released_unread += 1

    def on_abort(self, identity: bytes, message: protocol.Abort) -> None:
        request_id = message.request_id
        for pending in list(self.waiting):
            if pending.request.request_id == request_id:
                self.waiting.remove(pending)
        for pending in self.prefilling:
            pending.aborted |= pending.request.request_id == request_id
        lease = self.leases.get(request_id)
        if lease is not None and not lease.claimed:
            # NOTE: a claimed lease is never freed here: a decode node may be reading its blocks right now.
            del self.leases[request_id]
            self.free(lease.request)

    handlers = {protocol.PrefillRequest: on_prefill, protocol.HandshakeRequest: on_handshake,
                protocol.ClaimKV: on_claim, protocol.ReleaseKV: on_release, protocol.Abort: on_abort,
                protocol.Ping: NodeServer.on_ping}

    # --- KV leases ------------------------------------------------------------------------------------------------
    def release_notified(self) -> None:
        for _peer, notification in self.agent.new_notifications():
            request_id = protocol.kv_done_request_id(notification)
            if request_id is None:
                continue
            lease = self.leases.pop(request_id, None)
            if lease is not None:
                self.free(lease.request)
                self.agent.counters.kv_released += 1

    def expire_leases(self) -> None:
        now = time.monotonic()
        for request_id, lease in list(self.leases.items()):
            if lease.deadline < now:
                del self.leases[request_id]
                self.free(lease.request)
                self.agent.counters.lease_expiries += 1
                logger.warning("prefill %s: KV lease of %s expired", self.config.node_id, request_id)

    ROLE_COUNTERS = ("num_prefills", "prefill_seconds_total", "num_released_unread")

    def role_stats(self) -> dict:
        return {"num_prefills": self.num_prefills, "num_waiting": len(self.waiting), "num_leased": len(self.leases),
                "num_claimed": sum(lease.claimed for lease in self.leases.values()),
                "num_released_unread": self.num_released_unread,
                "prefill_seconds_total": round(self.prefill_seconds_total, 6)}
