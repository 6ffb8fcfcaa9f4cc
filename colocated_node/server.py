"""Colocated server: prefill and decode in one process, the engine's fixed_shape schedule, behind the router.

The colocated engine (corun/engine.py) as a node: its scheduler and model runner run the request, so its outputs
are the engine's, and so the P/D cluster's. This is how one GPU is served without a second CUDA context or a KV
hand-off.

Lifecycle of a request (queues; each of its n samples is a request of its own, seed sample_seed(seed, i), as
LLM.generate splits them):
  compiling (a structured-output constraint not compiled yet: on a worker thread, node_core/grammar_waits.py)
      --compiled--> waiting; --does not compile--> ErrorReply(400)
  waiting (tenant by tenant, each one's FIFO, prompts the prefix cache serves first: node_core/tenant_turns.py,
      corun/waiting_order.py) --a slot and KV blocks for prompt +
      max_tokens free (with a swap space, as the engine admits: corun/engine.py)--> prefilling (alone, one
      chunk per forward, as the engine's fixed_shape mode: bucketed, packed or natural; from the end of the prompt's
      longest cached full-chunk prefix, corun/prefix_cache.py)
  prefilling --last chunk: token 1 sampled, streamed (with the prompt's logprobs)--> decoding
  decoding (the N-row decode step; one StepTokens per router per step, a TokenEvent per sample in it)
      --stop / length / Abort--> finished: slot + blocks free
  decoding --the cache is out of blocks: the newest's blocks copied to host memory--> paused --room again-->
      decoding
  with prefill_token_budget, a decode step runs once that many prompt tokens were prefilled since the last one.
  async scheduling (corun/decode_ahead.py): a decode step is launched before the previous one's tokens are read and
      streamed, so a sample learns it finished (or is aborted) one step late; that step's token of it is dropped.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from corun.engine import runs_ahead, without_finished
from corun.kv_swap import host_swap_for
from corun.model_runner import SampledToken
from corun.request import Request
from corun.scheduler import RequestRejected, ScheduledBatch, check_request, check_samples_fit, make_scheduler
from node_core.grammar_waits import GrammarWaits
from node_core.server import NodeServer, run_decode_step
from node_core.serving import refusal
from node_core.tenant_turns import TenantTurns
from wire import protocol
from wire.config import NodeConfig
from wire.seeding import sample_seed

logger = logging.getLogger(__name__)


@dataclass
class Sample:
    """One sample of a GenerateRequest, as the router knows it."""

    router: bytes
    request_id: str
    index: int
    request: Request
    """The scheduler's request for it (its own id: request_id#index)."""
    tenant: str = ""
    """The router's client of the request (GenerateRequest.tenant)."""


class ColocatedServer(NodeServer):
    role = "colocated"
    compiling: GrammarWaits[list[Sample]]
    """A request's samples, while its grammar compiles."""

    def __init__(self, config: NodeConfig):
        if config.engine.scheduler.mode != "fixed_shape":
            raise ValueError(f"a colocated node runs mode fixed_shape (got {config.engine.scheduler.mode}): its "
                             "outputs are the engine's and the P/D cluster's only under fixed_shape's shapes")
        super().__init__(config)  # NOTE: it prefills and decodes; no KV transport: it moves no KV
        self.scheduler = make_scheduler(self.config.engine.scheduler, self.block_manager,
                                        host_swap_for(self.config.engine, self.runner.kv_cache))
        if self.runner.decode_rides_prefill:
            self.scheduler.decode_rides_prefill = True
        if self.runner.multi_chunk_prefill:
            self.scheduler.multi_chunk_prefill = True
        self.samples: dict[int, Sample] = {}
        """id(request) -> its sample, while the scheduler holds it."""
        self.turns = TenantTurns()
        self.scheduler.waiting_order = self.waiting_in_turns
        self.scheduler.on_admit = lambda request: self.turns.admitted(self.tenant_of(request))
        self.num_prefill_forwards = 0
        self.num_decode_steps = 0
        self.num_decoded_rows = 0
        self.rows_launched = 0
        """By the last decode-only step (0: none launched, every row's last token in flight)."""
        self.num_finished = 0

    # --- the loop: schedule -> run -> postprocess -------------------------------------------------------------
    def busy(self) -> bool:
        return self.scheduler.has_unfinished() or self.runner.decode_in_flight is not None

    def schedule(self) -> ScheduledBatch | None:
        for samples in self.take_compiled():
            self.queue(samples)
        batch = self.scheduler.schedule()
        if self.runner.decode_in_flight is not None and not runs_ahead(self.runner, batch):
            # NOTE: what runs next needs the tokens in flight on the host (or nothing runs): read and stream them
            self.postprocess(ScheduledBatch(), self.read_decode_in_flight())
            batch = without_finished(batch)
        return batch

    def waiting_in_turns(self) -> Iterable[Request]:
        """The scheduler's waiting requests in their tenants' turns (node_core/tenant_turns.py), each tenant's those
        the prefix cache serves first (corun/waiting_order.py)."""
        waiting = self.scheduler.cached_first.order(self.scheduler.waiting)
        tenants = {self.samples[id(r)].tenant for r in waiting}
        if len(tenants) < 2:  # NOTE: one tenant's turns are its own order
            return waiting
        prefilling = {self.samples[id(r)].tenant for r in self.scheduler.running if r.is_prefilling}
        return self.turns.order(list(waiting), self.tenant_of, tenants | prefilling)

    def tenant_of(self, request: Request) -> str:
        return self.samples[id(request)].tenant

    def run(self, batch: ScheduledBatch) -> list[SampledToken]:
        if batch.prefill_chunks and batch.decode_requests:
            self.num_prefill_forwards += 1
            self.num_decode_steps += 1
            self.num_decoded_rows += len(batch.decode_requests)
            return self.runner.run_prefill_and_decode(batch.prefill_chunks, batch.decode_requests)
        if batch.prefill_chunks:
            self.num_prefill_forwards += 1
            return self.runner.run_prefill(batch.prefill_chunks)
        sampled, num_rows = run_decode_step(self.runner, batch.decode_requests)
        self.num_decode_steps += num_rows > 0
        self.num_decoded_rows += num_rows
        self.rows_launched = num_rows
        return sampled

    def iteration_tokens_of(self, batch: ScheduledBatch, sampled: list[SampledToken]) -> int:
        """A decode step ahead of the host (async scheduling) counts the rows it launched, not the step before's
        tokens it read (DecodeServer.iteration_tokens_of)."""
        if batch.prefill_chunks:
            return super().iteration_tokens_of(batch, sampled)
        return self.rows_launched

    def num_prompt_tokens(self, batch: ScheduledBatch) -> int:
        return sum(chunk.num_tokens for chunk in batch.prefill_chunks)

    def prefill_chunks_of(self, batch: ScheduledBatch) -> list:
        return batch.prefill_chunks

    def decode_rows_of(self, batch: ScheduledBatch) -> int:
        return len(batch.decode_requests)

    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def postprocess(self, batch: ScheduledBatch, sampled: list[SampledToken]) -> None:
        self.scheduler.update_from_output(batch)  # NOTE: before a request that ends here lets its blocks go
        step_events: dict[bytes, list[protocol.TokenEvent]] = {}
        for item in sampled:
            sample = self.samples.get(id(item.request))
            if sample is None:  # NOTE: ended or aborted while its step ran ahead
                continue
            request = item.request
            finish_reason = request.append_token(item.token_id, item.logprobs)
            first = len(request.output_token_ids) == 1
            prompt_logprobs = request.prompt_logprobs if first and request.params.prompt_logprobs is not None \
                else None
            logprobs = None if item.logprobs is None else [item.logprobs]
            event = protocol.TokenEvent(sample.request_id, [item.token_id], logprobs, finish_reason, prompt_logprobs,
                                        sample.index, request.num_cached_tokens if first else None)
            step_events.setdefault(sample.router, []).append(event)
            if finish_reason is not None:
                self.finish(sample, finish_reason)
        for router, events in step_events.items():
            self.sockets.reply(router, protocol.StepTokens(events))

    # --- requests -----------------------------------------------------------------------------------------------
    def on_generate(self, identity: bytes, message: protocol.GenerateRequest) -> None:
        # NOTE: replace() validates the parameters again (~40 us): only where n changes
        params = message.params if message.params.n == 1 else dataclasses.replace(message.params, n=1)
        requests = [Request.create(f"{message.request_id}#{index}", message.prompt_token_ids, params,
                                   sample_seed(message.seed, index), self.eos_token_ids)
                    for index in range(message.params.n)]
        try:
            check_request(message.request_id, message.prompt_token_ids, params, self.config.engine,
                          self.runner.arch.vocab_size, prompt_logprobs_need_fixed_shape=True)
            self.check_fits(message.request_id, requests)
        except RequestRejected as error:
            self.sockets.reply(identity, refusal(message.request_id, error))
            return
        samples = [Sample(identity, message.request_id, index, request, message.tenant)
                   for index, request in enumerate(requests)]
        if params.structured is None:
            self.queue(samples)
        else:
            self.compiling.add(samples, identity, message.request_id, params.structured, requests, message.tenant)

    def queue(self, samples: list[Sample]) -> None:
        for sample in samples:
            self.scheduler.add(sample.request)
            self.samples[id(sample.request)] = sample

    def check_fits(self, request_id: str, requests: list[Request]) -> None:
        """Each sample fits the model and the cache alone, and all of them the slots (they may run together)."""
        for request in requests:
            self.scheduler.check_fits_ever(request)
        check_samples_fit(request_id, len(requests), self.config.engine.scheduler.max_num_seqs)

    def on_abort(self, identity: bytes, message: protocol.Abort) -> None:
        """Every sample of the request, or only sample message.index."""
        for samples in self.compiling.items():
            samples[:] = [s for s in samples if not (s.request_id == message.request_id and
                                                     message.index in (None, s.index))]
            if not samples:
                self.compiling.remove(samples)
        for sample in list(self.samples.values()):
            if sample.request_id == message.request_id and message.index in (None, sample.index):
                self.scheduler.abort(sample.request)
                del self.samples[id(sample.request)]

    handled_during_forward = frozenset({protocol.GenerateRequest})
    """A new request is read, checked and queued while a forward runs (node_core/liveness.py), as vLLM's engine core
    takes requests in on a thread of its own: on_generate touches the waiting queue and the samples, which no
    forward reads, and a burst's requests (256 at once: ~0.1-0.2 ms each to decode and check) would otherwise be
    taken in between forwards, with the GPU idle."""
    handlers = {protocol.GenerateRequest: on_generate, protocol.Abort: on_abort, protocol.Ping: NodeServer.on_ping,
                protocol.ResetPrefixCache: NodeServer.on_reset_prefix_cache}

    def finish(self, sample: Sample, reason: str) -> None:
        self.scheduler.finish(sample.request, reason)
        del self.samples[id(sample.request)]
        self.num_finished += 1

    ROLE_COUNTERS = ("num_prefill_forwards", "num_decode_steps", "num_decoded_rows", "num_finished",
                     "num_graph_replays")

    def role_stats(self) -> dict:
        graph = self.runner.decode_graph
        # NOTE: vLLM counts a request waiting for its grammar as waiting
        return {"num_running": len(self.scheduler.running),
                "num_waiting": len(self.scheduler.waiting) + len(self.compiling),
                "num_compiling_grammars": len(self.compiling),
                "num_paused": len(self.scheduler.paused), "num_preemptions": self.scheduler.num_preemptions,
                "num_prefill_forwards": self.num_prefill_forwards, "num_decode_steps": self.num_decode_steps,
                "num_decoded_rows": self.num_decoded_rows, "num_finished": self.num_finished,
                "num_graph_replays": 0 if graph is None else graph.num_replays}
