"""One behavioural scenario for any KV transfer agent (NIXL in two processes, or the fake in one).

A prefill agent holds blocks with a known pattern; a decode agent refuses a peer of another block size, probes
the peer's read speed, then pulls a list of the prefill's blocks into other local block ids (three of them
adjacent on both sides: one descriptor; the others scattered), and the prefill agent receives the completion
notification keyed by the decode agent's name.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from transfer.compat import IncompatiblePeer

PREFILL_NAME = "prefill-0"
DECODE_NAME = "decode-0"
KV_SHAPE = (12, 2, 2, 4, 2, 8)
"""[num_blocks, num_layers, kv, block_size, num_kv_heads, head_dim]: 1 KiB blocks of float32."""
REMOTE_BLOCK_IDS = [7, 8, 9, 2, 4]
LOCAL_BLOCK_IDS = [1, 2, 3, 5, 10]
NUM_DESCRIPTORS = 3
"""7-9 -> 1-3 is one run; 2 -> 5 and 4 -> 10 are one block each."""
NOTIFICATION = b"req-42:done"
TIMEOUT_S = 10.0
SEGMENT_SHAPE = (12, 2, 4, 16)
"""One segment as a vLLM engine keeps one per layer: [num_blocks, num_kv_heads, block_size, 2 * head_size]."""
NUM_SEGMENTS = 3


def patterned_kv() -> torch.Tensor:
    """Every element distinct (exact in float32), so a block read from the wrong place cannot match."""
    numel = torch.Size(KV_SHAPE).numel()
    return (torch.arange(numel, dtype=torch.float32) + 0.5).view(KV_SHAPE)


def empty_kv() -> torch.Tensor:
    return torch.zeros(KV_SHAPE, dtype=torch.float32)


def random_segments(seed: int) -> list[torch.Tensor]:
    """NUM_SEGMENTS segments of random values: a block read from the wrong block or segment cannot match."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(SEGMENT_SHAPE, generator=generator) for _ in range(NUM_SEGMENTS)]


def empty_segments() -> list[torch.Tensor]:
    return [torch.zeros(SEGMENT_SHAPE) for _ in range(NUM_SEGMENTS)]


def peer_info(agent) -> dict:
    """What the handshake reply carries, as add_peer keyword arguments."""
    return {"node_id": agent.name, "agent_metadata": agent.metadata(), "kv_base_addresses": agent.kv_base_addresses,
            "num_blocks": agent.num_blocks, "block_nbytes": agent.block_nbytes, "memory_type": agent.memory_type}


def pull_blocks(agent, info: dict) -> dict:
    """The decode side: checks refusals, then reads REMOTE_BLOCK_IDS into LOCAL_BLOCK_IDS and waits."""
    result = {"refused_block_nbytes": _refuses_block_nbytes(agent, info)}
    result["had_peer_after_refusal"] = agent.has_peer(info["node_id"])
    agent.add_peer(**info)
    result["has_peer"] = agent.has_peer(info["node_id"])
    result["refused_uneven_ids"] = _raises(ValueError, agent.start_read, info["node_id"], [1, 2], [3], b"x")
    result["refused_null_block"] = _raises(ValueError, agent.start_read, info["node_id"], [0], [3], b"x")
    # NOTE: into blocks the real read overwrites next, so the check below still sees only the read's blocks
    result["probe_gbps"] = agent.probe_read(info["node_id"], [4, 5, 6], LOCAL_BLOCK_IDS[:3])
    handle = agent.start_read(info["node_id"], REMOTE_BLOCK_IDS, LOCAL_BLOCK_IDS, NOTIFICATION)
    result["state"] = wait_until_finished(agent, handle)
    result["state_after_finish"] = agent.poll(handle)
    result["counters"] = agent.counters.as_dict()
    return result


def check_pulled(local_kv: torch.Tensor, remote_kv: torch.Tensor) -> None:
    """Byte-exact copies at the local ids; every other local block untouched (zeros)."""
    for remote_id, local_id in zip(REMOTE_BLOCK_IDS, LOCAL_BLOCK_IDS, strict=True):
        assert torch.equal(local_kv[local_id].view(torch.uint8), remote_kv[remote_id].view(torch.uint8)), local_id
    untouched = [b for b in range(local_kv.shape[0]) if b not in LOCAL_BLOCK_IDS]
    assert not local_kv[untouched].any()


def check_pulled_segments(local_segments: list[torch.Tensor], remote_segments: list[torch.Tensor]) -> None:
    """check_pulled in every segment: each segment's named blocks come from the same segment of the peer."""
    assert len(local_segments) == len(remote_segments) == NUM_SEGMENTS
    for local_kv, remote_kv in zip(local_segments, remote_segments, strict=True):
        check_pulled(local_kv, remote_kv)


def check_pull_result(result: dict, block_nbytes: int, num_descriptors: int = NUM_DESCRIPTORS) -> None:
    assert result["refused_block_nbytes"] and not result["had_peer_after_refusal"] and result["has_peer"]
    assert result["refused_uneven_ids"] and result["refused_null_block"]
    assert result["state"] == "DONE" and result["state_after_finish"] == "DONE"
    counters = result["counters"]
    assert counters["reads_started"] == counters["reads_completed"] == 1 and counters["read_failures"] == 0
    assert counters["blocks_read"] == len(LOCAL_BLOCK_IDS) and counters["descriptors_posted"] == num_descriptors
    assert result["probe_gbps"] > 0
    assert counters["bytes_read"] == len(LOCAL_BLOCK_IDS) * block_nbytes


def wait_until_finished(agent, handle, timeout_s: float = TIMEOUT_S) -> str:
    deadline = time.monotonic() + timeout_s
    while (state := agent.poll(handle)) == "PROC":
        if time.monotonic() > deadline:
            raise TimeoutError(f"read from {handle.peer} still in progress after {timeout_s} s")
    return state


def wait_for_notifications(agent, num: int, timeout_s: float = TIMEOUT_S) -> list[tuple[str, bytes]]:
    notifications, deadline = [], time.monotonic() + timeout_s
    while len(notifications) < num:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{agent.name} got {len(notifications)} of {num} notifications in {timeout_s} s")
        notifications += agent.new_notifications()
    return notifications


def _refuses_block_nbytes(agent, info: dict) -> bool:
    return _raises(IncompatiblePeer, agent.add_peer, **{**info, "block_nbytes": info["block_nbytes"] * 2})


def _raises(error: type[Exception], call: Callable, *args, **kwargs) -> bool:
    try:
        call(*args, **kwargs)
    except error:
        return True
    return False
