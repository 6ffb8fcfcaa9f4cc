"""Token events of each prompt turned into text deltas, and several prompts' deltas merged as they come."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from corun.protocol import TokenEvent
from corun.sampling_params import SamplingParams
from corun.tokenizer import Tokenizer
from router.detokenizer import IncrementalDetokenizer
from router.metrics import RouterMetrics
from router.nodes import NodePool, Placement
from router.openai_api import OutputOptions
from router.pipeline import generate
from router.responses import ChoiceDelta


async def prompt_deltas(pool: NodePool, tokenizer: Tokenizer, metrics: RouterMetrics, index: int, request_id: str,
                        prompt_token_ids: list[int], params: SamplingParams, stop_strings: tuple[str, ...],
                        placement: Placement = Placement(),
                        output: OutputOptions = OutputOptions()) -> AsyncIterator[ChoiceDelta]:
    """One prompt's choice: detokenised, cut at a stop string (which aborts the decode), timed for metrics."""
    start = last = time.monotonic()
    first = None
    detokenizer = IncrementalDetokenizer(tokenizer, stop_strings, output.include_stop_str_in_output,
                                         output.skip_special_tokens)
    metrics.prompt_tokens.inc(len(prompt_token_ids))
    events = generate(pool, request_id, prompt_token_ids, params, params.seed, placement)
    try:
        async for event in events:
            now = time.monotonic()
            if first is None:
                first = now
                metrics.time_to_first_token.observe(now - start)
            else:
                metrics.inter_token_latency.observe(now - last)
            last = now
            delta = to_delta(detokenizer, index, event, params.stop_token_ids)
            metrics.generated_tokens.inc(len(delta.token_ids))
            yield delta
            if delta.finish_reason is not None:
                metrics.request_latency.observe(now - start)
                metrics.request_success.labels(delta.finish_reason).inc()
                if detokenizer.num_tokens > 1:
                    metrics.time_per_output_token.observe((now - first) / (detokenizer.num_tokens - 1))
                return
    finally:
        # NOTE: closing the event stream early is what sends the decode node an Abort.
        await events.aclose()


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


async def merge(streams: list[AsyncIterator[ChoiceDelta]]) -> AsyncIterator[ChoiceDelta]:
    """Items of every stream in arrival order; the first error cancels the others and is raised."""
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
