"""A captured graph's static inputs kept in one DeviceBlock: a step's values reach every input in one load, exactly
as copies one by one would put them (CPU here; the GPU tests replay the graphs that read them)."""

import pytest
import torch

from corun.device_copies import DeviceBlock, read_back, read_joined
from corun.request import Request
from corun.scheduler import PrefillChunk
from corun.step_inputs import BlockTableRows, build_prefill_pack, build_window_decode
from wire.sampling_params import SamplingParams

BLOCK_SIZE = 4


def like_tensors() -> list[torch.Tensor]:
    """Mixed dtypes and sizes, odd byte counts between them, and an empty one."""
    return [torch.arange(5, dtype=torch.int64), torch.zeros(3, dtype=torch.int32), torch.ones(2, 3, dtype=torch.bool),
            torch.empty(0, 4, dtype=torch.int64), torch.full((7,), 2.5, dtype=torch.float32)]


def fresh_values(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(-2**40, 2**40, (5,), generator=gen), torch.randint(-99, 99, (3,), generator=gen,
                                                                             dtype=torch.int32),
            torch.rand(2, 3, generator=gen) > 0.5, torch.empty(0, 4, dtype=torch.int64),
            torch.rand(7, generator=gen)]


def test_views_hold_the_values_they_were_made_from_in_one_aligned_buffer():
    like = like_tensors()
    block = DeviceBlock(like, "cpu")
    start = block.buffer.data_ptr()
    for view, tensor in zip(block.views, like, strict=True):
        assert view.dtype == tensor.dtype and view.shape == tensor.shape and torch.equal(view, tensor)
        if view.numel():  # NOTE: an empty tensor's data_ptr is 0
            assert (view.data_ptr() - start) % DeviceBlock.ALIGN == 0
            assert start <= view.data_ptr() < start + block.buffer.numel()


def test_load_puts_each_source_in_its_view_and_nothing_else_moves():
    block = DeviceBlock(like_tensors(), "cpu")
    views_before = [view.data_ptr() for view in block.views]
    first, second = fresh_values(1), fresh_values(2)
    for values in (first, second):
        block.load(values)
        for view, value in zip(block.views, values, strict=True):
            assert torch.equal(view, value)
    assert [view.data_ptr() for view in block.views] == views_before  # NOTE: a graph reads these addresses
    assert not torch.equal(block.views[0], first[0])  # inverse: the comparison sees a change of values
    strided = [torch.arange(10)[::2], *second[1:]]  # NOTE: not contiguous
    block.load(strided)
    assert torch.equal(block.views[0], torch.arange(0, 10, 2))


@pytest.mark.parametrize("bad", ["shape", "dtype", "count"])
def test_a_source_unlike_its_view_is_refused(bad):
    block = DeviceBlock(like_tensors(), "cpu")
    values = fresh_values(3)
    if bad == "shape":
        values[0] = torch.zeros(6, dtype=torch.int64)
    elif bad == "dtype":
        values[1] = values[1].to(torch.int64)
    else:
        values = values[:-1]
    with pytest.raises(ValueError):
        block.load(values)


def request(i: int, prompt_len: int, blocks: list[int]) -> Request:
    r = Request.create(str(i), [100 + i * 7 + t for t in range(prompt_len)], SamplingParams(max_tokens=4), i,
                       frozenset())
    r.block_ids = blocks
    return r


@pytest.mark.parametrize("whole_prompt", [False, True])
def test_a_pack_copied_to_static_inputs_equals_the_pack(whole_prompt):
    table_rows = BlockTableRows(window_blocks=8)
    num_seqs = 1 if whole_prompt else 3
    static = build_prefill_pack([], 32, num_seqs, BLOCK_SIZE, table_rows, whole_prompt=whole_prompt).to_static("cpu")
    if whole_prompt:
        chunks = [PrefillChunk(request(0, 9, [4, 5, 6]), 0, 9)]
    else:
        chunks = [PrefillChunk(request(0, 13, [4, 5, 6, 7]), 4, 9), PrefillChunk(request(1, 6, [9, 10]), 0, 6)]
    pack = build_prefill_pack(chunks, 32, num_seqs, BLOCK_SIZE, table_rows, whole_prompt=whole_prompt)
    differs_before = [not torch.equal(s, p) for s, p in zip(static.tensors(), pack.tensors(), strict=True)]
    assert any(differs_before)  # inverse: an empty pack's inputs are not this pack's
    pack.copy_to(static)
    assert static.block is not None and (static.packed is None) == whole_prompt
    for target, source in zip(static.tensors(), pack.tensors(), strict=True):
        assert torch.equal(target, source)


def test_a_decode_step_copied_to_static_inputs_equals_the_step():
    table_rows = BlockTableRows(window_blocks=4)
    static = build_window_decode([], 8, 4, BLOCK_SIZE, table_rows).to_static("cpu")
    requests = [request(0, 5, [3, 4]), request(1, 9, [9, 10, 11])]
    for r in requests:
        r.output_token_ids = [7]
    step = build_window_decode(requests, 8, 4, BLOCK_SIZE, table_rows)
    assert not torch.equal(static.block_tables, step.block_tables)
    step.copy_to(static)
    for target, source in zip(static.tensors(), step.tensors(), strict=True):
        assert torch.equal(target, source)


def test_read_back_returns_each_tensor_whole_whatever_the_mix_of_sizes():
    """Odd row counts put a 4-byte tensor before an 8-byte one in any fixed order; each comes back bit for bit."""
    gen = torch.Generator().manual_seed(4)
    for num in (1, 3, 4):
        tensors = [torch.randint(0, 2**40, (num,), generator=gen), torch.randn(num, generator=gen),
                   torch.randint(0, 2**40, (num, 5), generator=gen), torch.randn(num, 5, generator=gen),
                   torch.empty(num, 0, dtype=torch.int64)]
        for back in (read_joined(tensors), read_back(tensors)):  # NOTE: a GPU's path (the join), then the CPU's
            for original, copy in zip(tensors, back, strict=True):
                assert copy.shape == tuple(original.shape)
                assert torch.equal(torch.from_numpy(copy.copy()), original)
                assert copy.tolist() == original.tolist()  # NOTE: what the engine reads
