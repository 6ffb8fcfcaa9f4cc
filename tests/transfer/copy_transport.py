"""A second KV transport written against the seam alone (transfer/transport.py), for the test that a new transport
is its own module and one registry line: nodes of one process, blocks copied by torch at a read's first poll.

Unlike the fake, it shares nothing with NIXL's agent: its sender is transfer.leases.LeasingSender and three methods,
its receiver KVReceiver's calls, its handshake payload its own two fields.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgpack

from transfer.compat import IncompatiblePeer
from transfer.counters import TransferCounters
from transfer.leases import LeasingSender
from transfer.reads import KVData, ReadHandle, XferState, block_nbytes_of, count_finished, kv_segments
from transfer.transport import BlockPool, check_transport
from wire.config import TransferConfig
from wire.protocol import kv_done_notification

_SENDERS: dict[str, CopySender] = {}


class CopySender(LeasingSender):
    def __init__(self, config: TransferConfig, node_id: str, kv_data: KVData, lease_seconds: float):
        super().__init__(node_id, lease_seconds)
        self.transport = config.transport
        self.segments = kv_segments(kv_data)
        self.notifications: list[bytes] = []
        """KV-done notifications (wire.protocol.KVReadDone) of the reads finished since done_request_ids()."""
        _SENDERS[node_id] = self

    def handshake_payload(self) -> bytes:
        return msgpack.packb({"node_id": self.name, "num_blocks": self.segments[0].shape[0]})

    def done_request_ids(self) -> list[str]:
        notifications, self.notifications = self.notifications, []
        return self.read_notifications(notifications)

    def close(self) -> None:
        if _SENDERS.get(self.name) is self:
            del _SENDERS[self.name]


class CopyReceiver:
    def __init__(self, config: TransferConfig, node_id: str, kv_data: KVData):
        self.transport = config.transport
        self.segments = kv_segments(kv_data)
        self.counters = TransferCounters()
        self.read_gbps: dict[str, float] = {}
        self.peers: set[str] = set()

    def add_peer(self, node_id: str, transport: str, payload: bytes) -> int:
        check_transport(self.transport, transport, node_id)
        fields = msgpack.unpackb(payload)
        if fields.get("node_id") != node_id or node_id not in _SENDERS:
            raise IncompatiblePeer(f"peer {node_id} is not a copy sender of this process")
        self.peers.add(node_id)
        self.read_gbps[node_id] = math.inf
        return fields["num_blocks"]

    def has_peer(self, node_id: str) -> bool:
        return node_id in self.peers

    def remove_peer(self, node_id: str) -> None:
        self.peers.discard(node_id)

    def start_read(self, peer: str, request_id: str, remote_block_ids: Sequence[int],
                   local_block_ids: Sequence[int]) -> ReadHandle:
        if peer not in self.peers:
            raise KeyError(peer)
        self.counters.reads_started += 1
        num_bytes = len(local_block_ids) * sum(block_nbytes_of(segment) for segment in self.segments)
        return ReadHandle(peer, len(local_block_ids), num_bytes, "PROC",
                          (request_id, list(remote_block_ids), list(local_block_ids)))

    def poll(self, handle: ReadHandle) -> XferState:
        if handle.state == "PROC":
            sender = _SENDERS.get(handle.peer)
            request_id, remote, local = handle.backend_handle
            if sender is None:
                handle.state = "ERR"
            else:
                for mine, theirs in zip(self.segments, sender.segments, strict=True):
                    mine[local] = theirs[remote].to(mine.device)
                sender.notifications.append(kv_done_notification(request_id))
                handle.state = "DONE"
            handle.backend_handle = None
            count_finished(self.counters, handle)
        return handle.state

    def cancel(self, handle: ReadHandle) -> bool:
        if handle.state == "PROC":
            handle.state, handle.backend_handle = "ERR", None
            count_finished(self.counters, handle)
        return True

    def close(self) -> None:
        self.peers.clear()


def open_sender(config: TransferConfig, node_id: str, kv_data: KVData, lease_seconds: float) -> CopySender:
    return CopySender(config, node_id, kv_data, lease_seconds)


def open_receiver(config: TransferConfig, node_id: str, kv_data: KVData, blocks: BlockPool) -> CopyReceiver:
    return CopyReceiver(config, node_id, kv_data)
