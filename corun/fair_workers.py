"""Worker threads that take their jobs tenant by tenant: each tenant's jobs in arrival order, the tenants in turn.

A node compiles structured-output constraints on such threads (corun/structured.py): a schema can take seconds to
compile, and with first come, first served one client's burst of large schemas would queue another client's
constrained request behind all of them (issue 23's rule for prompts, node_core/tenant_turns.py, applied to compiles).
One tenant (every request of a router without client keys) is first come, first served.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future


class FairWorkers:
    def __init__(self, num_threads: int, name: str):
        self._queues: OrderedDict[str, deque[tuple[Future, Callable, tuple]]] = OrderedDict()
        """Tenant -> its jobs waiting; the first tenant's turn is next."""
        self._changed = threading.Condition()
        # NOTE: daemon threads: a node that exits does not wait for a compile nobody will use
        for i in range(num_threads):
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True).start()

    def submit(self, tenant: str, fn: Callable, *args) -> Future:
        future: Future = Future()
        with self._changed:
            self._queues.setdefault(tenant, deque()).append((future, fn, args))
            self._changed.notify()
        return future

    def _next_job(self) -> tuple[Future, Callable, tuple]:
        with self._changed:
            while not self._queues:
                self._changed.wait()
            tenant, jobs = self._queues.popitem(last=False)
            job = jobs.popleft()
            if jobs:  # NOTE: behind every other tenant waiting now
                self._queues[tenant] = jobs
            return job

    def _work(self) -> None:
        while True:
            future, fn, args = self._next_job()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as error:  # NOTE: the waiter gets it, whatever it is; the thread goes on
                future.set_exception(error)
