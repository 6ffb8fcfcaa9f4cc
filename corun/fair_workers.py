"""Worker threads that take their jobs tenant by tenant: each tenant's jobs in arrival order, the tenants in turn.

A node compiles structured-output constraints on such threads (corun/structured.py): a schema can take seconds to
compile, and with first come, first served one client's burst of large schemas would queue another client's
constrained request behind all of them (issue 23's rule for prompts, node_core/tenant_turns.py, applied to compiles).
One tenant (every request of a router without client keys) is first come, first served.

Turns alone do not help against a job that runs for minutes (a compile cannot be interrupted, and a huge schema
compiles that long): once every thread has run its job for spare_after_s, a tenant with no job running gets a spare
thread for its next job, up to max_spares at once, so that one client's slow compiles never hold every thread while
another's wait. A spare runs that one job and ends.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future

Job = tuple[Future, Callable, tuple]


class FairWorkers:
    def __init__(self, num_threads: int, name: str, spare_after_s: float | None = None, max_spares: int = 0):
        """spare_after_s: how long every thread must have run its job before a waiting tenant with no job running gets
        a spare thread (None: never)."""
        self._queues: OrderedDict[str, deque[Job]] = OrderedDict()
        """Tenant -> its jobs waiting; the first tenant's turn is next."""
        self._changed = threading.Condition()
        self._name, self._spare_after_s, self._max_spares = name, spare_after_s, max_spares
        self._running: Counter[str] = Counter()
        """Tenant -> its jobs running now."""
        self._started: dict[int, float] = {}
        """Worker thread (not spare) -> when its job started; absent while it waits for one."""
        self._num_threads = num_threads
        self._num_spares = 0
        self._spare_timer: threading.Timer | None = None
        # NOTE: daemon threads: a node that exits does not wait for a compile nobody will use
        for i in range(num_threads):
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True).start()

    def submit(self, tenant: str, fn: Callable, *args) -> Future:
        future: Future = Future()
        with self._changed:
            self._queues.setdefault(tenant, deque()).append((future, fn, args))
            self._changed.notify()
            self._watch_for_spare()
        return future

    def _next_job(self) -> tuple[str, Job]:
        with self._changed:
            while not self._queues:
                self._changed.wait()
            tenant, job = self._take(next(iter(self._queues)))
            self._started[threading.get_ident()] = time.monotonic()
            return tenant, job

    def _take(self, tenant: str) -> tuple[str, Job]:
        """tenant's next job, counted as running; tenant goes behind every other tenant waiting now. Under the lock."""
        jobs = self._queues.pop(tenant)
        job = jobs.popleft()
        if jobs:
            self._queues[tenant] = jobs
        self._running[tenant] += 1
        return tenant, job

    def _work(self) -> None:
        while True:
            tenant, job = self._next_job()
            run(job)
            with self._changed:
                del self._started[threading.get_ident()]
                self._ended(tenant)

    def _ended(self, tenant: str) -> None:
        """Under the lock."""
        self._running[tenant] -= 1
        if not self._running[tenant]:
            del self._running[tenant]

    # --- spares ---------------------------------------------------------------------------------------------------
    def _watch_for_spare(self) -> None:
        """Under the lock: look again once the youngest running job is spare_after_s old, if a spare may be due."""
        if self._spare_after_s is None or self._num_spares >= self._max_spares or self._spare_timer is not None:
            return
        if len(self._started) < self._num_threads or self._tenant_without_running() is None:
            return  # NOTE: a thread is free (or about to be), or every waiting tenant has a job running
        delay = max(0.0, max(self._started.values()) + self._spare_after_s - time.monotonic())
        self._spare_timer = threading.Timer(delay, self._maybe_start_spare)
        self._spare_timer.daemon = True
        self._spare_timer.start()

    def _tenant_without_running(self) -> str | None:
        return next((tenant for tenant in self._queues if tenant not in self._running), None)

    def _maybe_start_spare(self) -> None:
        with self._changed:
            self._spare_timer = None
            now = time.monotonic()
            tenant = self._tenant_without_running()
            every_thread_slow = len(self._started) == self._num_threads and all(
                now - started >= self._spare_after_s for started in self._started.values())
            if tenant is not None and every_thread_slow and self._num_spares < self._max_spares:
                self._num_spares += 1
                threading.Thread(target=self._spare, args=self._take(tenant), daemon=True,
                                 name=f"{self._name}-spare").start()
            self._watch_for_spare()

    def _spare(self, tenant: str, job: Job) -> None:
        run(job)
        with self._changed:
            self._ended(tenant)
            self._num_spares -= 1
            self._watch_for_spare()


def run(job: Job) -> None:
    future, fn, args = job
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn(*args))
    except BaseException as error:  # NOTE: the waiter gets it, whatever it is; the thread goes on
        future.set_exception(error)
