"""Schedulers: which requests run in the next step.

corun (paper Algorithms 1 and 2): finish a chunked prefill first; else admit the head of the waiting queue
alone, while running < N and its whole configured sequence (prompt + max_tokens) fits in the KV cache; else
one decode step over every decoding request. A prefill never shares a forward with a decode, and since KV for
the whole sequence is reserved at admission nothing is ever preempted. Packed prefill (prefill_pack_tokens)
fills one forward with the next chunk of several prompts instead of one; with a prefill_token_budget a decode
step runs once that many prompt tokens were prefilled since the last one, so a queue of prompts cannot starve
the requests already decoding. Neither changes a request's outputs: chunk cuts and forward shapes depend only
on the prompt and the configuration.

standard (vLLM's default, to show the problem and price determinism): one mixed step under a token budget:
running decodes, then running chunked prefills, then newly admitted prompts, all in one batch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from corun.block_manager import BlockManager
from corun.request import Request, RequestStatus
from wire.config import SchedulerConfig


class RequestRejected(ValueError):
    """The request can never run on this engine (too long for the model or the KV cache)."""


def check_prompt_logprobs(request_id: str, params, config) -> None:
    """params.prompt_logprobs asks for at most config.max_logprobs (an EngineConfig's) alternatives."""
    wanted = params.prompt_logprobs
    if wanted is not None and wanted > config.max_logprobs:
        raise RequestRejected(f"request {request_id}: prompt_logprobs must be <= {config.max_logprobs}")


def check_engine_request(request_id: str, prompt_token_ids: list[int], params, config, vocab_size: int) -> None:
    """What a colocated engine (corun's or the vLLM one) refuses before queueing a request: token ids outside the
    vocabulary, prompt logprobs outside corun mode or beyond max_logprobs, n > 1 (LLM.generate splits samples)."""
    if any(not 0 <= t < vocab_size for t in prompt_token_ids):
        raise RequestRejected(f"request {request_id}: prompt token ids must be in [0, {vocab_size})")
    if params.prompt_logprobs is not None and config.scheduler.mode != "corun":
        # NOTE: the prefill node prefills every prompt alone whatever its mode; an engine only in corun's
        raise RequestRejected(f"request {request_id}: prompt_logprobs needs mode corun (its isolated prefill "
                              "makes them a function of the prompt alone)")
    check_prompt_logprobs(request_id, params, config)
    check_vocab_ids(request_id, params, vocab_size)
    if params.n != 1:
        raise RequestRejected(f"request {request_id}: the engine runs one sample per request (LLM.generate "
                              "splits n samples into requests)")


def check_vocab_ids(request_id: str, params, vocab_size: int) -> None:
    """Token ids in params (stop_token_ids, logit_bias) name tokens of the model."""
    outside = [t for t in (*params.stop_token_ids, *(t for t, _ in params.logit_bias)) if not 0 <= t < vocab_size]
    if outside:
        raise RequestRejected(f"request {request_id}: token id {outside[0]} is outside the vocabulary "
                              f"[0, {vocab_size})")


@dataclass
class PrefillChunk:
    request: Request
    start: int
    num_tokens: int

    @property
    def is_last(self) -> bool:
        return self.start + self.num_tokens == self.request.num_prompt_tokens


@dataclass
class ScheduledBatch:
    decode_requests: list[Request] = field(default_factory=list)
    prefill_chunks: list[PrefillChunk] = field(default_factory=list)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, block_manager: BlockManager):
        self.cfg = cfg
        self.block_manager = block_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.check_fits_ever(request)
        self.waiting.append(request)

    def check_fits_ever(self, request: Request) -> None:
        if request.num_prompt_tokens == 0:
            raise RequestRejected(f"request {request.request_id}: the prompt is empty")
        if request.max_num_tokens > self.cfg.max_model_len:
            raise RequestRejected(
                f"request {request.request_id}: prompt ({request.num_prompt_tokens} tokens) + max_tokens "
                f"({request.params.max_tokens}) = {request.max_num_tokens} exceeds max_model_len "
                f"{self.cfg.max_model_len}")
        num_blocks = self.block_manager.blocks_needed(request.max_num_tokens)
        if num_blocks > self.block_manager.num_usable_blocks:
            raise RequestRejected(
                f"request {request.request_id}: needs {num_blocks} KV blocks, the cache has "
                f"{self.block_manager.num_usable_blocks}")

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, request: Request, reason: str) -> None:
        request.status, request.finish_reason = RequestStatus.FINISHED, reason
        self.running.remove(request)
        self.block_manager.free(request.block_ids)
        request.block_ids = []

    def abort(self, request: Request) -> None:
        """Drop a request wherever it is; its blocks (if any) return to the pool."""
        if request in self.waiting:
            self.waiting.remove(request)
            request.status, request.finish_reason = RequestStatus.FINISHED, "abort"
        elif request in self.running:
            self.finish(request, "abort")

    def admit_head(self) -> Request | None:
        """Move the head of waiting to running if a slot and blocks for its whole sequence are free."""
        if not self.waiting or len(self.running) >= self.cfg.max_num_seqs:
            return None
        block_ids = self.block_manager.allocate(self.waiting[0].max_num_tokens)
        if block_ids is None:
            return None
        request = self.waiting.popleft()
        request.block_ids, request.status = block_ids, RequestStatus.RUNNING
        self.running.append(request)
        return request

    def next_chunk(self, request: Request, max_tokens: int) -> PrefillChunk:
        start = request.num_computed_tokens
        return PrefillChunk(request, start, min(request.num_prompt_tokens - start, max_tokens))

    def schedule(self) -> ScheduledBatch | None:
        raise NotImplementedError


class CoRunScheduler(Scheduler):
    def __init__(self, cfg: SchedulerConfig, block_manager: BlockManager):
        super().__init__(cfg, block_manager)
        self.num_prefilled_since_decode = 0
        """Prompt tokens prefilled since the last decode step (for prefill_token_budget)."""

    def schedule(self) -> ScheduledBatch | None:
        decoding = [r for r in self.running if not r.is_prefilling]
        if not (decoding and self.prefill_budget_spent()):
            chunks = self.prefill_chunks()
            if chunks:
                self.num_prefilled_since_decode += sum(chunk.num_tokens for chunk in chunks)
                return ScheduledBatch(prefill_chunks=chunks)
        self.num_prefilled_since_decode = 0
        return ScheduledBatch(decode_requests=decoding) if decoding else None

    def prefill_budget_spent(self) -> bool:
        budget = self.cfg.prefill_token_budget
        return budget > 0 and self.num_prefilled_since_decode >= budget

    def prefill_chunks(self) -> list[PrefillChunk]:
        if self.cfg.prefill_pack_tokens:
            return self.pack_chunks()
        request = self.find_prefill_request()
        return [] if request is None else [self.next_chunk(request, self.cfg.prefill_chunk_size)]

    def find_prefill_request(self) -> Request | None:
        """Algorithm 1: a chunked prefill in progress, else an admissible waiting request."""
        for request in self.running:
            if request.is_prefilling:
                return request
        return self.admit_head()

    def pack_chunks(self) -> list[PrefillChunk]:
        """The next chunk of every prompt being prefilled, then of newly admitted ones (FIFO), while they fit
        the pack's rows and sequences; chunks are cut at multiples of prefill_chunk_size whatever else is packed."""
        rows_left, chunks = self.cfg.prefill_pack_tokens, []
        for request in (r for r in self.running if r.is_prefilling):
            chunk = self.next_chunk(request, self.cfg.prefill_chunk_size)
            if chunk.num_tokens <= rows_left and len(chunks) < self.cfg.prefill_pack_seqs:
                chunks.append(chunk)
                rows_left -= chunk.num_tokens
        while len(chunks) < self.cfg.prefill_pack_seqs and self.waiting and \
                min(self.waiting[0].num_prompt_tokens, self.cfg.prefill_chunk_size) <= rows_left:
            request = self.admit_head()
            if request is None:
                break
            chunks.append(self.next_chunk(request, self.cfg.prefill_chunk_size))
            rows_left -= chunks[-1].num_tokens
        return chunks


class StandardScheduler(Scheduler):
    def schedule(self) -> ScheduledBatch | None:
        budget = self.cfg.max_num_batched_tokens
        decodes = [r for r in self.running if not r.is_prefilling][:budget]
        budget -= len(decodes)
        chunks = []
        for request in [r for r in self.running if r.is_prefilling]:
            if budget > 0:
                chunks.append(self.next_chunk(request, budget))
                budget -= chunks[-1].num_tokens
        while budget > 0 and (request := self.admit_head()) is not None:
            chunks.append(self.next_chunk(request, budget))
            budget -= chunks[-1].num_tokens
        return ScheduledBatch(decodes, chunks) if decodes or chunks else None


def make_scheduler(cfg: SchedulerConfig, block_manager: BlockManager) -> Scheduler:
    # NOTE: batch_invariant mode schedules like standard; only its kernels differ.
    return (CoRunScheduler if cfg.mode == "corun" else StandardScheduler)(cfg, block_manager)
