"""Token events of each prompt turned into text deltas, and several prompts' deltas merged as they come."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from router.generation.detokenizer import IncrementalDetokenizer
from router.generation.output import ChoiceDelta, OutputOptions
from router.generation.pipeline import TokenPush, generate
from router.metrics import RouterMetrics
from router.nodes.choice import Placement
from router.nodes.pool import NodePool, PoolMismatch
from wire.outputs import TokenLogprobs
from wire.protocol import ModelFacts, TokenEvent
from wire.sampling_params import SamplingParams
from wire.tokenizer import Tokenizer


class DeltaSink(Protocol):
    """Takes a prompt's deltas without its consumer's coroutine (router/api/streaming.py, ChunkWriter)."""

    def accepts(self, index: int) -> bool:
        """Whether take may have choice index's next delta now (no side effect)."""

    def take(self, delta: ChoiceDelta) -> None:
        """The delta, delivered as the consumer would have delivered it."""

    def take_text(self, index: int, text: str, token_ids: list[int], logprobs: list[TokenLogprobs] | None) -> None:
        """take(ChoiceDelta(index, text, token_ids, logprobs, None)): a delta of a running sample's tokens (no
        finish, no prompt logprobs, no cached tokens), without building it."""


@dataclass
class DeltaOutlet:
    """Where a prompt's plain deltas may go straight from the node's receive loop: the consumer attaches its sink
    once it can take them (a streamed response, once open); until then, and whenever the sink declines, deltas go
    through the consumer, as every first and last delta of a choice does."""

    sink: DeltaSink | None = None


async def prompt_deltas(pool: NodePool, tokenizer: Tokenizer, metrics: RouterMetrics, index: int, request_id: str,
                        prompt_token_ids: list[int], params: SamplingParams, stop_strings: tuple[str, ...],
                        placement: Placement = Placement(), output: OutputOptions = OutputOptions(),
                        outlet: DeltaOutlet | None = None, tenant: str = "") -> AsyncIterator[ChoiceDelta]:
    """One prompt's choices (index, index + 1, ... for its n samples): detokenised, each cut at a stop string
    (which aborts that sample's decode), timed for metrics. outlet: where plain deltas may skip this generator.
    tenant: the request's client (router/generation/pipeline.py, generate)."""
    start = time.monotonic()
    samples = [SampleTiming(start, IncrementalDetokenizer(tokenizer, stop_strings, output.include_stop_str_in_output,
                                                          output.skip_special_tokens, params.min_tokens))
               for _ in range(params.n)]
    stopped: set[int] = set()
    metrics.prompt_tokens.inc(len(prompt_token_ids))
    request = RequestTiming(start, len(prompt_token_ids), params.max_tokens, agreed_facts(pool))
    # NOTE: a stop string may end a choice at any token: such a choice's deltas all go through the loop below
    push = None if outlet is None or stop_strings else delta_push(outlet, samples, index, params, metrics)
    events = generate(pool, request_id, prompt_token_ids, params, params.seed, placement, stopped,
                      request.on_queue_time(metrics), push, tenant)
    num_events = num_finished = 0
    try:
        async for event in events:
            now = time.monotonic()
            if num_events == 0:
                metrics.time_to_first_token.observe(now - start)
            num_events += 1
            sample = samples[event.index]
            delta = to_delta(sample.detokenizer, index + event.index, event, params.stop_token_ids)
            sample.observe_arrival(now, metrics, len(delta.token_ids))
            yield delta
            if delta.finish_reason is not None:
                stopped.add(event.index)
                sample.observe_finish(now, metrics, delta.finish_reason)
                request.observe_sample(sample, now, metrics)
                num_finished += 1
                if num_finished == params.n:
                    metrics.request_latency.observe(now - start)
                    metrics.params_n.observe(params.n)
                    return
    finally:
        # NOTE: closing the event stream early is what sends the decode node an Abort.
        await events.aclose()


def delta_push(outlet: DeltaOutlet, samples: list[SampleTiming], index: int, params: SamplingParams,
               metrics: RouterMetrics) -> TokenPush:
    """What prompt_deltas does for a token event that neither starts nor ends its sample, done for the receive loop
    (router/generation/pipeline.py, TokenPush) when the outlet's sink accepts its delta."""
    def push(event: TokenEvent) -> bool:
        sample, sink = samples[event.index], outlet.sink
        if sample.first is None or sink is None or not sink.accepts(index + event.index):
            return False
        if event.prompt_logprobs is None and event.num_cached_tokens is None:
            # NOTE: the common streamed token (issue 21): its text, ids and logprobs go as they are, no delta built
            text = sample.detokenizer.add_running(event.token_ids)
            sample.observe_arrival(time.monotonic(), metrics, len(event.token_ids))
            sink.take_text(index + event.index, text, event.token_ids, event.logprobs)
            return True
        delta = to_delta(sample.detokenizer, index + event.index, event, params.stop_token_ids)
        sample.observe_arrival(time.monotonic(), metrics, len(delta.token_ids))
        sink.take(delta)
        return True
    return push


def agreed_facts(pool: NodePool) -> ModelFacts | None:
    try:
        return pool.model_facts()
    except PoolMismatch:  # NOTE: nodes that disagree fail the request on its way; the metrics do without
        return None


class RequestTiming:
    """What vLLM's per-request histograms need of one prompt: its prefill queue time, sizes and limits. Each of its
    samples counts as one of vLLM's requests (vLLM runs n samples as n child requests)."""

    def __init__(self, start: float, num_prompt_tokens: int, max_tokens: int, facts: ModelFacts | None):
        self.start = start
        self.queue_seconds = 0.0
        """The prefill node's queue (0 on a colocated node, which does not report it)."""
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = facts.max_model_len if facts is not None else num_prompt_tokens + max_tokens

    def on_queue_time(self, metrics: RouterMetrics) -> Callable[[float], None]:
        def observe(seconds: float) -> None:
            self.queue_seconds = seconds
            metrics.queue_time.observe(seconds)
        return observe

    def observe_sample(self, sample: SampleTiming, now: float, metrics: RouterMetrics) -> None:
        """vLLM's phases: prefill from scheduled (start + queue) to the first token, decode from it to the last."""
        first = now if sample.first is None else sample.first
        prefill = max(0.0, first - self.start - self.queue_seconds)
        decode = now - first
        metrics.prefill_time.observe(prefill)
        metrics.decode_time.observe(decode)
        metrics.inference_time.observe(prefill + decode)
        for name, value in (("vllm:request_prompt_tokens", self.num_prompt_tokens),
                            ("vllm:request_generation_tokens", sample.detokenizer.num_tokens),
                            ("vllm:request_params_max_tokens", self.max_tokens)):
            metrics.token_histogram(name, self.max_model_len).observe(value)


class SampleTiming:
    """One sample's detokenizer and latency marks."""

    def __init__(self, start: float, detokenizer: IncrementalDetokenizer):
        self.first: float | None = None
        self.last = start
        self.detokenizer = detokenizer

    def observe_arrival(self, now: float, metrics: RouterMetrics, num_tokens: int) -> None:
        """num_tokens of this sample arrived at now (a delta's: its tokens kept after a stop)."""
        if self.first is None:
            self.first = now
            metrics.streamed_tokens.add(num_tokens, None)
        else:
            metrics.streamed_tokens.add(num_tokens, now - self.last)
        self.last = now

    def observe_finish(self, now: float, metrics: RouterMetrics, finish_reason: str) -> None:
        metrics.request_success.labels(metrics.model_name, finish_reason).inc()
        if self.detokenizer.num_tokens > 1:
            metrics.time_per_output_token.observe((now - self.first) / (self.detokenizer.num_tokens - 1))


def to_delta(detokenizer: IncrementalDetokenizer, index: int, event: TokenEvent,
             stop_token_ids: tuple[int, ...] = ()) -> ChoiceDelta:
    text = detokenizer.add(event.token_ids, finished=event.finish_reason is not None)
    kept = event.token_ids[:text.num_tokens]
    logprobs = None if event.logprobs is None else tuple(event.logprobs[:text.num_tokens])
    finish_reason = "stop" if text.stopped else event.finish_reason
    stop_reason = detokenizer.matched_stop_string if text.stopped else None
    if finish_reason == "stop" and stop_reason is None and kept and kept[-1] in stop_token_ids:
        stop_reason = kept[-1]  # NOTE: as vLLM: a stop token id names itself; EOS leaves it None
    prompt_logprobs = None if event.prompt_logprobs is None else tuple(event.prompt_logprobs)
    return ChoiceDelta(index, text.text, tuple(kept), logprobs, finish_reason, stop_reason, prompt_logprobs,
                       event.num_cached_tokens)


def merge(streams: list[AsyncIterator[ChoiceDelta]]) -> AsyncIterator[ChoiceDelta]:
    """Items of every stream in arrival order; the first error cancels the others and is raised. One stream is
    itself (no task and queue hop per item: the common case, one prompt)."""
    return streams[0] if len(streams) == 1 else merged(streams)


async def merged(streams: list[AsyncIterator[ChoiceDelta]]) -> AsyncIterator[ChoiceDelta]:
    queue: asyncio.Queue = asyncio.Queue()
    tasks = [asyncio.create_task(pump(stream, queue)) for stream in streams]
    try:
        for _ in range(len(tasks)):
            while (item := await queue.get()) is not STREAM_END:
                if isinstance(item, BaseException):
                    raise item
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


STREAM_END = object()


async def pump(stream: AsyncIterator[ChoiceDelta], queue: asyncio.Queue) -> None:
    try:
        async for item in stream:
            queue.put_nowait(item)
    except Exception as error:
        queue.put_nowait(error)
    finally:
        await stream.aclose()
    queue.put_nowait(STREAM_END)
