"""FakeKVTransferAgent: KVTransferAgent's interface and behaviour in one process, for unit tests only.

Agents find each other through a module-level registry by name (the "metadata" is the name). A read stays
"PROC" until its first poll, which copies the blocks and queues the notification (opaque bytes, as NIXL's: the
senders post wire.protocol.KVReadDone) at the peer, so callers are exercised on the asynchronous path. The "fake"
KV transport (wire.config.KV_TRANSPORTS): open_sender and open_receiver put it behind the seam
(transfer/transport.py) as transfer/endpoints.py puts NIXL's agent. Only nodes of one process can use it; the
cluster uses NIXL (transfer.agent).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from transfer.compat import IncompatiblePeer
from transfer.counters import TransferCounters
from transfer.endpoints import AgentReceiver, AgentSender
from transfer.reads import (
    KVData,
    KVRegion,
    ReadHandle,
    XferState,
    check_block_ids,
    check_kv_data,
    check_peer_layout,
    count_finished,
    kv_segments,
)
from transfer.transport import BlockPool
from wire.block_runs import block_runs
from wire.config import TransferConfig

_AGENTS: dict[str, FakeKVTransferAgent] = {}


class FakeKVTransferAgent(KVRegion):
    probe_gbps = math.inf
    """What probe_read() reports (tests set a slow one to see a peer refused)."""
    hold_reads = False
    """Reads stay "PROC" while set (tests of a READ that hangs)."""

    def __init__(self, name: str, kv_data: KVData, config: TransferConfig = TransferConfig()):
        self._segments = kv_segments(kv_data)
        check_kv_data(self._segments)
        if name in _AGENTS:
            raise ValueError(f"a fake agent named {name!r} is already open")
        self.name = name
        self.counters = TransferCounters()
        self._peer_names: set[str] = set()
        self._inbox: list[tuple[str, bytes]] = []
        _AGENTS[name] = self

    def metadata(self) -> bytes:
        return self.name.encode()

    def gpu_share(self) -> None:
        """In one process there is nothing to map: every read is this fake's copy."""
        return None

    def add_peer(self, node_id: str, agent_metadata: bytes, kv_base_addresses: Sequence[int], num_blocks: int,
                 block_nbytes: int, memory_type: str, device_id: int = 0, gpu_share: None = None) -> None:
        check_peer_layout(self, node_id, kv_base_addresses, block_nbytes)
        if agent_metadata.decode() != node_id or node_id not in _AGENTS:
            raise IncompatiblePeer(f"peer {node_id} sent the metadata of agent {agent_metadata.decode()}")
        self._peer_names.add(node_id)

    def probe_read(self, peer: str, remote_block_ids: Sequence[int], local_block_ids: Sequence[int]) -> float:
        if peer not in self._peer_names:
            raise KeyError(peer)
        check_block_ids(remote_block_ids, local_block_ids, _AGENTS[peer].num_blocks, self.num_blocks)
        return self.probe_gbps

    def has_peer(self, node_id: str) -> bool:
        return node_id in self._peer_names

    def remove_peer(self, node_id: str) -> None:
        self._peer_names.discard(node_id)

    def start_read(self, peer: str, remote_block_ids: Sequence[int], local_block_ids: Sequence[int],
                   notification: bytes) -> ReadHandle:
        if peer not in self._peer_names:
            raise KeyError(peer)
        check_block_ids(remote_block_ids, local_block_ids, _AGENTS[peer].num_blocks, self.num_blocks)
        self.counters.reads_started += 1
        runs = block_runs(remote_block_ids, local_block_ids)
        self.counters.descriptors_posted += len(runs) * len(self._segments)
        num_blocks = len(local_block_ids)
        pending = (list(remote_block_ids), list(local_block_ids), notification)
        return ReadHandle(peer, num_blocks, num_blocks * self.block_nbytes, "PROC", pending)

    def poll(self, handle: ReadHandle) -> XferState:
        if handle.state == "PROC" and not self.hold_reads:
            handle.state = self._complete(handle)
            handle.backend_handle = None
            count_finished(self.counters, handle)
        return handle.state

    def cancel(self, handle: ReadHandle) -> bool:
        if handle.state == "PROC":
            handle.state, handle.error, handle.backend_handle = "ERR", "cancelled", None
            count_finished(self.counters, handle)
        return True

    def new_notifications(self) -> list[tuple[str, bytes]]:
        notifications, self._inbox = self._inbox, []
        return notifications

    def close(self) -> None:
        if _AGENTS.get(self.name) is self:
            del _AGENTS[self.name]

    def _complete(self, handle: ReadHandle) -> XferState:
        remote = _AGENTS.get(handle.peer)
        if remote is None:  # NOTE: the peer closed mid-read, as a dead prefill node would
            return "ERR"
        remote_block_ids, local_block_ids, notification = handle.backend_handle
        for local, peer in zip(self._segments, remote._segments, strict=True):
            _block_bytes(local)[local_block_ids] = _block_bytes(peer)[remote_block_ids].to(local.device)
        remote._inbox.append((self.name, notification))
        return "DONE"


def open_sender(config: TransferConfig, node_id: str, kv_data: KVData, lease_seconds: float) -> AgentSender:
    return AgentSender(config, FakeKVTransferAgent(node_id, kv_data, config), lease_seconds)


def open_receiver(config: TransferConfig, node_id: str, kv_data: KVData, blocks: BlockPool) -> AgentReceiver:
    return AgentReceiver(config, FakeKVTransferAgent(node_id, kv_data, config), blocks)


def _block_bytes(segment: torch.Tensor) -> torch.Tensor:
    """[num_blocks, bytes per block] view of a segment: NIXL moves bytes, so the fake copies bytes, not values."""
    return segment.view(segment.shape[0], -1).view(torch.uint8)
