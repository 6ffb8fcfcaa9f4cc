"""FairWorkers (corun/fair_workers.py): the tenants' jobs take turns, each tenant's in arrival order; one tenant's are
first come, first served; a job's exception reaches its waiter and the worker goes on."""

import threading
import time

import pytest

from corun.fair_workers import FairWorkers

TIMEOUT_S = 30


def run_order(submissions: list[tuple[str, str]]) -> list[str]:
    """One worker, held by a first job while every submission queues; -> the order the jobs ran in."""
    workers = FairWorkers(1, "test-fair")
    held = threading.Event()
    started = threading.Event()

    def hold():
        started.set()
        assert held.wait(TIMEOUT_S)

    ran: list[str] = []
    first = workers.submit("first", hold)
    assert started.wait(TIMEOUT_S)
    futures = [workers.submit(tenant, ran.append, name) for tenant, name in submissions]
    held.set()
    first.result(TIMEOUT_S)
    for future in futures:
        future.result(TIMEOUT_S)
    return ran


def test_a_tenants_burst_does_not_queue_another_tenants_job_behind_all_of_it():
    order = run_order([("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("c", "c1"), ("b", "b2")])
    assert order == ["a1", "b1", "c1", "a2", "b2", "a3"]


def test_one_tenant_is_first_come_first_served():
    """Inverse of the above: the same jobs of one tenant keep their arrival order."""
    order = run_order([("", "a1"), ("", "a2"), ("", "a3"), ("", "b1"), ("", "c1"), ("", "b2")])
    assert order == ["a1", "a2", "a3", "b1", "c1", "b2"]


def test_an_exception_reaches_its_waiter_and_the_worker_goes_on():
    workers = FairWorkers(1, "test-fair")

    def fail():
        raise ValueError("bad spec")

    with pytest.raises(ValueError, match="bad spec"):
        workers.submit("a", fail).result(TIMEOUT_S)
    assert workers.submit("a", lambda: 7).result(TIMEOUT_S) == 7


class Holds:
    """Jobs that run until released, each telling when it started."""

    def __init__(self):
        self.release = threading.Event()
        self.started: dict[str, threading.Event] = {}

    def job(self, name: str):
        self.started[name] = threading.Event()

        def hold():
            self.started[name].set()
            assert self.release.wait(TIMEOUT_S)
            return name

        return hold


def test_a_slow_job_holding_every_thread_gives_a_tenant_with_none_running_a_spare():
    """One thread, held by tenant a's job past spare_after_s: tenant b's job runs on a spare meanwhile; a's own next
    job waits for a thread (a has one running), as does c's while the only spare is b's."""
    workers, holds = FairWorkers(1, "test-spare", spare_after_s=0.2, max_spares=1), Holds()
    a1 = workers.submit("a", holds.job("a1"))
    assert holds.started["a1"].wait(TIMEOUT_S)
    a2 = workers.submit("a", holds.job("a2"))
    b1 = workers.submit("b", holds.job("b1"))
    c1 = workers.submit("c", holds.job("c1"))
    assert holds.started["b1"].wait(TIMEOUT_S), "no spare for b"
    time.sleep(0.5)
    assert not holds.started["a2"].is_set() and not holds.started["c1"].is_set()
    holds.release.set()
    assert [f.result(TIMEOUT_S) for f in (a1, a2, b1, c1)] == ["a1", "a2", "b1", "c1"]


def test_without_spares_a_slow_job_holds_every_other_tenant_behind_it():
    """Inverse: spare_after_s None (the turns alone): b's job waits for a's to end."""
    workers, holds = FairWorkers(1, "test-no-spare"), Holds()
    a1 = workers.submit("a", holds.job("a1"))
    assert holds.started["a1"].wait(TIMEOUT_S)
    b1 = workers.submit("b", holds.job("b1"))
    time.sleep(0.5)
    assert not holds.started["b1"].is_set()
    holds.release.set()
    assert (a1.result(TIMEOUT_S), b1.result(TIMEOUT_S)) == ("a1", "b1")
