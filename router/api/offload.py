"""A request's CPU work (JSON decoding, chat-template rendering, tokenization) off the router's event loop.

A thread frees the loop only while its work lets go of the GIL, and the heavy steps do not: the tokenizer's
encode holds it throughout (tokenizers 0.23; measured: a ticking thread stalls for the whole encode, ~1 ms per KiB
of text), as do json.loads and freeing a long prompt's encoding. A 20 MB prompt blocked /health for 20 s tokenized
on the loop, and as long (21 s) in asyncio.to_thread. So bodies of LARGE_BODY_BYTES or more are parsed in worker
processes, which share no GIL with the loop (/health then answered within 13 ms throughout); smaller ones in a
thread, which copies nothing between processes and holds the GIL for tens of milliseconds at most; the smallest
(most requests: a short prompt or token ids) on the loop itself, where they cost less than the hop to a thread.

A parse in a worker has a deadline (RouterConfig.parse_timeout_s) and ends when its client goes: either way its
worker is killed, which is the only way to stop an encode, and frees what it held at once; the next large body
gets a fresh worker. (A thread's parse cannot be stopped, but its body is under LARGE_BODY_BYTES.)

Both run the same function with the same tokenizer files: where a body is parsed never changes its result.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TypeVar

from router.api.errors import RequestError
from wire.tokenizer import Tokenizer, load_tokenizer

logger = logging.getLogger(__name__)

T = TypeVar("T")
LARGE_BODY_BYTES = 32 * 2**10
"""From this size on a body is parsed in a worker process: below it, tokenizing holds the GIL ~25 ms at most
(measured on the tiny model's BPE), and the copies to a worker (~1 ms) would cost more than they save."""
INLINE_BODY_BYTES = 4 * 2**10
"""Below this size a body is parsed on the event loop, where the hop to a thread and back cost the loop ~0.1 ms of
CPU per request besides the parse. Measured on a 2-core AMD EPYC: 500 token ids (2.3 KiB) parse in ~0.15 ms, a
4 KiB text prompt in ~3 ms, a 4 KiB chat about as long, nearly all of it in the tokenizer's encode, which holds the
GIL in a thread too: the loop would wait for it either way. (1 KiB until stop 40: prompts of token ids, as lm-eval's
multiple choice sends them, paid the hop.)"""
NUM_WORKER_PROCESSES = min(4, os.cpu_count() or 1)
"""Large bodies parsed at once; more wait their turn (queued, not refused: admission comes after parsing)."""
ORPHAN_CHECK_S = 0.5
READY = "ready"
"""What a worker sends once its tokenizer is loaded."""


class Offload:
    """Runs work(tokenizer, body, *args) off the event loop: in a thread, or in a worker process for large bodies.

    work and args travel to the worker by pickle: module-level functions and plain data (no tokenizer, no state);
    a RequestError that work raises comes back as itself."""

    def __init__(self, model_dir: str, tokenizer: Tokenizer, parse_timeout_s: float):
        self._model_dir, self._tokenizer, self._parse_timeout_s = model_dir, tokenizer, parse_timeout_s
        self._idle: list[ParserProcess] = []
        self._workers: set[ParserProcess] = set()
        self._turns: asyncio.Semaphore | None = None

    async def run(self, work: Callable[..., T], body: bytes, *args) -> T:
        if len(body) < INLINE_BODY_BYTES:
            return work(self._tokenizer, body, *args)
        if len(body) < LARGE_BODY_BYTES:
            return await asyncio.to_thread(work, self._tokenizer, body, *args)
        if self._turns is None:
            self._turns = asyncio.Semaphore(NUM_WORKER_PROCESSES)
        async with self._turns:
            worker = await self._take_worker()
            try:
                succeeded, value = await asyncio.wait_for(asyncio.to_thread(worker.call, work, body, args),
                                                          self._parse_timeout_s)
            except BaseException as error:
                # NOTE: timed out, cancelled (the client left), or the worker died: it is stopped, never reused
                self._kill(worker)
                raise parse_failure(error, self._parse_timeout_s) from None
            self._idle.append(worker)
            if not succeeded:
                raise value
            return value

    def close(self) -> None:
        for worker in list(self._workers):
            self._kill(worker)

    async def _take_worker(self) -> ParserProcess:
        if self._idle:
            return self._idle.pop()
        # NOTE: spawn, not fork: fork would copy the router's other threads (zmq's, asyncio's) mid-operation.
        # The workers start on first use: a router that never sees a large body never starts one.
        starting = asyncio.ensure_future(asyncio.to_thread(ParserProcess, self._model_dir, os.getpid()))
        try:
            worker = await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(lambda done: done.exception() is None and done.result().kill())
            raise
        self._workers.add(worker)
        return worker

    def _kill(self, worker: ParserProcess) -> None:
        self._workers.discard(worker)
        worker.kill()


def parse_failure(error: BaseException, parse_timeout_s: float) -> BaseException:
    """What a parse whose worker had to be stopped raises: a 413 past the deadline, a 503 when the worker died, the
    cancellation itself."""
    if isinstance(error, TimeoutError):
        return RequestError(413, f"parsing this request took longer than {parse_timeout_s:g} s (the router's "
                                 "--parse-timeout-s): send shorter prompts")
    if isinstance(error, EOFError | OSError):
        return RequestError(503, "the router's parser process died while parsing this request; retry")
    return error


class ParserProcess:
    """One worker process and the pipe to it; made (in a thread: it waits) once the worker is ready."""

    def __init__(self, model_dir: str, router_pid: int):
        context = multiprocessing.get_context("spawn")
        self._connection, child_end = context.Pipe()
        self.process = context.Process(target=serve_parses, args=(child_end, model_dir, router_pid), daemon=True,
                                       name="corun-router-parser")
        self.process.start()
        child_end.close()
        if self._connection.recv() != READY:
            raise RuntimeError("a parser process did not start")

    def call(self, work: Callable[..., T], body: bytes, args: tuple) -> tuple[bool, T | Exception]:
        """Blocks until the worker answers: (True, the result) or (False, the exception work raised); EOFError or
        OSError if the worker dies (or is killed) meanwhile."""
        self._connection.send((work, args))
        self._connection.send_bytes(body)  # NOTE: as it is: a pickle would copy it on both sides
        return self._connection.recv()

    def kill(self) -> None:
        """NOTE: the pipe is left to be closed when the last reference goes: a thread may still be reading it (it
        sees the end of file now), and closing it under that thread could hand its descriptor to another file."""
        self.process.kill()
        self.process.join()


def serve_parses(connection: Connection, model_dir: str, router_pid: int) -> None:
    """A worker's life: load the tokenizer, then answer each (work, args) and body with (True, result) or (False,
    the exception), until the router closes the pipe."""
    # NOTE: Ctrl-C reaches the whole process group: the router decides when its workers stop (close()).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=exit_with_router, args=(router_pid,), name="exit with the router", daemon=True).start()
    tokenizer = load_tokenizer(model_dir)
    connection.send(READY)
    while True:
        try:
            work, args = connection.recv()
            body = connection.recv_bytes()
        except EOFError:
            return
        try:
            answer = (True, work(tokenizer, body, *args))
        except Exception as error:  # NOTE: the router's error middleware answers it (a 500 unless a RequestError)
            answer = (False, error)
        del body
        connection.send(answer)


def exit_with_router(router_pid: int) -> None:
    """A router that dies without close() (SIGKILL, out of memory) leaves its workers waiting on a pipe whose
    write end they may share with siblings: they would never see it close. So each leaves once it is orphaned."""
    while os.getppid() == router_pid:
        time.sleep(ORPHAN_CHECK_S)
    os._exit(0)
