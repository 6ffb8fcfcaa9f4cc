"""benchmarks/front_door.py's 1P1D splits: auto, or the two nodes' KV in MiB, several beside one engine run."""

import argparse

import pytest

from benchmarks.front_door import kv_splits, swap_spaces


def test_splits_read_auto_and_prefill_slash_decode_mib_in_order():
    assert kv_splits("auto") == [None]
    assert kv_splits("auto,8000/80000,4000/88000") == [None, (8000, 80000), (4000, 88000)]


@pytest.mark.parametrize("text", ["8000", "8000/", "a/b", "8000/80000/1", "Auto"])
def test_a_split_that_is_neither_is_refused_with_the_form_it_takes(text):
    with pytest.raises(argparse.ArgumentTypeError, match="auto or PREFILL_MIB/DECODE_MIB"):
        kv_splits(text)


def test_swap_spaces_read_auto_and_mib_in_order_and_refuse_anything_else():
    assert swap_spaces("auto,0,65536") == [None, 0, 65536]
    with pytest.raises(argparse.ArgumentTypeError, match="auto or MiB"):
        swap_spaces("auto,lots")
