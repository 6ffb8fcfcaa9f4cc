"""wire/gc_heap.py: what exists when a process is ready to serve is never walked by a collection again."""

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from wire.gc_heap import FULL_COLLECTION_THRESHOLD, CollectionPauses

CHILD = """
import gc, sys, weakref
from wire.gc_heap import freeze_startup_heap
class Cycle: pass
startup = [[i] for i in range(10_000)]  # NOTE: tracked containers, as a model's modules and configs are
garbage = Cycle()
garbage.self = garbage  # NOTE: a cycle only the collector frees
freed = weakref.ref(garbage)
del garbage
gc.disable()  # NOTE: no collection of its own between here and the freeze
before = gc.get_freeze_count()
if sys.argv[1] == "freeze_startup_heap":
    freeze_startup_heap()
else:
    gc.freeze()  # NOTE: the inverse: frozen with its garbage
print(before, gc.get_freeze_count(), freed() is None)
"""


def frozen(how: str) -> tuple[int, int, bool]:
    # NOTE: in a child: freezing this pytest process would outlive the test
    out = subprocess.run([sys.executable, "-c", CHILD, how], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[1]).stdout
    before, after, garbage_freed = out.split()
    return int(before), int(after), garbage_freed == "True"


def test_the_startup_heap_is_frozen_and_its_garbage_collected_first():
    before, after, garbage_freed = frozen("freeze_startup_heap")
    assert before == 0 and after >= 10_000  # NOTE: the startup objects left the collected generations
    assert garbage_freed
    _, _, garbage_freed = frozen("freeze_only")
    assert not garbage_freed  # NOTE: the inverse: a freeze alone keeps the startup's garbage for good


BURST = """
import gc, sys
from wire.gc_heap import spread_full_collections
full = [0]
gc.callbacks.append(lambda phase, info: full.__setitem__(0, full[0] + (phase == "stop" and info["generation"] == 2)))
if sys.argv[1] == "spread_full_collections":
    spread_full_collections()
in_flight = []
for request in range(50_000):  # NOTE: a burst: each request's objects live on while later ones arrive
    in_flight.append([[request] for _ in range(10)])
print(full[0], *gc.get_threshold())
"""


def full_collections_in_a_burst(how: str) -> tuple[int, list[int]]:
    out = subprocess.run([sys.executable, "-c", BURST, how], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[1]).stdout.split()
    return int(out[0]), [int(threshold) for threshold in out[1:]]


def test_a_burst_of_long_lived_requests_walks_the_heap_in_full_collections_far_less_often():
    spread, thresholds = full_collections_in_a_burst("spread_full_collections")
    default, default_thresholds = full_collections_in_a_burst("defaults")
    assert thresholds == [*default_thresholds[:2], FULL_COLLECTION_THRESHOLD]  # NOTE: young ones as they were
    # NOTE: the inverse is CPython's default: a full collection every few thousand surviving requests (5 here)
    assert default >= 3 and spread <= default // 3


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def collect_taking(pauses: CollectionPauses, clock: FakeClock, generation: int, seconds: float) -> None:
    """What the collector does around one collection of that generation that took seconds."""
    pauses._on_collection("start", {"generation": generation})
    clock.now += seconds
    pauses._on_collection("stop", {"generation": generation, "collected": 0, "uncollectable": 0})


def test_each_collection_counts_in_its_generation_and_the_first_bucket_it_is_within():
    clock = FakeClock()
    pauses = CollectionPauses((0.001, 0.01, float("inf")), clock)
    for generation, seconds in ((0, 0.0005), (0, 0.001), (1, 0.004), (2, 0.5)):  # NOTE: 0.001 is le 0.001
        collect_taking(pauses, clock, generation, seconds)
    taken = {generation: (counts, total) for generation, counts, total in pauses.take()}
    assert taken.keys() == {0, 1, 2}
    assert taken[0][0] == [2, 0, 0] and taken[0][1] == pytest.approx(0.0015)
    assert taken[1][0] == [0, 1, 0] and taken[2][0] == [0, 0, 1]
    assert pauses.take() == []  # NOTE: taken once


def test_a_started_tally_sees_the_process_collections_and_a_stopped_one_none():
    pauses = CollectionPauses((float("inf"),))
    pauses.start()
    try:
        gc.collect(1)
    finally:
        pauses.stop()
    assert [(generation, counts) for generation, counts, _ in pauses.take()] == [(1, [1])]
    gc.collect(1)
    assert pauses.take() == []  # NOTE: the inverse: stopped, it counts nothing
