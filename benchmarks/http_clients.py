"""`corun bench --url`'s client: each request streamed and what it saw, sent from this process or from several client
processes, so that the client is not what is measured.

One asyncio process spends about as much CPU per request as the router does (measured on a 2-core host: ~0.7-0.9 ms
for a 500-token-id completion, most of it opening the connection and framing the request): 256 requests arriving
at once reached a router ~0.14 s after the run began, and a second router changed nothing on the H200 (issue 25's
multiple choice through HTTP). So the requests are shared out to client processes, each streaming its share at
the same arrival times, from one start instant shared by all (CLOCK_MONOTONIC is one clock for every process on
Linux: time.monotonic).
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import aiohttp

from wire.auth import bearer_headers

REQUEST_TIMEOUT_S = 3600.0


@dataclass
class StreamedRequest:
    """What one streamed request saw, in seconds from the run's start."""

    arrived_at: float
    chunk_at: list[float] = field(default_factory=list)
    """When each chunk carrying tokens arrived."""
    chunk_tokens: list[int] = field(default_factory=list)
    """How many tokens each of those chunks carried (more than one when the router fell behind the steps)."""
    num_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None


async def stream_one(session: aiohttp.ClientSession, url: str, body: dict, record: StreamedRequest,
                     start: float) -> None:
    try:
        async with session.post(f"{url}/v1/completions", json=body) as response:
            if response.status != 200:
                record.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return
            async for line in response.content:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                for choice in json.loads(line[6:]).get("choices", []):
                    token_ids = choice.get("token_ids") or []
                    if token_ids:
                        record.chunk_at.append(time.monotonic() - start)
                        record.chunk_tokens.append(len(token_ids))
                        record.num_tokens += len(token_ids)
                    record.finish_reason = choice.get("finish_reason") or record.finish_reason
    except (aiohttp.ClientError, asyncio.TimeoutError) as error:
        record.error = repr(error)


async def open_connections(session: aiohttp.ClientSession, url: str, count: int) -> None:
    """count connections to the server opened now and left idle in the session's pool, so that as many requests
    sent later take one each instead of opening it: a client mid-run (an evaluation harness's session) holds its
    connections open, and a burst of fresh ones measures the TCP handshakes and the client's own connection setup
    before any request reaches the server (256 at once on a 2-core host: the first request reached the router's
    handler 0.23-0.69 s after the start instead of 0.06-0.11 s)."""
    async def one() -> None:
        async with session.get(f"{url}/v1/models") as response:
            await response.read()
    await asyncio.gather(*(one() for _ in range(count)))


def open_session(api_key: str | None) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
                                 connector=aiohttp.TCPConnector(limit=0), headers=bearer_headers(api_key))


async def stream_bodies(session: aiohttp.ClientSession, url: str, bodies: list[dict], times: list[float],
                        max_seconds: float | None, max_concurrency: int | None,
                        start: float | None = None) -> tuple[list[StreamedRequest], float, bool]:
    """Every body streamed at its arrival time (seconds from start: time.monotonic(), now by default) -> (what
    each request that arrived saw, seconds from the start to the last end, whether the run was cut at
    max_seconds)."""
    limit = asyncio.Semaphore(max_concurrency or len(bodies))
    records: list[StreamedRequest | None] = [None] * len(bodies)
    start = time.monotonic() if start is None else start

    async def send(i: int, body: dict, arrive_at: float) -> None:
        await asyncio.sleep(max(0.0, arrive_at - (time.monotonic() - start)))
        record = records[i] = StreamedRequest(time.monotonic() - start)
        async with limit:
            await stream_one(session, url, body, record, start)

    tasks = [asyncio.ensure_future(send(i, body, at)) for i, (body, at) in enumerate(zip(bodies, times, strict=True))]
    if not tasks:
        return [], 0.0, False
    timeout = None if max_seconds is None else max(0.0, start + max_seconds - time.monotonic())
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:  # NOTE: cut at max_seconds: what is still streaming counts as unfinished
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return [record for record in records if record is not None], time.monotonic() - start, bool(pending)


START_DELAY_S = 0.05
"""From the moment every client process is ready to the run's start: enough for each to hear the start time."""


def auto_client_processes(cpu_count: int | None = None) -> int:
    """One client process per four cores, 1 to 8: a core per client leaves the router and the nodes theirs."""
    cpu_count = cpu_count or os.cpu_count() or 1
    return max(1, min(8, cpu_count // 4))


class ClientProcesses:
    """Client processes, each with its share of the bodies (contiguous_shares), started and ready (their imports
    done and sessions open) once made: run() then streams every body at its arrival time from one start instant.
    max_concurrency is shared out: each process keeps at most its ceiling share in flight. warm_connections: each
    process opens the connections its share will use before it is ready (open_connections)."""

    def __init__(self, url: str, bodies: list[dict], times: list[float], max_seconds: float | None,
                 max_concurrency: int | None, num_processes: int, api_key: str | None, warm_connections: bool = False):
        context = multiprocessing.get_context("spawn")  # NOTE: fork would copy the caller's threads mid-operation
        shares = contiguous_shares(len(bodies), max(1, min(num_processes, len(bodies))))
        limit = None if max_concurrency is None else math.ceil(max_concurrency / len(shares))
        self._connections, self._processes = [], []
        self.started_at: float | None = None
        """The last run's start instant (time.monotonic(), CLOCK_MONOTONIC: the host's processes share it)."""
        try:
            for share in shares:
                parent_end, child_end = context.Pipe()
                process = context.Process(target=client_process, name="corun-bench-client", daemon=True,
                                          args=(child_end, url, api_key, [bodies[i] for i in share],
                                                [times[i] for i in share], max_seconds, limit, warm_connections))
                process.start()
                child_end.close()
                self._connections.append(parent_end)
                self._processes.append(process)
            for connection in self._connections:
                if connection.recv() != "ready":
                    raise RuntimeError("a bench client process did not start")
        except BaseException:
            self.close()
            raise

    def run(self) -> tuple[list[StreamedRequest], float, bool]:
        """-> (what each request that arrived saw, seconds from the start to the last request's end, whether the run
        was cut at max_seconds)."""
        self.started_at = start = time.monotonic() + START_DELAY_S
        for connection in self._connections:
            connection.send(start)
        answers = [connection.recv() for connection in self._connections]
        for answer in answers:
            if isinstance(answer, Exception):
                raise answer
        records = [record for share_records, _, _ in answers for record in share_records]
        return records, max(end for _, end, _ in answers), any(cut for _, _, cut in answers)

    def close(self) -> None:
        for process in self._processes:
            process.join(10)
            if process.is_alive():
                process.kill()


def contiguous_shares(num_requests: int, num_processes: int) -> list[range]:
    """Each process's requests: a run of consecutive ones, so that each sends its share in the workload's order and
    requests next to each other (a question's choices, a conversation's turns) leave one process in order. NOTE: dealt
    round-robin, a question's 4 choices left from 4 processes, and one process running ahead sends many questions'
    first choices before their second: multiple choice's TTFT p50 (cache on) was 0.88 s on the H200 with 4
    processes dealt so, against 0.71 s with one process in an earlier call; on CPU, 5.10 s against 3.87-4.42 s
    with one process and 3.78-4.21 s dealt in runs (two runs each, noisy)."""
    bounds = [num_requests * k // num_processes for k in range(num_processes + 1)]
    return [range(start, end) for start, end in zip(bounds, bounds[1:])]


def client_process(connection: Connection, url: str, api_key: str | None, bodies: list[dict], times: list[float],
                   max_seconds: float | None, limit: int | None, warm_connections: bool = False) -> None:
    """One client process: ready once its session is open, then its share from the start instant it is sent; what
    went wrong comes back as the error itself."""
    try:
        answer = asyncio.run(stream_share(connection, url, api_key, bodies, times, max_seconds, limit,
                                          warm_connections))
    except Exception as error:
        answer = error
    connection.send(answer)


async def stream_share(connection: Connection, url: str, api_key: str | None, bodies: list[dict],
                       times: list[float], max_seconds: float | None, limit: int | None, warm_connections: bool):
    async with open_session(api_key) as session:
        if warm_connections:
            await open_connections(session, url, min(len(bodies), limit or len(bodies)))
        connection.send("ready")
        start = await asyncio.to_thread(connection.recv)
        return await stream_bodies(session, url, bodies, times, max_seconds, limit, start)
