"""Schedulers: which requests run in the next step.

fixed_shape (paper Algorithms 1 and 2): finish a chunked prefill first; else admit the head of the waiting queue
(prompts the prefix cache serves first: corun/waiting_order.py) alone, while running < N and its whole configured
sequence (prompt + max_tokens) fits in the KV cache; else one decode step over every decoding request. Without a
swap space KV for the whole sequence is reserved at admission and nothing is ever preempted; with one (both modes),
a request gets blocks as its tokens need them and the newest are paused to host memory when the cache runs out, bit
for bit (corun/swap_preemption.py).
Packed prefill (prefill_pack_tokens) fills one forward with the next chunk of several prompts
instead of one; with a prefill_token_budget a decode step runs once that many prompt tokens were prefilled since
the last one, so a queue of prompts cannot starve the requests already decoding; with decode_rides_prefill (where
the runner verified it changes no bits) every prefill forward carries the decode step instead, one forward for
both, its pack capped by the same budget. None of this changes a request's outputs: chunk cuts and each part's
shape depend only on the prompt and the configuration.

mixed (vLLM's default, to show the problem and price determinism): one mixed step under a token budget:
running decodes, then running chunked prefills, then newly admitted prompts, all in one batch.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from corun.block_manager import BlockManager
from corun.request import Request, RequestStatus
from corun.swap_preemption import SwapPreemption
from corun.waiting_order import CachedFirst
from wire.config import SchedulerConfig

if TYPE_CHECKING:
    from corun.kv_swap import HostSwap


class RequestRejected(ValueError):
    """The request can never run on this engine (too long for the model or the KV cache). constraint_reason: where
    its structured-output constraint does not compile, the grammar library's reason (ErrorReply.constraint_reason)."""

    def __init__(self, message: str, constraint_reason: str | None = None):
        super().__init__(message)
        self.constraint_reason = constraint_reason


def check_request(request_id: str, prompt_token_ids: list[int], params, config, vocab_size: int,
                  prompt_logprobs_need_fixed_shape: bool = False) -> None:
    """What every server of a request refuses before queueing it (the engines, the prefill, decode and colocated
    nodes): an empty prompt, token ids outside the vocabulary (the prompt's and every one the parameters name:
    SamplingParams.token_ids_named), prompt +
    max_tokens beyond max_model_len, prompt_logprobs beyond max_logprobs (config: an EngineConfig) and, where the
    server schedules by mode (prompt_logprobs_need_fixed_shape: an engine, not a prefill node, which prefills every
    prompt alone whatever its mode), prompt_logprobs outside fixed_shape mode, and a structured-output constraint
    where the backend has none. The constraint itself compiles later: check_structured, or on a node off its loop
    (node_core/grammar_waits.py)."""
    if not prompt_token_ids:
        raise RequestRejected(f"request {request_id}: the prompt is empty")
    # NOTE: min and max loop in C: for 4,096 ids ~117 us against the comprehension's ~197 on this repository's 2-core
    # host, time the GPU waits through before a lone prompt's prefill
    if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab_size:
        raise RequestRejected(f"request {request_id}: prompt token ids must be in [0, {vocab_size})")
    check_length(request_id, len(prompt_token_ids), params.max_tokens, config.scheduler.max_model_len)
    if prompt_logprobs_need_fixed_shape and params.prompt_logprobs is not None and \
            config.scheduler.mode != "fixed_shape":
        raise RequestRejected(f"request {request_id}: prompt_logprobs needs mode fixed_shape (its isolated prefill "
                              "makes them a function of the prompt alone)")
    if params.prompt_logprobs is not None and params.prompt_logprobs > config.max_logprobs:
        raise RequestRejected(f"request {request_id}: prompt_logprobs must be <= {config.max_logprobs}")
    if params.logprob_token_ids is not None and len(params.logprob_token_ids) > config.max_logprobs:
        raise RequestRejected(f"request {request_id}: logprob_token_ids may name at most {config.max_logprobs} "
                              "tokens (max_logprobs)")
    outside = [t for t in params.token_ids_named() if not 0 <= t < vocab_size]
    if outside:
        raise RequestRejected(f"request {request_id}: token id {outside[0]} is outside the vocabulary "
                              f"[0, {vocab_size})")
    if params.structured is not None and config.backend != "native":
        raise RequestRejected(f"request {request_id}: structured outputs need the native engine backend")


def check_structured(request_id: str, params, config, vocab_size: int) -> None:
    """The constraint compiles for this model (compiled once, cached for the sampler); blocks while it compiles."""
    from corun.structured import GrammarError, grammars_for

    try:
        grammars_for(config.model).compile(params.structured, vocab_size)
    except GrammarError as error:
        raise RequestRejected(f"request {request_id}: {error}", constraint_reason=error.constraint_reason) from None


def check_length(request_id: str, num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    if num_prompt_tokens == 0:
        raise RequestRejected(f"request {request_id}: the prompt is empty")
    if num_prompt_tokens + max_tokens > max_model_len:
        raise RequestRejected(f"request {request_id}: prompt ({num_prompt_tokens} tokens) + max_tokens "
                              f"({max_tokens}) = {num_prompt_tokens + max_tokens} exceeds max_model_len "
                              f"{max_model_len}")


def check_engine_request(request_id: str, prompt_token_ids: list[int], params, config, vocab_size: int) -> None:
    """check_request for a colocated engine (the native one or the vLLM one), which also runs one sample per request
    (LLM.generate splits n samples into requests), and its constraint compiled: add_request refuses one that does
    not compile, as vLLM's LLM does (the caller's thread waits for it, not a serving loop's)."""
    check_request(request_id, prompt_token_ids, params, config, vocab_size, prompt_logprobs_need_fixed_shape=True)
    if params.n != 1:
        raise RequestRejected(f"request {request_id}: the engine runs one sample per request (LLM.generate "
                              "splits n samples into requests)")
    if params.structured is not None:
        check_structured(request_id, params, config, vocab_size)


def check_samples_fit(request_id: str, num_samples: int, max_num_seqs: int) -> None:
    """A request's samples may run together: they must fit the N decode rows."""
    if num_samples > max_num_seqs:
        raise RequestRejected(f"request {request_id}: n = {num_samples} samples, this node runs at most "
                              f"{max_num_seqs} (its max_num_seqs)")


def check_fits_cache(request_id: str, block_manager: BlockManager, num_tokens: int, num_samples: int = 1) -> None:
    """num_samples sequences of num_tokens each fit the KV cache at once (the blocks reserved at admission)."""
    num_blocks = num_samples * block_manager.blocks_needed(num_tokens)
    if num_blocks > block_manager.num_usable_blocks:
        raise RequestRejected(f"request {request_id}: needs {num_blocks} KV blocks, the cache has "
                              f"{block_manager.num_usable_blocks}")


def allocate_all(block_manager: BlockManager, num_tokens: list[int]) -> list[list[int]] | None:
    """Blocks for every sequence (of num_tokens[i] tokens), or none at all (None) when they do not all fit:
    a request's samples are admitted together."""
    allocated = []
    for count in num_tokens:
        block_ids = block_manager.allocate(count)
        if block_ids is None:
            for held in allocated:
                block_manager.free(held)
            return None
        allocated.append(block_ids)
    return allocated


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


class Scheduler(SwapPreemption):
    def __init__(self, cfg: SchedulerConfig, block_manager: BlockManager, swap: HostSwap | None = None):
        """swap: the host memory paused requests' blocks go to (None or no capacity: whole sequences reserved)."""
        self.cfg = cfg
        self.block_manager = block_manager
        self.swap = swap
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.paused: list[Request] = []
        """Oldest first (Request.admission_order)."""
        self.num_preemptions = 0
        self.chunks_let_go_after_copy = []
        self._admissions = itertools.count()
        self.cached_first = CachedFirst(block_manager)
        self.waiting_order: Callable[[], Iterable[Request]] | None = None
        """Waiting in the order its prompts may start (fixed_shape's prefill): cached_first's order of arrival order
        (None), unless the owner (a colocated node: its tenants in turn) sets another.
        NOTE: not a lambda over self: that cycle kept a deleted engine's scheduler, and through its swap space the
        KV cache, until the garbage collector ran; a second engine in the process then sized its KV beside the
        first's (front_door on an H200, stop 54: 61 rows, 35 pauses)."""
        self.on_admit: Callable[[Request], None] = lambda request: None
        """Told of each request admitted (a colocated node's tenant turns)."""

    def add(self, request: Request) -> None:
        self.check_fits_ever(request)
        self.waiting.append(request)

    def check_fits_ever(self, request: Request) -> None:
        """The request's whole sequence fits the model and the KV cache."""
        check_length(request.request_id, request.num_prompt_tokens, request.params.max_tokens, self.cfg.max_model_len)
        check_fits_cache(request.request_id, self.block_manager, request.max_num_tokens)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.paused)

    def finish(self, request: Request, reason: str) -> None:
        request.status, request.finish_reason = RequestStatus.FINISHED, reason
        if request in self.paused:
            self.forget_paused(request)
        else:
            self.running.remove(request)
        self.block_manager.release(request)

    def abort(self, request: Request) -> None:
        """Drop a request wherever it is; its blocks (if any) return to the pool."""
        if request in self.waiting:
            self.waiting.remove(request)
            request.status, request.finish_reason = RequestStatus.FINISHED, "abort"
        elif request in self.running or request in self.paused:
            self.finish(request, "abort")

    def admit_head(self) -> Request | None:
        """Move the head of waiting to running if a slot and blocks for its whole sequence are free (its prompt's
        cached chunks among them: its prefill starts after them)."""
        head = self.waiting[0] if self.waiting else None
        return head if head is not None and self.admit(head) else None

    def admit(self, request: Request) -> bool:
        """Move a waiting request to running (admit_head's rule, for any request of waiting)."""
        if len(self.running) + len(self.paused) >= self.cfg.max_num_seqs or not self.may_admit(request):
            return False
        if not self.block_manager.allocate_request(request, self.admission_tokens(request)):
            return False
        self.waiting.remove(request)
        request.status = RequestStatus.RUNNING
        request.admission_order = next(self._admissions)
        self.running.append(request)
        self.on_admit(request)
        return True

    def schedule(self) -> ScheduledBatch | None:
        raise NotImplementedError

    def update_from_output(self, batch: ScheduledBatch) -> None:
        """After the batch's forward: the full prompt chunks it completed go to the prefix cache (if any)."""
        for chunk in batch.prefill_chunks:
            self.block_manager.cache_prefilled(chunk.request, chunk.start, chunk.start + chunk.num_tokens)


class FixedShapeScheduler(Scheduler):
    def __init__(self, cfg: SchedulerConfig, block_manager: BlockManager, swap: HostSwap | None = None):
        super().__init__(cfg, block_manager, swap)
        self.num_prefilled_since_decode = 0
        """Prompt tokens prefilled since the last decode step (for prefill_token_budget)."""
        self.decode_rides_prefill = False
        """Set by the owner when its runner joins a decode step to a prefill forward (ModelRunner.joined_shapes):
        every prefill forward then carries the decode step of the requests decoding (a batch with both)."""
        self.multi_chunk_prefill = False
        """Set by the owner when its runner verified that a prompt may run several chunks in one forward."""

    def schedule(self) -> ScheduledBatch | None:
        decoding = self.prepare_blocks()
        if self.decode_rides_prefill and decoding:
            # NOTE: the pack is every prompt token between two of a decoding request's tokens, so the budget caps it
            chunks = self.prefill_chunks(self.pack_rows_left(0))
            return ScheduledBatch(decode_requests=decoding, prefill_chunks=chunks)
        if not (decoding and self.prefill_budget_spent()):
            chunks = self.prefill_chunks(self.pack_rows_left(self.num_prefilled_since_decode) if decoding else None)
            if chunks:
                self.num_prefilled_since_decode += sum(chunk.num_tokens for chunk in chunks)
                return ScheduledBatch(prefill_chunks=chunks)
        self.num_prefilled_since_decode = 0
        return ScheduledBatch(decode_requests=decoding) if decoding else None

    def prefill_budget_spent(self) -> bool:
        budget = self.cfg.decode_wait_tokens
        return budget > 0 and self.num_prefilled_since_decode >= budget

    def pack_rows_left(self, prefilled: int) -> int | None:
        """While requests decode, a pack holds at most what is left of the prefill token budget after prefilled
        prompt tokens (a whole chunk at least), so a large T does not stall every decoding request for a T-row
        forward. A pack that carries the decode step has nothing prefilled before it: it gets the whole budget, so a
        running request waits at most one budget-sized forward for its next token, as it does apart."""
        budget = self.cfg.decode_wait_tokens
        return max(budget - prefilled, self.cfg.prefill_chunk_size) if budget else None

    def prefill_chunks(self, max_rows: int | None = None) -> list[PrefillChunk]:
        """Algorithm 1 (and packed prefill): the chunk in progress, else an admissible waiting request's."""
        prefilling = [r for r in self.running if r.is_prefilling]
        waiting = self.cached_first.order(self.waiting) if self.waiting_order is None else self.waiting_order()
        chunks = pack_prefill_chunks(self.cfg, self.block_manager, prefilling, waiting, self.admit, max_rows,
                                     self.multi_chunk_prefill)
        if chunks:
            self.cached_first.forward_ran()
        return chunks


class MixedScheduler(Scheduler):
    def schedule(self) -> ScheduledBatch | None:
        budget = self.cfg.max_num_batched_tokens
        decodes = self.prepare_blocks()[:budget]
        budget -= len(decodes)
        chunks = []
        for request in [r for r in self.running if r.is_prefilling]:
            if budget > 0:
                chunks.append(next_chunk(request, budget))
                budget -= chunks[-1].num_tokens
        while budget > 0 and (request := self.admit_head()) is not None:
            chunks.append(next_chunk(request, budget))
            budget -= chunks[-1].num_tokens
        return ScheduledBatch(decodes, chunks) if decodes or chunks else None


def next_chunk(request: Request, max_tokens: int) -> PrefillChunk:
    start = request.num_computed_tokens
    return PrefillChunk(request, start, min(request.num_prompt_tokens - start, max_tokens))


PREFIX_WAIT_SCAN = 1024
"""Waiting requests looked at per prefill forward: past those that wait for a chunk in flight (see below)."""


def pack_prefill_chunks(cfg: SchedulerConfig, block_manager: BlockManager, prefilling: list[Request],
                        waiting: Iterable[Request], admit: Callable[[Request], bool],
                        max_rows: int | None = None, multi_chunk: bool = False) -> list[PrefillChunk]:
    """The prefill forward of a fixed_shape engine and of a prefill node: the next chunk of every prompt being
    prefilled, then of newly admitted ones (waiting in the order given, corun/waiting_order.py; admit answers False
    when a request does not fit, which stops admission), while they fit one forward: one chunk alone (isolated), or
    prefill_pack_tokens rows and prefill_pack_seqs prompts (packed). Chunks are cut at multiples of
    prefill_chunk_size whatever else is packed, so a prompt's cuts depend on the prompt alone. max_rows caps the
    pack's rows (the engine's budget while it decodes); the forward then runs at the smallest verified pack size
    that holds them. multi_chunk: a prompt takes as many of its next chunks as the rows left hold (the runner
    verified that this changes no bits; SchedulerConfig.multi_chunk_prefill; prompt logprobs are still computed
    chunk by chunk).
    With a prefix cache, the full chunks a piece completes are cached as it is packed (BlockManager.cache_scheduled),
    so a prompt sharing them that is packed later in the same forward is served them (its rows read the K and V the
    forward writes): the 4 continuations of a multiple-choice question, waiting next to each other however they
    arrived (corun/waiting_order.py), prefill in their context's forward. A waiting prompt whose next chunk an
    admitted prompt computes in a later forward waits for it (the requests behind it go first), as does one asking
    prompt logprobs for a chunk computed in this forward (they are kept with the chunk once the forward ends):
    admitted then, it is served that chunk from the cache instead of computing it again. Only when a prompt starts
    changes: a hit gives the bits a cold prefill computes."""
    rows_left, max_prompts = cfg.prefill_pack_tokens or cfg.prefill_chunk_size, cfg.prefill_seqs_per_forward
    rows_left = rows_left if max_rows is None else min(rows_left, max_rows)
    chunks = []
    computed_now: set[bytes] = set()
    """The full chunks this forward computes (cached as they are packed)."""

    def next_piece(request: Request) -> PrefillChunk:
        if not multi_chunk:
            return next_chunk(request, cfg.prefill_chunk_size)
        return next_chunk(request, max(1, rows_left // cfg.prefill_chunk_size) * cfg.prefill_chunk_size)

    def pack(chunk: PrefillChunk) -> None:
        nonlocal rows_left
        chunks.append(chunk)
        rows_left -= chunk.num_tokens
        computed_now.update(block_manager.cache_scheduled(chunk.request, chunk.start + chunk.num_tokens))

    for request in prefilling:
        chunk = next_piece(request)
        if len(chunks) < max_prompts and chunk.num_tokens <= rows_left:
            pack(chunk)
    in_flight = block_manager.chunks_in_flight(prefilling)
    for request in list(itertools.islice(waiting, PREFIX_WAIT_SCAN)):
        if len(chunks) >= max_prompts or min(request.num_prompt_tokens, cfg.prefill_chunk_size) > rows_left:
            break
        if block_manager.waits_for_chunk_in_flight(request, in_flight, computed_now):
            continue
        if not admit(request):
            break
        pack(next_piece(request))
        in_flight |= block_manager.chunks_in_flight([request])
    return chunks


def make_scheduler(cfg: SchedulerConfig, block_manager: BlockManager, swap: HostSwap | None = None) -> Scheduler:
    """cfg resolved on its device (EngineConfig.resolved): a scheduler never guesses an 'auto' setting."""
    if not cfg.is_resolved:
        raise ValueError("the scheduler needs a config resolved on its device (EngineConfig.resolved)")
    # NOTE: batch_invariant mode schedules like mixed; only its kernels differ.
    return (FixedShapeScheduler if cfg.mode == "fixed_shape" else MixedScheduler)(cfg, block_manager, swap)
