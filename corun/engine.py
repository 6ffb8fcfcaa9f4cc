"""The colocated engine. step() = schedule -> run -> postprocess.

Lifecycle of a request (queues of the scheduler):
  waiting --admit (slot + KV blocks for prompt + max_tokens free; with a swap space, for prompt + token 1 while the
  whole sequences of all admitted fit the cache and the swap space)--> running (prefilling, chunk by chunk)
  (admission holds the prompt's longest cached full-chunk prefix, corun/prefix_cache.py; prefill starts after it,
  and each full chunk a prefill forward completes is offered to the cache)
  running (prefilled; token 1 sampled) --decode steps--> finished (stop token or max_tokens) -> blocks freed
  running (decoding) --the cache is out of blocks for a request's next token: the newest's blocks copied to host
  memory (corun/swap_preemption.py)--> paused --room again (oldest first, before any admission): copied back--> running
  (async scheduling, corun/decode_ahead.py: a decode step is launched before the previous one's tokens are read, so a
  request learns it finished one step late; that step's token of it is dropped)
"""

from __future__ import annotations

from dataclasses import dataclass

from corun.block_manager import make_block_manager
from corun.kv_swap import host_swap_for
from corun.model_runner import ModelRunner, SampledToken
from corun.request import Request, RequestStatus
from corun.scheduler import RequestRejected, ScheduledBatch, check_engine_request, make_scheduler
from wire.config import EngineConfig
from wire.sampling_params import SamplingParams
from wire.seeding import seed_from_request_id

__all__ = ["EngineStats", "LLMEngine", "RequestRejected"]
"""RequestRejected too: what add_request raises, for callers that import it from here."""


@dataclass
class EngineStats:
    num_prefill_forwards: int = 0
    num_decode_steps: int = 0
    num_mixed_steps: int = 0
    num_generated_tokens: int = 0
    max_prefill_batch: int = 0
    """Most requests whose prompt tokens shared one forward (1 in fixed_shape's isolated prefill, by construction; up
    to prefill_pack_seqs in its packed prefill)."""


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.runner = ModelRunner(config)
        # NOTE: resolved on the device by the runner, with the KV budget it sized
        self.config = config = self.runner.config
        self.block_manager = make_block_manager(config, self.runner.kv_cache.num_blocks)
        self.scheduler = make_scheduler(config.scheduler, self.block_manager,
                                        host_swap_for(config, self.runner.kv_cache))
        if self.runner.decode_rides_prefill:
            self.scheduler.decode_rides_prefill = True
        if self.runner.multi_chunk_prefill:
            self.scheduler.multi_chunk_prefill = True
        self.eos_token_ids = frozenset(self.runner.arch.eos_token_ids)
        self.stats = EngineStats()

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> Request:
        """Queue a request; raises RequestRejected if it can never run here."""
        check_engine_request(request_id, prompt_token_ids, params, self.config, self.runner.arch.vocab_size)
        seed = params.seed if params.seed is not None else seed_from_request_id(request_id, self.config.seed)
        request = Request.create(request_id, prompt_token_ids, params, seed, self.eos_token_ids)
        self.scheduler.add(request)
        return request

    def abort_request(self, request: Request) -> None:
        self.scheduler.abort(request)

    def reset_prefix_cache(self) -> int:
        """Forget every cached prompt chunk (vLLM's LLM.reset_prefix_cache); -> the KV blocks freed now."""
        return self.block_manager.reset_prefix_cache()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self.runner.decode_in_flight is not None

    def step(self) -> list[SampledToken]:
        """-> the tokens read this step: with async scheduling, those of the decode step launched the step before."""
        batch = self.scheduler.schedule()
        if runs_ahead(self.runner, batch):
            sampled = self.runner.run_decode_ahead(batch.decode_requests)
            if self.runner.decode_in_flight is not None:  # NOTE: none launched when every row had its last token
                self.count(batch)
            self.postprocess(ScheduledBatch(), sampled)
            return sampled
        sampled = self.runner.finish_decode_in_flight()
        self.postprocess(ScheduledBatch(), sampled)
        batch = without_finished(batch)  # NOTE: scheduled before the tokens just read ended some of its requests
        if batch is not None:
            ran = self.run(batch)
            self.postprocess(batch, ran)
            sampled += ran
        return sampled

    def count(self, batch: ScheduledBatch) -> None:
        self.stats.max_prefill_batch = max(self.stats.max_prefill_batch, len(batch.prefill_chunks))
        if self.config.scheduler.mode != "fixed_shape":
            self.stats.num_mixed_steps += 1
        elif batch.prefill_chunks:
            self.stats.num_prefill_forwards += 1
            self.stats.num_decode_steps += bool(batch.decode_requests)  # NOTE: carried by the prefill forward
        else:
            self.stats.num_decode_steps += 1

    def run(self, batch: ScheduledBatch) -> list[SampledToken]:
        self.count(batch)
        if self.config.scheduler.mode != "fixed_shape":
            return self.runner.run_mixed(batch)
        if batch.prefill_chunks and batch.decode_requests:
            return self.runner.run_prefill_and_decode(batch.prefill_chunks, batch.decode_requests)
        if batch.prefill_chunks:
            return self.runner.run_prefill(batch.prefill_chunks)
        return self.runner.run_decode(batch.decode_requests)

    def postprocess(self, batch: ScheduledBatch, sampled: list[SampledToken]) -> None:
        self.scheduler.update_from_output(batch)  # NOTE: before a request that ends here lets its blocks go
        for item in sampled:
            if item.request.status is not RequestStatus.RUNNING:  # NOTE: ended while its step ran ahead
                continue
            finish_reason = item.request.append_token(item.token_id, item.logprobs)
            self.stats.num_generated_tokens += 1
            if finish_reason is not None:
                self.scheduler.finish(item.request, finish_reason)


def runs_ahead(runner: ModelRunner, batch: ScheduledBatch | None) -> bool:
    """Whether batch is a decode step that may run ahead of the host (async scheduling, corun/decode_ahead.py)."""
    return batch is not None and not batch.prefill_chunks and runner.overlaps(batch.decode_requests)


def without_finished(batch: ScheduledBatch | None) -> ScheduledBatch | None:
    """batch less the decode requests that have ended since it was scheduled (None if nothing is left)."""
    if batch is None:
        return None
    decodes = [r for r in batch.decode_requests if r.status is RequestStatus.RUNNING]
    return ScheduledBatch(decodes, batch.prefill_chunks) if decodes or batch.prefill_chunks else None
