"""What the NIXL agent and the fake agent share: the read handle, block-id checks and the counting of reads.

KV data is one or more "segments": block-major tensors [num_blocks, ...] (corun's cache is one; a vLLM engine keeps
one per layer). Block b is row b of every segment, so a block is one region per segment."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from transfer.compat import IncompatiblePeer
from transfer.counters import TransferCounters, count_read_time
from wire.config import NULL_BLOCK

XferState = Literal["DONE", "PROC", "ERR"]
PROBE_BYTES = 64 * 2**20
"""What a peer's probe READ moves, in adjacent blocks: enough that a direct path (~1 TB/s) and an emulated one
(~1 GB/s) differ by far more than their start-up and per-descriptor costs (measured on one H200: 1024 descriptors of
the tiny model's 64 KB blocks made a direct path look like 5 GB/s)."""
PROBE_TIMEOUT_S = 10.0
MemoryType = Literal["DRAM", "VRAM"]
KVData = torch.Tensor | Sequence[torch.Tensor]
"""What an agent registers: one block-major tensor, or a sequence of them (its segments)."""


@dataclass
class ReadHandle:
    """One posted READ of a request's blocks from a peer; poll it until its state leaves "PROC"."""

    peer: str
    num_blocks: int
    num_bytes: int
    state: XferState
    backend_handle: Any
    """The backend's transfer handle; None once released."""
    error: str = ""
    """Why the read failed (state "ERR")."""
    started_at: float = field(default_factory=time.perf_counter)


def memory_type_of(kv_data: torch.Tensor) -> MemoryType:
    return "VRAM" if kv_data.is_cuda else "DRAM"


def block_nbytes_of(kv_data: torch.Tensor) -> int:
    """Bytes of one block of a block-major KV tensor [num_blocks, ...]."""
    return kv_data[0].numel() * kv_data.element_size()


def kv_segments(kv_data: KVData) -> tuple[torch.Tensor, ...]:
    """The segments of KV data: a single tensor is a sequence of one."""
    return (kv_data,) if isinstance(kv_data, torch.Tensor) else tuple(kv_data)


def check_kv_data(kv_data: KVData) -> None:
    """Every segment contiguous and block-major with >= 2 blocks; all with the same blocks, bytes per block and
    device, so that one block id names one same-sized region in each."""
    segments = kv_segments(kv_data)
    if not segments:
        raise ValueError("KV data needs at least one segment tensor")
    for index, segment in enumerate(segments):
        _check_segment(index, segment)
    _check_segments_agree("number of blocks", [segment.shape[0] for segment in segments])
    _check_segments_agree("bytes per block", [block_nbytes_of(segment) for segment in segments])
    _check_segments_agree("device", [str(segment.device) for segment in segments])


def _check_segment(index: int, segment: torch.Tensor) -> None:
    if not isinstance(segment, torch.Tensor):
        raise ValueError(f"KV segment {index} must be a tensor, got {type(segment).__name__}")
    if not segment.is_contiguous() or segment.dim() < 2 or segment.shape[0] < 2:
        raise ValueError(f"KV segment {index} must be one contiguous block-major tensor with >= 2 blocks, got "
                         f"shape {tuple(segment.shape)} strides {segment.stride()}")


def _check_segments_agree(what: str, values: list) -> None:
    if len(set(values)) > 1:
        raise ValueError(f"KV segments must all have the same {what}, got {values}")


def check_peer_layout(local: KVRegion, node_id: str, kv_base_addresses: Sequence[int], block_nbytes: int) -> None:
    """A peer's KV is readable into ours only if its blocks are cut the same way: as many segments and the same
    bytes per block (hence per segment block, since a side's segments are all alike)."""
    if len(kv_base_addresses) != len(local.kv_base_addresses):
        raise IncompatiblePeer(f"peer {node_id} is incompatible: {len(local.kv_base_addresses)} KV segments != "
                               f"{len(kv_base_addresses)}")
    if block_nbytes != local.block_nbytes:
        raise IncompatiblePeer(f"peer {node_id} is incompatible: block_nbytes {local.block_nbytes} != "
                               f"{block_nbytes}")


def check_block_ids(remote_block_ids: Sequence[int], local_block_ids: Sequence[int],
                    num_remote_blocks: int, num_local_blocks: int) -> None:
    if len(remote_block_ids) != len(local_block_ids) or not local_block_ids:
        raise ValueError(f"a read needs as many local as remote block ids (and at least one), "
                         f"got {len(remote_block_ids)} remote and {len(local_block_ids)} local")
    _check_range("remote", remote_block_ids, num_remote_blocks)
    _check_range("local", local_block_ids, num_local_blocks)
    if len(set(local_block_ids)) != len(local_block_ids):
        raise ValueError(f"local block ids repeat: {list(local_block_ids)}")


def _check_range(side: str, block_ids: Sequence[int], num_blocks: int) -> None:
    # NOTE: the null block (padding rows read and write it) never holds a request's KV, so it is never moved
    bad = [b for b in block_ids if not NULL_BLOCK < b < num_blocks]
    if bad:
        raise ValueError(f"{side} block ids {bad} are not in 1..{num_blocks - 1} (block 0 is the null block)")


def count_finished(counters: TransferCounters, handle: ReadHandle) -> None:
    """Count a read that just left "PROC" (once per read)."""
    if handle.state == "DONE":
        counters.reads_completed += 1
        counters.bytes_read += handle.num_bytes
        counters.blocks_read += handle.num_blocks
        # NOTE: to the poll that saw it done: a decode node polls while its decode step runs (every WAIT_POLL_S)
        count_read_time(counters, time.perf_counter() - handle.started_at)
    else:
        counters.read_failures += 1


class KVRegion:
    """What both agents expose of the registered KV segments (the handshake reply carries these)."""

    _segments: tuple[torch.Tensor, ...]

    @property
    def memory_type(self) -> MemoryType:
        return memory_type_of(self._segments[0])

    @property
    def kv_base_addresses(self) -> tuple[int, ...]:
        """One per segment, in order: a peer's descriptors name each segment's block b from these."""
        return tuple(segment.data_ptr() for segment in self._segments)

    @property
    def device_id(self) -> int:
        """The KV segments' CUDA device in its process (0 for DRAM): peers name it in their descriptors."""
        return max(self._segments[0].get_device(), 0)

    @property
    def num_blocks(self) -> int:
        return self._segments[0].shape[0]

    @property
    def segment_block_nbytes(self) -> int:
        """Bytes of one block in one segment (what one descriptor of one block moves)."""
        return block_nbytes_of(self._segments[0])

    @property
    def block_nbytes(self) -> int:
        """Bytes of one whole block: its region in every segment."""
        return self.segment_block_nbytes * len(self._segments)
