"""KV reads from a prefill node on the same GPU, copied by the decode process itself instead of NIXL's UCX.

Measured on an H100 with an 8B model (stops 52-53): a NIXL READ (UCX cuda_ipc) between the two processes of 1P1D on one
GPU took 9-23 ms on average under load, for ~36 MB that the GPU copies in ~0.03 ms, and NIXL's own telemetry agreed.
A copy the process issues itself, on a stream of its own, took 0.8-1.0 ms p50 and at most 3.4 ms with both processes
busy (benchmarks/handoff_copy_latency.py, results/h100_handoff_copy_latency_stop53.json). So where the prefill node's
KV is on this GPU (the same device UUID), its handshake carries its KV segments as CUDA IPC handles
(wire/cuda_ipc.py); the decode node maps them once, and a read is one device-to-device copy per run of adjacent blocks
and segment, on a high-priority stream, polled by its event. The prefill node learns of the end as from a NIXL READ:
this process sends the same notification over NIXL (send_notif), and its sender ends the lease.

The mapped memory stays the prefill process's: a copy is trusted only if that process has not begun to exit once
the copy has ended (ProcessWatch); otherwise the read fails, as a NIXL READ from a dead peer does.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import msgspec
import torch

from wire.cuda_ipc import ProcessWatch, SharedCudaTensor, dtype_name, own_start_ticks

logger = logging.getLogger(__name__)


class GpuShare(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A prefill node's KV as a process on its GPU can map it (AgentPayload.gpu_share)."""

    gpu_uuid: str
    pid: int
    start_ticks: int
    segments: tuple[SharedCudaTensor, ...]


@dataclass(frozen=True)
class GpuPeer:
    segments: tuple[torch.Tensor, ...]
    watch: ProcessWatch


@dataclass
class GpuRead:
    """One read copied on this GPU: done once its event has fired and the peer still runs."""

    event: torch.cuda.Event
    began: torch.cuda.Event
    """Recorded before the copies: began.elapsed_time(event) is the GPU's own time for them, so that a slow hand-off
    tells a copy that waited to run from one that ran slowly."""
    peer: str
    notification: bytes
    posted_at: float
    source: GpuPeer
    """Held until the read is polled to its end: the mapping must outlive the copy even if the peer is removed."""


def gpu_uuid(tensor: torch.Tensor) -> str:
    return str(torch.cuda.get_device_properties(tensor.device).uuid)


class GpuPeers:
    """The peers on this process's GPU whose KV it maps, and the reads it copies from them."""

    def __init__(self, segments: tuple[torch.Tensor, ...]):
        self.segments = segments
        self.uuid = gpu_uuid(segments[0])
        self.peers: dict[str, GpuPeer] = {}
        self.stream = torch.cuda.Stream(segments[0].device, priority=torch.cuda.Stream.priority_range()[1])
        self._share: GpuShare | None = None

    def share(self) -> GpuShare:
        """This process's KV for a peer on its GPU (made once: each _share_cuda_ call makes a new IPC counter)."""
        if self._share is None:
            self._share = GpuShare(self.uuid, os.getpid(), own_start_ticks(), tuple(
                SharedCudaTensor.of(dtype_name(s.dtype), list(s.shape), list(s.stride()),
                                    s.storage_offset(), s.untyped_storage()._share_cuda_()) for s in self.segments))
        return self._share

    def add(self, node_id: str, share: GpuShare | None) -> bool:
        """Map a peer's KV if it is on this GPU and laid out as ours; -> whether its reads are copied here."""
        self.remove(node_id)
        if share is None or share.gpu_uuid != self.uuid or share.pid == os.getpid():
            return False
        layouts = [(tuple(s.shape[1:]), dtype_name(s.dtype)) for s in self.segments]
        if [(tuple(s.shape[1:]), s.dtype) for s in share.segments] != layouts:
            logger.warning("KV of %s is on this GPU but laid out otherwise: read over NIXL", node_id)
            return False
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        segments = tuple(rebuild_cuda_tensor(*s.rebuild_args(torch.Tensor, torch.storage.TypedStorage,
                                                              getattr(torch, s.dtype), torch.Size(s.shape)))
                         for s in share.segments)
        self.peers[node_id] = GpuPeer(segments, ProcessWatch(share.pid, share.start_ticks))
        logger.info("KV of %s is on this GPU (pid %d): its reads are copied here, not by NIXL", node_id, share.pid)
        return True

    def has(self, node_id: str) -> bool:
        return node_id in self.peers

    def remove(self, node_id: str) -> None:
        self.peers.pop(node_id, None)

    def start_read(self, peer: str, runs: list[tuple[int, int, int]], notification: bytes) -> GpuRead:
        """Copy (remote first block, local first block, blocks) runs of every segment from the peer's KV into ours.
        NOTE: the peer leased these blocks once the forward that wrote them had ended, and ours are in no step."""
        remote = self.peers[peer]
        began, event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            began.record(self.stream)
            for mine, theirs in zip(self.segments, remote.segments, strict=True):
                for remote_first, local_first, count in runs:
                    mine[local_first:local_first + count].copy_(theirs[remote_first:remote_first + count],
                                                                non_blocking=True)
            event.record(self.stream)
        return GpuRead(event, began, peer, notification, time.perf_counter(), remote)

    def state(self, read: GpuRead) -> tuple[str, str | None]:
        """("PROC", None) while the copy runs; then ("DONE", None), or ("ERR", why) if the peer began to exit."""
        if not read.event.query():
            return "PROC", None
        if self.peers.get(read.peer) is not read.source or not read.source.watch.alive():
            return "ERR", f"{read.peer} ended (or was forgotten) while its KV was copied: the bytes may not be its"
        return "DONE", None

    @staticmethod
    def copy_seconds(read: GpuRead) -> float:
        """The GPU's time from the read's first copy to its last (call once its event has fired)."""
        return read.began.elapsed_time(read.event) / 1e3

    def copy_finished(self, read: GpuRead) -> bool:
        """Nothing more will be written into the read's local blocks."""
        return read.event.query()
