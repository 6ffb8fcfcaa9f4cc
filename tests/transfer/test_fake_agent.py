"""FakeKVTransferAgent passes the same behavioural scenario as the NIXL agent, in one process."""

from __future__ import annotations

import pytest
import torch

from tests.transfer import scenario
from transfer.compat import IncompatiblePeer
from transfer.fake import FakeKVTransferAgent


@pytest.fixture
def agents():
    prefill_kv, decode_kv = scenario.patterned_kv(), scenario.empty_kv()
    prefill = FakeKVTransferAgent(scenario.PREFILL_NAME, prefill_kv)
    decode = FakeKVTransferAgent(scenario.DECODE_NAME, decode_kv)
    yield prefill, decode, prefill_kv, decode_kv
    decode.close()
    prefill.close()


def test_decode_pulls_prefill_blocks_and_prefill_is_notified(agents):
    prefill, decode, prefill_kv, decode_kv = agents
    result = scenario.pull_blocks(decode, scenario.peer_info(prefill))
    scenario.check_pull_result(result, decode.block_nbytes)
    scenario.check_pulled(decode_kv, prefill_kv)
    assert scenario.wait_for_notifications(prefill, 1) == [(scenario.DECODE_NAME, scenario.NOTIFICATION)]
    assert prefill.new_notifications() == []


def test_read_from_a_peer_that_closed_fails_and_is_counted(agents):
    prefill, decode, _, decode_kv = agents
    decode.add_peer(**scenario.peer_info(prefill))
    handle = decode.start_read(prefill.name, [1], [2], b"n")
    prefill.close()
    assert decode.poll(handle) == "ERR" and decode.poll(handle) == "ERR"
    assert decode.counters.read_failures == 1 and decode.counters.reads_completed == 0
    assert not decode_kv.any()


def test_removed_peer_cannot_be_read(agents):
    prefill, decode, _, _ = agents
    decode.add_peer(**scenario.peer_info(prefill))
    decode.remove_peer(prefill.name)
    assert not decode.has_peer(prefill.name)
    with pytest.raises(KeyError):
        decode.start_read(prefill.name, [1], [2], b"n")


def test_multi_segment_read_copies_the_named_blocks_of_every_segment_and_nothing_else():
    prefill_segments, decode_segments = scenario.random_segments(seed=1), scenario.empty_segments()
    before = [segment.clone() for segment in prefill_segments]
    prefill = FakeKVTransferAgent(scenario.PREFILL_NAME, prefill_segments)
    decode = FakeKVTransferAgent(scenario.DECODE_NAME, decode_segments)
    try:
        result = scenario.pull_blocks(decode, scenario.peer_info(prefill))
        scenario.check_pull_result(result, decode.block_nbytes, scenario.NUM_DESCRIPTORS * scenario.NUM_SEGMENTS)
        scenario.check_pulled_segments(decode_segments, prefill_segments)
        assert all(torch.equal(segment, copy) for segment, copy in zip(prefill_segments, before, strict=True))
        assert decode.block_nbytes == scenario.NUM_SEGMENTS * decode.segment_block_nbytes
        assert scenario.wait_for_notifications(prefill, 1) == [(scenario.DECODE_NAME, scenario.NOTIFICATION)]
    finally:
        decode.close()
        prefill.close()


def test_a_peer_with_another_number_of_segments_is_refused():
    """Same bytes per block, cut into 3 segments on one side and 1 on the other: the blocks would not pair up."""
    one = torch.zeros((scenario.SEGMENT_SHAPE[0], scenario.NUM_SEGMENTS, *scenario.SEGMENT_SHAPE[1:]))
    prefill = FakeKVTransferAgent(scenario.PREFILL_NAME, one)
    decode = FakeKVTransferAgent(scenario.DECODE_NAME, scenario.empty_segments())
    try:
        assert prefill.block_nbytes == decode.block_nbytes
        with pytest.raises(IncompatiblePeer, match="3 KV segments != 1"):
            decode.add_peer(**scenario.peer_info(prefill))
        assert not decode.has_peer(prefill.name)
    finally:
        decode.close()
        prefill.close()
