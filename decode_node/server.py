"""Decode server: N fixed slots, KV pulled from prefill nodes (NIXL READs), one fixed-shape decode step, streaming.

Lifecycle of a request (queues; the KV moves by the transport's receiver, self.transport: transfer/transport.py):
  compiling (a structured-output constraint compiling on a worker thread, node_core/grammar_waits.py: beside the
      queues below, from arrival on, so that the KV is read meanwhile and the prefill node's lease is not spent on
      the compile) --does not compile--> ErrorReply(400), dropped from whichever queue holds it
  waiting (FIFO DecodeRequests) --a slot, KV blocks for the prompt free, and the whole sequences (prompt + max_tokens)
      of all admitted within the KV cache and the swap space (corun/kv_swap.py); none paused--> claiming
  claiming (handshake with the prefill node first, if new: the receiver adds the peer from its payload and times a
      probe READ; ClaimKV, naming this process) --ClaimReply ok--> transferring
  transferring (READ of its blocks into ours, polled each turn and while a decode step runs) --DONE; the transport
      notifies the prefill node, which frees its copy; token 1 (sampled by prefill) streamed--> running
      --DONE, its grammar still compiling--> awaiting_grammar --compiled; token 1 streamed--> running
  running (the N-row decode step; one StepTokens per router per step, a TokenEvent per request in it; a block more
      whenever its next token needs one) --stop / length / abort--> finished: slot + blocks free
  running --the cache is out of blocks for a sample's next token, or short of a block free per running sample: the
      newest's blocks (all that the swap space takes) copied to host memory, free once the copy ends--> paused
      (holding its slot; the oldest sample is never paused)
  paused --room for its blocks again (oldest first, before any new admission): copied back--> running
  refused handshake, refused claim (lease expired), a claim unanswered for CLAIM_TIMEOUT_S, KV of a restarted
      prefill instance, a failed READ or one past half the peer's lease --> ErrorReply(503) to the router, blocks
      free; a claimed lease it will not read goes back to the prefill node at once (ReleaseKV)
A DecodeRequest of an id the node holds in any of these is a 409: every later message names the request by its id.
A request with n samples holds n slots and n KV reservations from admission on; the prompt's KV is read once, into
the first sample's blocks, and copied to the others' before they run (each sample is then a request of its own).
Slots in use = claiming + transferring + awaiting_grammar + running + paused <= N, so an admitted request always has
a decode row.
While the host waits for a decode step, the node takes DecodeRequests and the prefill nodes' replies and moves the
first three queues on (pull_kv_during_step), so a hand-off does not wait for a step to end.
Async scheduling (corun/decode_ahead.py): a decode step is launched before the previous one's tokens are read and
streamed, so a sample learns it finished (or is aborted) one step late; that step's token of it is dropped, and its
blocks are freed once no step in flight writes them (NodeServer.free).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from corun.kv_swap import HostSwap, swap_capacity_blocks
from corun.model_runner import SampledToken
from corun.request import Request
from corun.scheduler import RequestRejected, allocate_all, check_fits_cache, check_request, check_samples_fit
from decode_node.jobs import DecodeJob, RunningSample
from decode_node.kv_growth import KVGrowth
from node_core.grammar_waits import GrammarWaits
from node_core.server import NodeServer, run_decode_step
from node_core.serving import refusal
from transfer.compat import IncompatiblePeer, check_compatible
from transfer.transport import KVReceiver
from wire import protocol
from wire.config import NodeConfig
from wire.seeding import sample_seed

logger = logging.getLogger(__name__)

CLAIM_TIMEOUT_S = 10.0
"""A prefill node answers a handshake or claim at its next loop turn: 10 s of silence means it is gone."""


@dataclass
class PrefillPeer:
    address: str
    ready: bool = False
    instance_id: str = ""
    """The prefill process the handshake reached; KV handles of another instance are not its."""
    lease_seconds: float = 60.0
    """The peer keeps a claimed lease this long: reads from it are given up after half of it."""
    num_blocks: int = 0
    jobs_waiting: list[DecodeJob] = field(default_factory=list)
    """Jobs admitted before the handshake with this peer completed."""


class DecodeServer(KVGrowth, NodeServer):
    role = "decode"
    transport: KVReceiver
    compiling: GrammarWaits[DecodeJob]

    def __init__(self, config: NodeConfig):
        super().__init__(config, runs_prefill=False)  # NOTE: its prompts' KV is read from prefill nodes
        self.max_num_seqs = self.config.engine.scheduler.max_num_seqs  # NOTE: resolved (auto: by device)
        self.peers: dict[str, PrefillPeer] = {}
        self.waiting: deque[DecodeJob] = deque()
        self.claiming: dict[str, DecodeJob] = {}
        self.transferring: dict[str, DecodeJob] = {}
        self.awaiting_grammar: dict[str, DecodeJob] = {}
        """Read, their constraint still compiling."""
        self.running: list[RunningSample] = []
        self.paused: list[RunningSample] = []
        """Oldest first."""
        self.swap = HostSwap(self.runner.kv_cache, swap_capacity_blocks(self.config.engine, self.runner.kv_cache))
        self.samples_started = itertools.count()
        self.num_preemptions = 0
        self.num_decode_steps = 0
        self.num_decoded_rows = 0
        """Running requests summed over decode steps: / num_decode_steps = how many shared a step on average."""
        self.num_finished = 0
        self.rows_launched = 0
        """By this turn's decode step (0: none launched, every row's last token in flight)."""
        self.num_blocks_quarantined = 0
        """Blocks a timed-out READ that the transport would not release may still write: never reused."""

    # --- the loop: schedule -> run -> postprocess -------------------------------------------------------------
    def busy(self) -> bool:
        return bool(self.running or self.transferring or self.paused) or self.runner.decode_in_flight is not None

    def schedule(self) -> list[Request]:
        """Admit what fits, advance the KV reads; the step decodes every running sample."""
        self.start_compiled(self.take_compiled())
        self.free_copied()
        self.resume_paused()
        self.admit()
        self.expire_claims()
        self.poll_transfers()
        self.grow_running()
        requests = self.ready_to_step()
        if self.runner.decode_in_flight is not None and not self.runner.overlaps(requests):
            # NOTE: this step needs the tokens in flight on the host (or nothing runs): read and stream them
            self.postprocess(requests, self.read_decode_in_flight())
            self.free_settled()
            requests = self.ready_to_step()
        return requests

    def run(self, requests: list[Request]) -> list[SampledToken]:
        sampled, self.rows_launched = run_decode_step(self.runner, requests, self.pull_kv_during_step)
        self.num_decode_steps += self.rows_launched > 0
        self.num_decoded_rows += self.rows_launched
        return sampled

    def iteration_tokens_of(self, requests: list[Request], sampled: list[SampledToken]) -> int:
        """A token per row the step launched. NOTE: ahead of the host (async scheduling), sampled holds the step
        before's tokens: counted by them, a request of 10 tokens made 11 iterations, the first of 0 tokens (vLLM's
        test_metrics_counts)."""
        return self.rows_launched

    def admit(self) -> None:
        """FIFO: the head job is admitted when all its samples have a slot and KV blocks for the prompt and token 1, and
        the whole sequences of everything admitted fit the cache and the swap space; never while a sample is paused
        (it comes back first)."""
        while self.waiting and not self.paused and \
                self.num_seqs_admitted + len(self.waiting[0].samples) <= self.max_num_seqs:
            job = self.waiting[0]
            if self.blocks_promised() + sum(self.whole_blocks(r) for r in job.samples.values()) > \
                    self.block_manager.num_usable_blocks + self.swap.capacity_blocks:
                return
            first_tokens = [r.num_prompt_tokens + 1 for r in job.samples.values()]
            # NOTE: beyond the cache (swap space), grow_running's reserve is left: a block for each running sample's
            # next tokens, so that a new request does not pause the running ones at once
            reserve = len(self.running) if self.swap.capacity_blocks else 0
            if sum(map(self.block_manager.blocks_needed, first_tokens)) + reserve > self.block_manager.num_free_blocks:
                return
            allocated = allocate_all(self.block_manager, first_tokens)
            if allocated is None:
                return
            self.waiting.popleft()
            for request, block_ids in zip(job.samples.values(), allocated, strict=True):
                request.block_ids = block_ids
            self.claim(job)

    def pull_kv_during_step(self) -> None:
        """While the host waits for a decode step (run, lock released): take new requests and the prefill nodes'
        replies, claim and post READs, and start what has been read.

        NOTE: a READ posted at a turn's start and polled only at the next turn's was seen done a whole step late
        (the hand-off measured the loop's turn, not the copy); a request read meanwhile still joins the next step,
        as before, but its claim, READ and token 1 no longer wait for the step. Nothing here frees blocks a step in
        flight writes: only requests in no step (waiting, claiming, transferring) are touched; an Abort, which may
        end a running request, waits for the loop's turn."""
        with self.lock:
            self.sockets.dispatch_peer_replies(self)
            # NOTE: once a message is held for the turn, later ones wait behind it: the router's messages keep their
            # order (an Abort, then the same id sent again)
            for identity, message in [] if self.sockets.held else self.sockets.take_server_messages():
                if type(message) is protocol.DecodeRequest and not self.sockets.held:
                    self.sockets.handle(self, identity, message)
                else:
                    self.sockets.hold(identity, message)
            self.admit()
            self.poll_transfers()

    @property
    def num_seqs_admitted(self) -> int:
        return sum(len(job.samples) for job in self.admitted_jobs()) + len(self.running) + len(self.paused)

    def postprocess(self, requests: list[Request], sampled: list[SampledToken]) -> None:
        # NOTE: a sample paused since its step was launched still takes that step's token
        samples = {id(sample.request): sample for sample in [*self.running, *self.paused]}
        step_events: dict[bytes, list[protocol.TokenEvent]] = {}
        for item in sampled:
            sample = samples.get(id(item.request))
            if sample is None:  # NOTE: ended or aborted while its step ran ahead
                continue
            finish_reason = item.request.append_token(item.token_id, item.logprobs)
            event = token_event(sample.job, sample.index, [item.token_id], item.logprobs, finish_reason)
            step_events.setdefault(sample.job.router, []).append(event)
            if finish_reason is not None:
                self.finish(sample)
        for router, events in step_events.items():
            self.sockets.reply(router, protocol.StepTokens(events))

    # --- pulling KV ---------------------------------------------------------------------------------------------
    def claim(self, job: DecodeJob) -> None:
        self.claiming[job.request_id] = job
        job.claimed_at = time.monotonic()
        peer = self.peers.get(job.kv.node_id)
        if peer is not None and peer.ready and job.kv.instance_id != peer.instance_id:
            # NOTE: the KV comes from another process than the one handshaken (restarted on its address): what the
            # transport knows of it is stale; handshake again, and the new handshake tells whether this KV still exists.
            self.forget_peer(job.kv.node_id)
            peer = None
        if peer is None:
            peer = self.peers[job.kv.node_id] = PrefillPeer(job.kv.address)
            self.sockets.send_peer(peer.address, protocol.HandshakeRequest(self.config.node_id, self.compat))
        if peer.ready:
            self.sockets.send_peer(peer.address, self.claim_message(job))
        else:
            peer.jobs_waiting.append(job)

    def claim_message(self, job: DecodeJob) -> protocol.ClaimKV:
        """The claim names this process: the prefill node ends its leases at once if it is known to be gone."""
        return protocol.ClaimKV(job.request_id, self.config.node_id, self.instance_id)

    def on_handshake_reply(self, address: str, reply: protocol.HandshakeReply) -> None:
        peer = self.peers.get(reply.node_id)
        if peer is None or peer.address != address:  # NOTE: forgotten meanwhile (its jobs failed), or not ours
            return
        try:
            check_compatible(self.compat, reply.compat, reply.node_id)
            peer.num_blocks = self.transport.add_peer(reply.node_id, reply.transport, reply.transport_payload)
        except IncompatiblePeer as error:
            self.fail_peer(reply.node_id, str(error))
            return
        peer.ready, peer.instance_id, peer.lease_seconds = True, reply.instance_id, reply.lease_seconds
        for job in peer.jobs_waiting:
            if job.kv.instance_id != reply.instance_id:
                self.claiming.pop(job.request_id, None)
                self.fail(job, f"prefill node {reply.node_id} restarted: the KV of {job.request_id} is gone")
            else:
                self.sockets.send_peer(address, self.claim_message(job))
        peer.jobs_waiting.clear()

    def on_claim_reply(self, address: str, reply: protocol.ClaimReply) -> None:
        job = self.claiming.pop(reply.request_id, None)
        if job is None:
            if reply.ok:  # NOTE: a claim this node no longer wants (its job failed meanwhile): give it back
                self.sockets.send_peer(address, protocol.ReleaseKV(reply.request_id, "no longer wanted"))
            return
        if not reply.ok:
            self.fail(job, f"KV of {reply.request_id} could not be claimed: {reply.reason}")
            return
        problem = self.claimed_kv_problem(job, reply)
        if problem:
            # NOTE: claimed but never to be read: the prefill node frees it now, not at the lease's deadline
            self.sockets.send_peer(address, protocol.ReleaseKV(reply.request_id, problem))
            self.fail(job, f"KV of {reply.request_id}: {problem}")
            return
        local = job.reader.block_ids[: len(reply.block_ids)]
        job.read = self.transport.start_read(job.kv.node_id, reply.request_id, reply.block_ids, local)
        self.transferring[reply.request_id] = job

    def claimed_kv_problem(self, job: DecodeJob, reply: protocol.ClaimReply) -> str:
        """Why a claimed lease must not be read ("" if it may)."""
        peer = self.peers.get(job.kv.node_id)
        if job.aborted:
            return "aborted"
        if job.kv.compat_hash != self.compat_hash:
            return f"made under compat hash {job.kv.compat_hash}"
        if peer is None or not peer.ready or peer.instance_id != job.kv.instance_id:
            return "the prefill node restarted since the handshake"
        if len(reply.block_ids) != self.block_manager.blocks_needed(job.reader.num_prompt_tokens):
            return f"{len(reply.block_ids)} blocks for a {job.reader.num_prompt_tokens}-token prompt"
        if any(not 0 <= b < peer.num_blocks for b in reply.block_ids):
            return f"block ids outside the peer's {peer.num_blocks} blocks"
        return ""

    def poll_transfers(self) -> None:
        for request_id, job in list(self.transferring.items()):
            state = self.transport.poll(job.read)
            if state == "PROC" and not self.read_overdue(job):
                continue
            del self.transferring[request_id]
            if state == "PROC":
                self.give_up_read(job)
            elif state == "ERR":
                self.send_release(job, "the READ failed")
                self.forget_peer(job.kv.node_id)  # NOTE: likely a restarted peer: handshake again
                self.fail(job, f"NIXL read of {request_id}'s KV from {job.kv.node_id} failed")
            elif job.aborted:
                self.release(job)
            else:
                self.start_running(job)

    def read_overdue(self, job: DecodeJob) -> bool:
        """A READ past half the peer's lease: the peer may free the blocks soon, so the read is given up."""
        peer = self.peers.get(job.kv.node_id)
        limit = (peer.lease_seconds if peer else 60.0) / 2
        return time.perf_counter() - job.read.started_at > limit

    def give_up_read(self, job: DecodeJob) -> None:
        released = self.transport.cancel(job.read)
        self.send_release(job, "the READ timed out")
        self.forget_peer(job.kv.node_id)
        if not released:
            # NOTE: the transport may still write into the reader's blocks: they stay out of the pool, not reused
            self.num_blocks_quarantined += len(job.reader.block_ids)
            job.reader.block_ids = []
        self.fail(job, f"NIXL read of {job.request_id}'s KV from {job.kv.node_id} timed out")

    def send_release(self, job: DecodeJob, reason: str) -> None:
        self.sockets.send_peer(job.kv.address, protocol.ReleaseKV(job.request_id, reason))

    def forget_peer(self, node_id: str) -> None:
        """Drop the transport's peer and the handshake; jobs waiting on that handshake fail (the router retries)."""
        self.transport.remove_peer(node_id)
        peer = self.peers.pop(node_id, None)
        for job in peer.jobs_waiting if peer else []:
            self.claiming.pop(job.request_id, None)
            self.fail(job, f"prefill peer {node_id} was forgotten before its handshake completed")

    def expire_claims(self) -> None:
        """A claim or handshake unanswered for CLAIM_TIMEOUT_S (a dead or unreachable prefill node) fails: the
        request's slots and blocks must not wait forever."""
        now = time.monotonic()
        for request_id, job in list(self.claiming.items()):
            if now - job.claimed_at > CLAIM_TIMEOUT_S:
                del self.claiming[request_id]
                peer = self.peers.get(job.kv.node_id)
                if peer is not None and job in peer.jobs_waiting:
                    peer.jobs_waiting.remove(job)
                self.fail(job, f"prefill node {job.kv.node_id} did not answer the claim of {request_id} within "
                               f"{CLAIM_TIMEOUT_S:g} s")

    def start_compiled(self, jobs: list[DecodeJob]) -> None:
        """Jobs whose grammar has compiled: those already read run now."""
        for job in jobs:
            job.grammar_ready = True
            if self.awaiting_grammar.get(job.request_id) is job:
                del self.awaiting_grammar[job.request_id]
                self.start_running(job)

    def drop_refused(self, job: DecodeJob) -> None:
        """Its constraint does not compile (the 400 is sent): out of whichever queue holds it, as an abort is."""
        if job in self.waiting:
            self.waiting.remove(job)
        elif self.awaiting_grammar.get(job.request_id) is job:
            del self.awaiting_grammar[job.request_id]
            self.release(job)
        else:  # NOTE: claiming or reading: its blocks are freed once that ends, with no reply (aborted)
            job.aborted = True

    def start_running(self, job: DecodeJob) -> None:
        """Every other sample gets its own copy of the prompt's KV (the reader's blocks), then all run; a job whose
        grammar still compiles waits for it, read."""
        if not job.grammar_ready:
            self.awaiting_grammar[job.request_id] = job
            return
        reader = job.reader
        prompt_blocks = slice(0, self.block_manager.blocks_needed(reader.num_prompt_tokens))
        for request in list(job.samples.values())[1:]:
            self.runner.kv_cache.copy_blocks(reader.block_ids[prompt_blocks], request.block_ids[prompt_blocks])
        for index, request in job.samples.items():
            if index in job.dropped:
                self.free(request)
                continue
            self.running.append(RunningSample(job, index, request, next(self.samples_started)))
            first_logprobs = request.output_logprobs[0] if request.output_logprobs else None
            self.send_tokens(job, index, [request.output_token_ids[0]], first_logprobs, None)

    # --- messages -----------------------------------------------------------------------------------------------
    def on_decode(self, identity: bytes, message: protocol.DecodeRequest) -> None:
        if self.holds(message.request_id):
            # NOTE: claims, reads and aborts name a request by its id: a second job would take the first's place
            self.sockets.reply(identity, protocol.ErrorReply(
                message.request_id, 409, f"request id {message.request_id!r} is already in use on decode node "
                                         f"{self.config.node_id}"))
            return
        refused = self.admission_refusal(message)
        if refused is not None:
            self.sockets.reply(identity, refused)
            return
        samples = {first.index: self.new_request(message, first) for first in message.first_tokens}
        job = DecodeJob(identity, message.request_id, samples, message.kv)
        if message.params.structured is not None:
            job.grammar_ready = False
            self.compiling.add(job, identity, message.request_id, message.params.structured, list(samples.values()),
                               message.tenant)
        self.waiting.append(job)

    def holds(self, request_id: str) -> bool:
        """Whether a job of this id is waiting, claiming, reading, awaiting its grammar or running here."""
        return request_id in self.claiming or request_id in self.transferring or \
            request_id in self.awaiting_grammar or any(job.request_id == request_id for job in self.waiting) or any(
            sample.job.request_id == request_id for sample in [*self.running, *self.paused])

    def new_request(self, message: protocol.DecodeRequest, first: protocol.FirstToken) -> Request:
        """Sample first.index as a request of its own, with its own seed, as the prefill node sampled it."""
        params = dataclasses.replace(message.params, n=1)
        request = Request.create(message.request_id, message.prompt_token_ids, params,
                                 sample_seed(message.seed, first.index), self.eos_token_ids)
        request.output_token_ids.append(first.token_id)
        if first.logprobs is not None:
            request.output_logprobs.append(first.logprobs)
        request.num_computed_tokens = request.num_prompt_tokens
        return request

    def admission_refusal(self, message: protocol.DecodeRequest) -> protocol.ErrorReply | None:
        """The 400 a request this node can never run gets; None: it may run."""
        request_id, params = message.request_id, message.params
        indices = [first.index for first in message.first_tokens]
        try:
            if message.kv is None or message.kv.num_tokens != len(message.prompt_token_ids):
                raise RequestRejected(f"request {request_id}: no KV handle matching its "
                                      f"{len(message.prompt_token_ids)}-token prompt")
            if not indices or len(set(indices)) != len(indices) or not all(0 <= i < params.n for i in indices):
                raise RequestRejected(f"request {request_id}: first tokens must name distinct samples in "
                                      f"[0, n={params.n})")
            vocab = self.runner.arch.vocab_size
            if any(not 0 <= first.token_id < vocab for first in message.first_tokens):
                raise RequestRejected(f"request {request_id}: first token ids must be in [0, {vocab})")
            check_request(request_id, message.prompt_token_ids, params, self.config.engine, vocab)
            check_samples_fit(request_id, len(indices), self.max_num_seqs)
            check_fits_cache(request_id, self.block_manager, len(message.prompt_token_ids) + params.max_tokens,
                             len(indices))
        except RequestRejected as error:
            return refusal(request_id, error)
        return None

    def on_abort(self, identity: bytes, message: protocol.Abort) -> None:
        """Every sample of the request, or only sample message.index."""
        request_id, index = message.request_id, message.index
        for job in self.compiling.items():
            if job.request_id == request_id and (index is None or job.samples.keys() == {index}):
                self.compiling.remove(job)  # NOTE: nobody waits for its grammar any more
        for job in list(self.waiting):
            if job.request_id == request_id:
                if index is None or job.samples.keys() == {index}:
                    self.waiting.remove(job)
                else:
                    job.samples.pop(index, None)
        job = self.awaiting_grammar.get(request_id)
        if job is not None and (index is None or job.samples.keys() == {index}):
            del self.awaiting_grammar[request_id]
            self.release(job)
        for job in self.admitted_jobs():
            if job.request_id == request_id:
                # NOTE: blocks are freed once the claim or read in flight ends (or, read, once it would run)
                if index is None:
                    job.aborted = True
                else:
                    job.dropped.add(index)
        for sample in [*self.running, *self.paused]:
            if sample.job.request_id == request_id and index in (None, sample.index):
                self.finish(sample)

    def on_handshake_refused(self, source, message: protocol.HandshakeRefused) -> None:
        self.fail_peer(message.node_id, message.reason)

    handlers = {protocol.DecodeRequest: on_decode, protocol.Abort: on_abort, protocol.Ping: NodeServer.on_ping}
    peer_handlers = {protocol.HandshakeReply: on_handshake_reply, protocol.ClaimReply: on_claim_reply,
                     protocol.HandshakeRefused: on_handshake_refused}

    # --- endings ------------------------------------------------------------------------------------------------
    def send_tokens(self, job: DecodeJob, index: int, token_ids, logprobs, finish_reason) -> None:
        event = token_event(job, index, token_ids, logprobs, finish_reason)
        self.sockets.reply(job.router, protocol.StepTokens([event]))

    def finish(self, sample: RunningSample) -> None:
        if sample.swapped is not None:
            self.swap.drop(sample.swapped)
            sample.swapped = None
        (self.running if sample in self.running else self.paused).remove(sample)
        self.free(sample.request)
        self.num_finished += 1

    def fail(self, job: DecodeJob, message: str) -> None:
        logger.error("decode %s: %s", self.config.node_id, message)
        self.compiling.remove(job)
        self.release(job)
        if not job.aborted:
            self.sockets.reply(job.router, protocol.ErrorReply(job.request_id, 503, message))

    def fail_peer(self, node_id: str, message: str) -> None:
        peer = self.peers.pop(node_id, None) or PrefillPeer("")
        logger.error("decode %s: prefill peer %s refused: %s", self.config.node_id, node_id, message)
        for job in peer.jobs_waiting:
            self.claiming.pop(job.request_id, None)
            self.fail(job, message)

    def release(self, job: DecodeJob) -> None:
        """The blocks of every sample of a job that never ran."""
        for request in job.samples.values():
            self.free(request)

    ROLE_COUNTERS = ("num_decode_steps", "num_decoded_rows", "num_finished", "num_graph_replays", "num_preemptions",
                     "num_blocks_swapped_out", "num_blocks_swapped_in")

    def role_stats(self) -> dict:
        graph = self.runner.decode_graph
        # NOTE: vLLM counts a request waiting for its grammar as waiting
        return {"num_running": len(self.running), "num_waiting": len(self.waiting) + len(self.awaiting_grammar),
                "num_compiling_grammars": len(self.compiling),
                "num_claiming": len(self.claiming), "num_transferring": len(self.transferring),
                "num_decode_steps": self.num_decode_steps,
                "num_decoded_rows": self.num_decoded_rows, "num_finished": self.num_finished,
                "num_graph_replays": 0 if graph is None else graph.num_replays,
                "num_blocks_quarantined": self.num_blocks_quarantined,
                "num_paused": len(self.paused), "num_preemptions": self.num_preemptions,
                "num_blocks_swapped_out": self.swap.num_blocks_out, "num_blocks_swapped_in": self.swap.num_blocks_in,
                "swap_space_blocks": self.swap.capacity_blocks, "swap_used_blocks": self.swap.used_blocks,
                "kv_probe_read_gbps_min": round(min(self.transport.read_gbps.values(), default=0.0), 3)}


def token_event(job: DecodeJob, index: int, token_ids, logprobs, finish_reason) -> protocol.TokenEvent:
    return protocol.TokenEvent(job.request_id, token_ids, None if logprobs is None else [logprobs], finish_reason,
                               index=index)
