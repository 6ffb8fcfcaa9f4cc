"""A request's CPU work (JSON decoding, chat-template rendering, tokenization) off the router's event loop.

A thread frees the loop only while its work lets go of the GIL, and the heavy steps do not: the tokenizer's
encode holds it throughout (tokenizers 0.23; measured: a ticking thread stalls for the whole encode, ~1 ms per KiB
of text), as do json.loads and freeing a long prompt's encoding. A 20 MB prompt blocked /health for 20 s tokenized
on the loop, and as long (21 s) in asyncio.to_thread. So bodies of LARGE_BODY_BYTES or more are parsed in worker
processes, which share no GIL with the loop (/health then answered within 13 ms throughout); smaller ones in a
thread, which copies nothing between processes and holds the GIL for tens of milliseconds at most.

Both run the same function with the same tokenizer files: where a body is parsed never changes its result.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from router.api.errors import RequestError
from wire.tokenizer import Tokenizer, load_tokenizer

T = TypeVar("T")
LARGE_BODY_BYTES = 32 * 2**10
"""From this size on a body is parsed in a worker process: below it, tokenizing holds the GIL ~25 ms at most
(measured on the tiny model's BPE), and the copies to a worker (~1 ms) would cost more than they save."""
NUM_WORKER_PROCESSES = min(4, os.cpu_count() or 1)
"""Large bodies parsed at once; more wait their turn (queued, not refused: admission comes after parsing)."""

ORPHAN_CHECK_S = 0.5
_worker_tokenizer: Tokenizer | None = None
"""In a worker process: its own copy of the router's tokenizer (that one does not pickle: a compiled template)."""


class Offload:
    """Runs work(tokenizer, body, *args) off the event loop: in a thread, or in a worker process for large bodies.

    work and args travel to the worker by pickle: module-level functions and plain data (no tokenizer, no state);
    a RequestError that work raises comes back as itself."""

    def __init__(self, model_dir: str, tokenizer: Tokenizer):
        self._model_dir, self._tokenizer = model_dir, tokenizer
        self._processes: ProcessPoolExecutor | None = None

    async def run(self, work: Callable[..., T], body: bytes, *args) -> T:
        if len(body) < LARGE_BODY_BYTES:
            return await asyncio.to_thread(work, self._tokenizer, body, *args)
        processes = self._worker_processes()
        try:
            return await asyncio.get_running_loop().run_in_executor(processes, run_in_worker, work, body, *args)
        except BrokenProcessPool:
            # NOTE: a worker died (killed, out of memory): that pool takes nothing more; the next one is fresh.
            self._discard(processes)
            raise RequestError(503, "the router's parser process died while parsing this request; retry") from None

    def close(self) -> None:
        if self._processes is not None:
            self._discard(self._processes)

    def _worker_processes(self) -> ProcessPoolExecutor:
        if self._processes is None:
            # NOTE: spawn, not fork: fork would copy the router's other threads (zmq's, asyncio's) mid-operation.
            # The workers start on first use: a router that never sees a large body never starts one.
            self._processes = ProcessPoolExecutor(NUM_WORKER_PROCESSES, multiprocessing.get_context("spawn"),
                                                  initializer=start_worker, initargs=(self._model_dir, os.getpid()))
        return self._processes

    def _discard(self, processes: ProcessPoolExecutor) -> None:
        if self._processes is processes:
            self._processes = None
        processes.shutdown(wait=False, cancel_futures=True)


def start_worker(model_dir: str, router_pid: int) -> None:
    global _worker_tokenizer
    # NOTE: Ctrl-C reaches the whole process group: the router decides when its workers stop (close()).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=exit_with_router, args=(router_pid,), name="exit with the router", daemon=True).start()
    _worker_tokenizer = load_tokenizer(model_dir)


def exit_with_router(router_pid: int) -> None:
    """A router that dies without close() (SIGKILL, out of memory) leaves its workers waiting on a queue whose
    write end they hold themselves: they would never see it close. So each leaves once it is orphaned."""
    while os.getppid() == router_pid:
        time.sleep(ORPHAN_CHECK_S)
    os._exit(0)


def run_in_worker(work: Callable[..., T], body: bytes, *args) -> T:
    return work(_worker_tokenizer, body, *args)
