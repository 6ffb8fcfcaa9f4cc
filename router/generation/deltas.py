"""Token events of each prompt turned into text deltas, and several prompts' deltas merged as they come."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from router.generation.detokenizer import IncrementalDetokenizer
from router.generation.output import ChoiceDelta, OutputOptions
from router.generation.pipeline import generate
from router.metrics import RouterMetrics
from router.nodes.choice import Placement
from router.nodes.pool import NodePool
from wire.protocol import TokenEvent
from wire.sampling_params import SamplingParams
from wire.tokenizer import Tokenizer


async def prompt_deltas(pool: NodePool, tokenizer: Tokenizer, metrics: RouterMetrics, index: int, request_id: str,
                        prompt_token_ids: list[int], params: SamplingParams, stop_strings: tuple[str, ...],
                        placement: Placement = Placement(),
                        output: OutputOptions = OutputOptions()) -> AsyncIterator[ChoiceDelta]:
    """One prompt's choices (index, index + 1, ... for its n samples): detokenised, each cut at a stop string
    (which aborts that sample's decode), timed for metrics."""
    start = time.monotonic()
    samples = [SampleTiming(start, IncrementalDetokenizer(tokenizer, stop_strings, output.include_stop_str_in_output,
                                                          output.skip_special_tokens, params.min_tokens))
               for _ in range(params.n)]
    stopped: set[int] = set()
    metrics.prompt_tokens.inc(len(prompt_token_ids))
    events = generate(pool, request_id, prompt_token_ids, params, params.seed, placement, stopped,
                      metrics.queue_time.observe)
    num_events = num_finished = 0
    try:
        async for event in events:
            now = time.monotonic()
            if num_events == 0:
                metrics.time_to_first_token.observe(now - start)
            num_events += 1
            sample = samples[event.index]
            sample.observe_arrival(now, metrics)
            delta = to_delta(sample.detokenizer, index + event.index, event, params.stop_token_ids)
            metrics.generated_tokens.inc(len(delta.token_ids))
            yield delta
            if delta.finish_reason is not None:
                stopped.add(event.index)
                sample.observe_finish(now, metrics, delta.finish_reason)
                num_finished += 1
                if num_finished == params.n:
                    metrics.request_latency.observe(now - start)
                    return
    finally:
        # NOTE: closing the event stream early is what sends the decode node an Abort.
        await events.aclose()


class SampleTiming:
    """One sample's detokenizer and latency marks."""

    def __init__(self, start: float, detokenizer: IncrementalDetokenizer):
        self.first: float | None = None
        self.last = start
        self.detokenizer = detokenizer

    def observe_arrival(self, now: float, metrics: RouterMetrics) -> None:
        if self.first is None:
            self.first = now
        else:
            metrics.inter_token_latency.observe(now - self.last)
        self.last = now

    def observe_finish(self, now: float, metrics: RouterMetrics, finish_reason: str) -> None:
        metrics.request_success.labels(finish_reason).inc()
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
    return ChoiceDelta(index, text.text, tuple(kept), logprobs, finish_reason, stop_reason, prompt_logprobs)


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
