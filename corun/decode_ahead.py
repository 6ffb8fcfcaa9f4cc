"""Async scheduling (vLLM's name): a decode step is launched before the host has read the tokens of the one before.

Without it the GPU idles while the host reads a step's tokens, appends them, streams them and builds the next step
(measured on the H200, 8B shape, 256 rows: 2.5-3.2 ms of each ~19.6 ms step, benchmarks/results/
h200_decode_step_gap.json). With it, step k+1 takes each continuing row's input token straight from step k's sampled
tokens on the device, at the position after it, and the host reads step k's tokens while step k+1 runs.

Why outputs do not change: a row's input token, position, KV slot, context length and sampling position are
exactly those the synchronous step would give it; only where the token comes from differs. A row whose token of
step k ends it (a stop token) is still computed in step k+1: its KV write lands in its own reserved blocks
(admission reserves prompt + max_tokens, or, with a swap space, a row's blocks reach the position its next step
writes before that step is scheduled: swap_preemption.py; a row whose step-k token reaches max_tokens is left out),
and the fixed-shape step gives every other row the same bits whatever that row holds. Its token is dropped.
Logit adjustments run ahead too: min_tokens needs only the count of tokens (known), the penalties count the token in
flight from the device (HistoryAhead, fill_penalty_tokens), bias and allowed tokens need no history. Rows whose next
logits depend on the values of their last tokens on the host (bad words, a grammar's matcher) make the step
synchronous.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from corun.device_copies import to_device
from corun.request import Request
from corun.sampler import SamplerOutput, SamplingBatch

WAIT_POLL_S = 0.0002
"""How often a host with work to do while a step runs looks again (a decode step takes 5-25 ms on a GPU): late by at
most this when the step ends, which the step launched ahead covers."""


@dataclass
class DecodeInFlight:
    """A launched decode step whose sampled tokens the host has not read yet."""

    requests: list[Request]
    token_ids: torch.Tensor
    """[rows] on the device: the next step's input tokens of the rows that continue."""
    host: SamplerOutput
    """The step's outputs for its requests, on the host once `ready` has fired."""
    ready: torch.cuda.Event | None
    """Recorded after the device-to-host copies (None on CPU: the outputs are already there)."""
    rows: dict[int, int] = field(init=False)
    """id(request) -> its row in the step."""

    def __post_init__(self):
        self.rows = {id(request): row for row, request in enumerate(self.requests)}

    def holds(self, request: Request) -> bool:
        return id(request) in self.rows

    def wait(self, while_waiting: Callable[[], None] | None = None) -> SamplerOutput:
        """The step's outputs on the host; while_waiting, if given, is called at least once and then every
        WAIT_POLL_S until the device is done (work of the host's that must not wait a whole step)."""
        if while_waiting is not None:
            while_waiting()
            while self.ready is not None and not self.ready.query():
                time.sleep(WAIT_POLL_S)
                while_waiting()
        if self.ready is not None:
            self.ready.synchronize()
        return self.host


def token_ahead(request: Request, previous: DecodeInFlight | None) -> int:
    """1 if the request's newest token is still on the device (it ran in the step in flight), else 0."""
    return int(previous is not None and previous.holds(request))


def tokens_ahead(requests: Sequence[Request], previous: DecodeInFlight | None) -> list[int]:
    return [token_ahead(r, previous) for r in requests]


def continues(request: Request, previous: DecodeInFlight | None) -> bool:
    """False for a row whose token in flight is its last by length: it needs no further step."""
    return request.num_tokens + token_ahead(request, previous) < request.max_num_tokens


def input_ids_with_tokens_ahead(input_ids: torch.Tensor, requests: Sequence[Request], previous: DecodeInFlight | None,
                                device: torch.device) -> torch.Tensor:
    """input_ids (on any device) with each ahead row's placeholder replaced by its token from the step in flight,
    gathered on the device (no host round trip)."""
    input_ids = to_device(input_ids, device)
    if previous is None:
        return input_ids
    sources = [previous.rows.get(id(r), -1) for r in requests]
    sources += [-1] * (len(input_ids) - len(sources))
    source_rows = to_device(torch.tensor(sources, dtype=torch.int64), device)
    from_previous = previous.token_ids[source_rows.clamp(min=0)]
    return torch.where(source_rows >= 0, from_previous, input_ids)


def copy_to_host(out: SamplerOutput, num_rows: int) -> tuple[SamplerOutput, torch.cuda.Event | None]:
    """The first num_rows rows of a step's outputs, copied to pinned host memory without waiting for them."""
    rows = [t[:num_rows] for t in (out.token_ids, out.logprobs, out.topk_ids, out.topk_logprobs)]
    if not out.token_ids.is_cuda:
        return SamplerOutput(*rows), None
    host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True) for t in rows]
    ready = torch.cuda.Event()
    ready.record()
    return SamplerOutput(*host), ready


PLACEHOLDER = -1
"""A token in flight in a history built on the host: the padding id, which the penalties' counts skip."""


@dataclass
class HistoryAhead:
    """A request's tokens as the step ahead sees them (corun.sampler.TokenHistory): its output so far and, when its
    newest token is in flight, a placeholder for it, so counts (min_tokens) are right; fill_penalty_tokens puts the
    token itself in the device copy."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]
    stop_token_ids: frozenset[int]


def histories_ahead(requests: Sequence[Request], ahead: Sequence[int]) -> list[HistoryAhead]:
    return [HistoryAhead(r.prompt_token_ids, r.output_token_ids + [PLACEHOLDER] * a, r.stop_token_ids)
            for r, a in zip(requests, ahead, strict=True)]


def fill_penalty_tokens(batch: SamplingBatch, requests: Sequence[Request], previous: DecodeInFlight | None,
                        device: torch.device) -> None:
    """Write each ahead row's token in flight over its placeholder in the penalties' output ids, on the device."""
    adjustments = batch.adjustments
    if previous is None or adjustments is None or adjustments.penalties is None:
        return
    places = [(row, len(r.output_token_ids), previous.rows[id(r)]) for row, r in enumerate(requests)
              if previous.holds(r)]
    if not places:
        return
    rows, columns, sources = (to_device(torch.tensor(column, dtype=torch.int64), device) for column in zip(*places))
    adjustments.output_ids[rows, columns] = previous.token_ids[sources]
