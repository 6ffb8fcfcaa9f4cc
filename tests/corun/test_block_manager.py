"""KV block accounting: the null block, all-or-nothing allocation, rounding, and freeing."""

import pytest

from corun.block_manager import NULL_BLOCK, BlockManager


def test_null_block_is_never_handed_out():
    bm = BlockManager(num_blocks=5, block_size=4)
    assert NULL_BLOCK == 0
    assert bm.num_usable_blocks == bm.num_free_blocks == 4
    handed_out = bm.allocate(4 * 4)
    assert sorted(handed_out) == [1, 2, 3, 4]
    assert bm.num_free_blocks == 0
    bm.free(handed_out)
    # one block at a time, many times around the deque: block 0 never appears
    for _ in range(20):
        (block,) = bm.allocate(1)
        assert block != NULL_BLOCK
        bm.free([block])


def test_fewer_than_two_blocks_is_an_error():
    with pytest.raises(ValueError, match="at least 2"):
        BlockManager(num_blocks=1, block_size=16)


@pytest.mark.parametrize("num_tokens, expected", [
    (0, 0), (1, 1), (15, 1), (16, 1), (17, 2), (32, 2), (33, 3), (1000, 63),
])
def test_blocks_needed_rounds_up(num_tokens, expected):
    assert BlockManager(num_blocks=100, block_size=16).blocks_needed(num_tokens) == expected


def test_blocks_needed_block_size_one():
    assert BlockManager(num_blocks=4, block_size=1).blocks_needed(7) == 7


def test_allocate_returns_none_when_it_does_not_fit_and_changes_nothing():
    bm = BlockManager(num_blocks=5, block_size=8)  # 4 usable blocks = 32 tokens
    first = bm.allocate(20)  # 3 blocks
    assert first is not None and len(first) == 3
    before = list(bm.free_block_ids)
    assert not bm.can_allocate(9)  # would need 2 blocks, 1 is free
    result = bm.allocate(9)
    assert result is None  # not -1, not [], not a partial list
    assert list(bm.free_block_ids) == before
    assert bm.num_free_blocks == 1
    # what does fit still fits
    assert bm.can_allocate(8)
    assert len(bm.allocate(8)) == 1
    assert bm.allocate(1) is None
    assert bm.num_free_blocks == 0


def test_allocate_more_than_the_cache_ever_has_returns_none():
    bm = BlockManager(num_blocks=3, block_size=16)
    assert bm.allocate(3 * 16) is None  # 3 blocks > 2 usable
    assert bm.num_free_blocks == 2


@pytest.mark.parametrize("prompt, max_tokens, block_size", [(1, 1, 16), (15, 1, 16), (16, 1, 16), (10, 22, 16),
                                                             (100, 28, 16), (7, 9, 4), (5, 5, 1)])
def test_allocation_covers_the_whole_sequence(prompt, max_tokens, block_size):
    bm = BlockManager(num_blocks=200, block_size=block_size)
    total = prompt + max_tokens
    blocks = bm.allocate(total)
    assert len(blocks) == -(-total // block_size)
    assert len(blocks) * block_size >= total > (len(blocks) - 1) * block_size
    assert len(set(blocks)) == len(blocks) and NULL_BLOCK not in blocks
    assert bm.num_free_blocks == 199 - len(blocks)


def test_allocations_are_disjoint():
    bm = BlockManager(num_blocks=11, block_size=4)
    a, b, c = bm.allocate(9), bm.allocate(12), bm.allocate(13)
    assert (len(a), len(b), len(c)) == (3, 3, 4)
    assert not (set(a) & set(b)) and not (set(a) & set(c)) and not (set(b) & set(c))
    assert set(a) | set(b) | set(c) == set(range(1, 11))
    assert bm.allocate(1) is None


def test_free_returns_blocks():
    bm = BlockManager(num_blocks=9, block_size=4)
    a = bm.allocate(16)
    b = bm.allocate(16)
    assert bm.num_free_blocks == 0
    bm.free(a)
    assert bm.num_free_blocks == 4
    again = bm.allocate(16)
    assert sorted(again) == sorted(a)
    bm.free(b)
    bm.free(again)
    assert bm.num_free_blocks == 8
    assert sorted(bm.free_block_ids) == list(range(1, 9))


def test_freeing_the_null_block_raises_and_frees_nothing():
    bm = BlockManager(num_blocks=6, block_size=4)
    blocks = bm.allocate(8)
    free_before = list(bm.free_block_ids)
    with pytest.raises(ValueError, match="null block"):
        bm.free([NULL_BLOCK])
    with pytest.raises(ValueError, match="null block"):
        bm.free(blocks + [NULL_BLOCK])
    assert list(bm.free_block_ids) == free_before


def test_double_free_and_unknown_blocks_are_refused():
    manager = BlockManager(num_blocks=8, block_size=4)
    block_ids = manager.allocate(8)
    manager.free(block_ids)
    with pytest.raises(ValueError, match="double free"):
        manager.free(block_ids)
    with pytest.raises(ValueError, match="double free"):
        manager.free([5])
    assert manager.num_free_blocks == 7
