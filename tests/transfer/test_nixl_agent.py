"""KVTransferAgent over real NIXL (UCX, DRAM) between two spawned processes on this host."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from tests.transfer import scenario
from tests.transfer.nixl_peers import recv_within, run_decode, run_prefill
from transfer.agent import KVTransferAgent
from transfer.compat import IncompatiblePeer

STEP_TIMEOUT_S = 20.0
"""Per message; generous because spawning a process that imports torch and NIXL takes seconds on 2 cores."""


def _receive(conn, who: str, keep_alive=lambda: None) -> dict:
    message = recv_within(conn, STEP_TIMEOUT_S, keep_alive)
    if isinstance(message, dict) and "error" in message:
        pytest.fail(f"{who} process failed:\n{message['error']}")
    return message


@pytest.mark.timeout(60)
def test_decode_pulls_prefill_blocks_and_prefill_is_notified():
    context = multiprocessing.get_context("spawn")
    prefill_conn, prefill_child_conn = context.Pipe()
    decode_conn, decode_child_conn = context.Pipe()
    processes = [context.Process(target=run_prefill, args=(prefill_child_conn,), daemon=True),
                 context.Process(target=run_decode, args=(decode_child_conn,), daemon=True)]
    try:
        for process in processes:
            process.start()
        decode_conn.send(_receive(prefill_conn, "prefill"))
        pulled = _receive(decode_conn, "decode")
        notified = _receive(prefill_conn, "prefill")
        for conn in (prefill_conn, decode_conn):
            conn.send("exit")
        for process in processes:
            process.join(timeout=STEP_TIMEOUT_S)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
    scenario.check_pull_result(pulled, pulled["block_nbytes"])
    scenario.check_pulled(torch.from_numpy(pulled["kv"]), scenario.patterned_kv())
    assert notified["notifications"] == [(scenario.DECODE_NAME, scenario.NOTIFICATION)]
    assert all(process.exitcode == 0 for process in processes)


@pytest.mark.timeout(60)
def test_read_from_a_killed_peer_fails_and_is_counted():
    context = multiprocessing.get_context("spawn")
    prefill_conn, prefill_child_conn = context.Pipe()
    prefill = context.Process(target=run_prefill, args=(prefill_child_conn,), daemon=True)
    decode = KVTransferAgent("decode-1", scenario.empty_kv())
    try:
        prefill.start()
        info = _receive(prefill_conn, "prefill", decode.new_notifications)
        decode.add_peer(**info)
        assert scenario.wait_until_finished(decode, decode.start_read(info["node_id"], [1], [1], b"1")) == "DONE"
        _receive(prefill_conn, "prefill", decode.new_notifications)  # NOTE: our notification has left
        prefill.kill()
        prefill.join(timeout=STEP_TIMEOUT_S)
        handle = decode.start_read(info["node_id"], [2], [2], b"2")
        assert scenario.wait_until_finished(decode, handle) == "ERR" and "DISCONNECT" in handle.error
        assert decode.counters.read_failures == 1 and decode.counters.reads_completed == 1
    finally:
        decode.close()
        if prefill.is_alive():
            prefill.kill()


def test_agent_describes_its_registered_blocks():
    kv = scenario.patterned_kv()
    agent = KVTransferAgent("describe-0", kv)
    try:
        assert agent.memory_type == "DRAM" and agent.num_blocks == scenario.KV_SHAPE[0]
        assert agent.kv_base_addresses == (kv.data_ptr(),) and agent.block_nbytes == kv[0].numel() * 4
        assert agent.segment_block_nbytes == agent.block_nbytes
        assert isinstance(agent.metadata(), bytes) and not agent.has_peer("prefill-0")
    finally:
        agent.close()


def test_agent_describes_each_of_its_segments():
    segments = scenario.random_segments(seed=3)
    agent = KVTransferAgent("describe-segments-0", segments)
    try:
        assert agent.kv_base_addresses == tuple(segment.data_ptr() for segment in segments)
        assert agent.segment_block_nbytes == segments[0][0].numel() * 4
        assert agent.block_nbytes == scenario.NUM_SEGMENTS * agent.segment_block_nbytes
        assert agent.num_blocks == scenario.SEGMENT_SHAPE[0] and agent.memory_type == "DRAM"
    finally:
        agent.close()


@pytest.mark.timeout(60)
def test_multi_segment_read_lands_every_segment_s_blocks_exactly():
    """Two agents in this process, 3 segments each at unrelated addresses: one descriptor per run and segment."""
    prefill_segments, decode_segments = scenario.random_segments(seed=2), scenario.empty_segments()
    prefill = KVTransferAgent("segments-prefill", prefill_segments)
    decode = KVTransferAgent("segments-decode", decode_segments)
    try:
        result = scenario.pull_blocks(decode, scenario.peer_info(prefill))
        scenario.check_pull_result(result, decode.block_nbytes, scenario.NUM_DESCRIPTORS * scenario.NUM_SEGMENTS)
        scenario.check_pulled_segments(decode_segments, prefill_segments)
        assert scenario.wait_for_notifications(prefill, 1) == [("segments-decode", scenario.NOTIFICATION)]
    finally:
        decode.close()
        prefill.close()


def test_metadata_of_another_agent_is_refused():
    first = KVTransferAgent("first-0", scenario.patterned_kv())
    second = KVTransferAgent("second-0", scenario.empty_kv())
    try:
        info = {**scenario.peer_info(first), "node_id": "someone-else"}
        with pytest.raises(IncompatiblePeer, match="someone-else sent the NIXL metadata of agent first-0"):
            second.add_peer(**info)
        assert not second.has_peer("someone-else") and not second.has_peer("first-0")
    finally:
        second.close()
        first.close()


def test_non_contiguous_kv_is_refused():
    with pytest.raises(ValueError, match="contiguous"):
        KVTransferAgent("strided-0", scenario.empty_kv().transpose(1, 2))


@pytest.mark.timeout(60)
def test_a_read_with_nixl_s_progress_thread_lands_and_notifies():
    """TransferConfig.progress_thread "on" (GPU KV's default): the same read, advanced by NIXL's own thread."""
    from wire.config import TransferConfig

    config = TransferConfig(progress_thread="on")
    holder = KVTransferAgent("threaded-prefill", scenario.patterned_kv(), config)
    reader_kv = scenario.empty_kv()
    reader = KVTransferAgent("threaded-decode", reader_kv, config)
    try:
        reader.add_peer(**scenario.peer_info(holder))
        handle = reader.start_read("threaded-prefill", [7, 8, 9], [1, 2, 3], b"threaded")
        assert scenario.wait_until_finished(reader, handle) == "DONE"
        assert torch.equal(reader_kv[1:4], scenario.patterned_kv()[7:10])
        assert scenario.wait_for_notifications(holder, 1) == [("threaded-decode", b"threaded")]
        assert reader.counters.descriptors_posted == 1
    finally:
        reader.close()
        holder.close()
