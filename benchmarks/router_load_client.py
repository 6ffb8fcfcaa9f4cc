"""The router benchmark's clients: one worker process holds its share of the streams, each a closed loop of
streamed POST /v1/completions (a stream that ends is replaced at once) until the measured window ends.

Kept light so that the client is not what is measured: token-id prompts (no tokenizing), one request body packed
once, SSE events split and read with byte searches (json.loads only for a chunk those do not understand, and for
every chunk of a run with logprobs, whose values it checks). Every finished request is checked against
benchmarks.fake_output: exactly max_tokens ids, in order, finish "length", and with logprobs each token's logprob.

Times are time.monotonic(), one system-wide clock on Linux: the benchmark's window means the same in every
process.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import traceback
from dataclasses import dataclass, field

import aiohttp

from benchmarks.fake_output import expected_output, output_logprobs

JSON_HEADERS = {"Content-Type": "application/json"}
TOKEN_IDS = (b'"token_ids":[', b'"token_ids": [')
FINISH_REASON = (b'"finish_reason":', b'"finish_reason": ')
"""The router's compact JSON first, then json.dumps' spaced layout."""
ERROR_EVENT = b'data: {"error"'
MAX_PROBLEMS_KEPT = 5
RETRY_PAUSE_S = 0.1
"""After a refused request, before the stream tries again (a refusal must not become a busy loop)."""
ORPHAN_CHECK_S = 0.5


@dataclass(frozen=True)
class LoadPlan:
    """What one worker process sends."""

    worker: int
    urls: tuple[str, ...]
    """One per router: stream i goes to urls[i % len(urls)]."""
    model: str
    stream_indices: tuple[int, ...]
    """Of 0 .. num_streams - 1 (the others are other workers')."""
    num_streams: int
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    parent_pid: int
    logprobs: int | None = None
    """The requests' logprobs field (None: not asked)."""


@dataclass(frozen=True)
class Schedule:
    """When, in time.monotonic() seconds; the runner sets it once every worker is ready."""

    start_at: float
    ramp_s: float
    """Stream i starts at start_at + ramp_s * i / num_streams: requests then begin and end spread over time, as
    they do in a steady state, instead of all at once."""
    window_start: float
    window_end: float
    """No stream starts a request from here on; those running finish (each is checked)."""
    drain_timeout_s: float
    """Requests still running this long after window_end are cancelled and counted as unfinished."""


@dataclass
class Tally:
    """One worker's measurements: tokens, chunks and gaps count only inside the window."""

    tokens: int = 0
    chunks: int = 0
    tokens_total: int = 0
    """Every token received, warm-up and drain included (to compare with the router's own count)."""
    itl_s: list[float] = field(default_factory=list)
    """Gaps between consecutive token-carrying chunks of one request, both inside the window."""
    ttft_s: list[float] = field(default_factory=list)
    requests_started: int = 0
    completed_exact: int = 0
    wrong_outputs: int = 0
    errors: int = 0
    unfinished: int = 0
    problems: list[str] = field(default_factory=list)
    cpu_s: float = 0.0
    """This worker process's CPU inside the window."""

    def problem(self, kind: str, text: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.problems) < MAX_PROBLEMS_KEPT:
            self.problems.append(f"{kind}: {text}")


def run_worker(plan: LoadPlan, schedules, results) -> None:
    """A worker process: report ready, wait for the schedule, stream, report the tally (multiprocessing target;
    schedules and results are its queues)."""
    results.put(("ready", plan.worker, None))
    schedule = schedules.get(timeout=300)
    try:
        tally = asyncio.run(drive(plan, schedule))
    except BaseException:
        results.put(("failed", plan.worker, traceback.format_exc()))
        raise
    results.put(("done", plan.worker, tally.__dict__))


async def drive(plan: LoadPlan, schedule: Schedule) -> Tally:
    tally = Tally()
    watchdog = asyncio.create_task(exit_when_orphaned(plan.parent_pid))
    cpu = asyncio.create_task(measure_cpu(schedule, tally))
    request = {"model": plan.model, "prompt": list(plan.prompt_token_ids), "max_tokens": plan.max_tokens,
               "stream": True, "ignore_eos": True, "temperature": 0, "return_token_ids": True}
    body = json.dumps(request if plan.logprobs is None else {**request, "logprobs": plan.logprobs}).encode()
    expected = Expected(expected_output(plan.max_tokens), None if plan.logprobs is None else [
        output_logprobs(position, plan.logprobs).logprob for position in range(plan.max_tokens)])
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        streams = [asyncio.create_task(stream_loop(session, f"{plan.urls[i % len(plan.urls)]}/v1/completions", body,
                                                   expected, schedule.start_at + schedule.ramp_s * i / plan.num_streams,
                                                   schedule, tally))
                   for i in plan.stream_indices]
        wait_s = schedule.window_end + schedule.drain_timeout_s - time.monotonic()
        _, running = await asyncio.wait(streams, timeout=max(0.0, wait_s))
        for task in running:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
    await cpu
    watchdog.cancel()
    return tally


async def stream_loop(session: aiohttp.ClientSession, url: str, body: bytes, expected: Expected, first_at: float,
                      schedule: Schedule, tally: Tally) -> None:
    await asyncio.sleep(max(0.0, first_at - time.monotonic()))
    while time.monotonic() < schedule.window_end:
        try:
            await one_request(session, url, body, expected, schedule, tally)
        except asyncio.CancelledError:
            tally.unfinished += 1
            raise
        except Exception as error:  # NOTE: a broken stream is a measured failure, never the end of the run
            tally.problem("errors", f"{type(error).__name__}: {error}")
            await asyncio.sleep(RETRY_PAUSE_S)


@dataclass(frozen=True)
class Expected:
    """A whole stream's output (benchmarks.fake_output)."""

    token_ids: list[int]
    logprobs: list[float] | None
    """Each token's logprob, when the requests ask for logprobs."""


async def one_request(session: aiohttp.ClientSession, url: str, body: bytes, expected: Expected,
                      schedule: Schedule, tally: Tally) -> None:
    sent_at = time.monotonic()
    tally.requests_started += 1
    token_ids: list[int] = []
    logprobs: list[float] = []
    read = read_event if expected.logprobs is None else read_event_with_logprobs
    finish_reason = None
    last_chunk_at: float | None = None
    async with session.post(url, data=body, headers=JSON_HEADERS) as response:
        if response.status != 200:
            tally.problem("errors", f"HTTP {response.status}: {(await response.text())[:200]}")
            await asyncio.sleep(RETRY_PAUSE_S)
            return
        partial = b""
        async for data in response.content.iter_any():
            now = time.monotonic()
            events = (partial + data).split(b"\n\n")
            partial = events.pop()
            for event in events:
                ids, finish, error = read(event, logprobs)
                if error is not None:
                    tally.problem("errors", error)
                    return
                if ids:
                    in_window = schedule.window_start <= now < schedule.window_end
                    if in_window:
                        tally.tokens += len(ids)
                        tally.chunks += 1
                        if last_chunk_at is None:
                            tally.ttft_s.append(now - sent_at)
                        elif last_chunk_at >= schedule.window_start:
                            tally.itl_s.append(now - last_chunk_at)
                    last_chunk_at = now
                    token_ids.extend(ids)
                    tally.tokens_total += len(ids)
                finish_reason = finish or finish_reason
    logprobs_right = expected.logprobs is None or logprobs == expected.logprobs
    if token_ids == expected.token_ids and finish_reason == "length" and logprobs_right:
        tally.completed_exact += 1
    else:
        tally.problem("wrong_outputs", f"{len(token_ids)} tokens (expected {len(expected.token_ids)}), finish_reason "
                                       f"{finish_reason}, first ids {token_ids[:4]}, logprobs "
                                       f"{'right' if logprobs_right else logprobs[:4]}")


def read_event(event: bytes, logprobs: list[float] | None = None) -> tuple[list[int], str | None, str | None]:
    """(token ids, finish_reason, error text) of one SSE event; ([], None, None) for anything else ([DONE])."""
    if event.startswith(ERROR_EVENT):
        return [], None, event[6:300].decode(errors="replace")
    if not event.startswith(b"data: {"):
        return [], None, None
    for token_ids_key, finish_key in zip(TOKEN_IDS, FINISH_REASON, strict=True):
        start, finish_at = event.find(token_ids_key), event.find(finish_key)
        if start >= 0 and finish_at >= 0:
            break
    else:
        return read_event_as_json(event)
    start += len(token_ids_key)
    listed = event[start:event.index(b"]", start)]
    ids = [int(part) for part in listed.split(b",")] if listed else []
    finish_at += len(finish_key)
    finish = None
    if event[finish_at:finish_at + 1] == b'"':
        finish = event[finish_at + 1:event.index(b'"', finish_at + 1)].decode()
    return ids, finish, None


def read_event_as_json(event: bytes, logprobs: list[float] | None = None) -> tuple[list[int], str | None, str | None]:
    """read_event through json.loads; the chunk's token logprobs go to the end of logprobs (when given)."""
    chunk = json.loads(event[6:])
    ids: list[int] = []
    finish = None
    for choice in chunk.get("choices") or []:
        ids.extend(choice.get("token_ids") or [])
        finish = choice.get("finish_reason") or finish
        if logprobs is not None and choice.get("logprobs"):
            logprobs.extend(choice["logprobs"]["token_logprobs"])
    return ids, finish, None


def read_event_with_logprobs(event: bytes, logprobs: list[float]) -> tuple[list[int], str | None, str | None]:
    if event.startswith(ERROR_EVENT) or not event.startswith(b"data: {"):
        return read_event(event)
    return read_event_as_json(event, logprobs)


async def measure_cpu(schedule: Schedule, tally: Tally) -> None:
    await asyncio.sleep(max(0.0, schedule.window_start - time.monotonic()))
    before = time.process_time()
    await asyncio.sleep(max(0.0, schedule.window_end - time.monotonic()))
    tally.cpu_s = time.process_time() - before


async def exit_when_orphaned(parent_pid: int) -> None:
    """The benchmark was killed: leave instead of streaming at a router that is gone too."""
    while os.getppid() == parent_pid:
        await asyncio.sleep(ORPHAN_CHECK_S)
    os._exit(1)
