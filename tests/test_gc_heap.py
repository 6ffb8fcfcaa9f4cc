"""wire/gc_heap.py: what exists when a process is ready to serve is never walked by a collection again."""

import subprocess
import sys
from pathlib import Path

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
