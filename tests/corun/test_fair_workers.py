"""FairWorkers (corun/fair_workers.py): the tenants' jobs take turns, each tenant's in arrival order; one tenant's are
first come, first served; a job's exception reaches its waiter and the worker goes on."""

import threading

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
