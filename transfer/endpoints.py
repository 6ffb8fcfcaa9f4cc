"""A sender and a receiver over a KV agent (KVTransferAgent's interface): what the NIXL and the fake transport share.

The handshake payload is the agent's: its metadata (NIXL's agent metadata; the fake's name), its KV segments'
addresses and block layout, memory type and device, and the UCX settings it was made with (for the decode node's
log), as one msgpack map (a msgspec Struct: every field checked as it is decoded). A READ is posted with
wire.protocol.kv_done_notification(request id) (a KVReadDone message), which the agent delivers to the holder's
agent once the bytes are read; the holder's sender ends the lease on it. At the handshake the receiver times one
probe READ and refuses a VRAM peer whose path UCX emulates through host memory.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Protocol

import msgspec

from transfer.compat import IncompatiblePeer
from transfer.counters import TransferCounters
from transfer.gpu_peers import GpuShare
from transfer.leases import LeasingSender
from transfer.reads import PROBE_BYTES, MemoryType, ReadHandle, XferState
from transfer.transport import BlockPool, check_transport
from wire.config import TransferConfig
from wire.protocol import kv_done_notification

logger = logging.getLogger(__name__)


class Agent(Protocol):
    """transfer.agent.KVTransferAgent's interface (transfer.fake.FakeKVTransferAgent has it too)."""

    name: str
    counters: TransferCounters
    memory_type: MemoryType
    kv_base_addresses: tuple[int, ...]
    device_id: int
    num_blocks: int
    block_nbytes: int

    def metadata(self) -> bytes: ...

    def gpu_share(self) -> GpuShare | None: ...

    def add_peer(self, node_id: str, agent_metadata: bytes, kv_base_addresses: Sequence[int], num_blocks: int,
                 block_nbytes: int, memory_type: str, device_id: int = 0, gpu_share: GpuShare | None = None) -> None:
        ...

    def has_peer(self, node_id: str) -> bool: ...

    def remove_peer(self, node_id: str) -> None: ...

    def start_read(self, peer: str, remote_block_ids: Sequence[int], local_block_ids: Sequence[int],
                   notification: bytes) -> ReadHandle: ...

    def probe_read(self, peer: str, remote_block_ids: Sequence[int], local_block_ids: Sequence[int]) -> float: ...

    def poll(self, handle: ReadHandle) -> XferState: ...

    def cancel(self, handle: ReadHandle) -> bool: ...

    def new_notifications(self) -> list[tuple[str, bytes]]: ...

    def close(self) -> None: ...


class AgentPayload(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An agent transport's HandshakeReply.transport_payload."""

    agent_metadata: bytes
    kv_base_addresses: tuple[int, ...]
    """One per KV segment (block-major tensor) of the prefill node, in the order the decode node's pair with them."""
    num_blocks: int
    block_nbytes: int
    """Bytes of one whole block: its region in every segment."""
    memory_type: str
    """NIXL memory segment: "DRAM" or "VRAM"."""
    device_id: int
    """The KV tensor's CUDA device in the prefill process (0 for DRAM)."""
    ucx_settings: dict[str, str]
    """The UCX settings the prefill node's agent was made with (TransferConfig.ucx_environment()), for the log."""
    gpu_share: GpuShare | None = None
    """Its KV as a process on its GPU maps it (transfer/gpu_peers.py); None for DRAM KV or with copy_on_gpu off."""

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, node_id: str, data: bytes) -> AgentPayload:
        try:
            payload = msgspec.msgpack.decode(data, type=cls)
        except Exception as error:  # NOTE: any field may be anything: a refused peer, never a crash
            raise IncompatiblePeer(f"peer {node_id} sent a malformed handshake payload: {type(error).__name__}: "
                                   f"{error}") from error
        return payload


class AgentSender(LeasingSender):
    """KVSender over an agent: the leases (transfer/leases.py), the agent's handshake fields, its notifications."""

    def __init__(self, config: TransferConfig, agent: Agent, lease_seconds: float):
        super().__init__(agent.name, lease_seconds, agent.counters)
        self.transport = config.transport
        self.agent = agent
        self.ucx_settings = config.ucx_environment(vram=agent.memory_type == "VRAM")

    def handshake_payload(self) -> bytes:
        agent = self.agent
        return AgentPayload(agent.metadata(), agent.kv_base_addresses, agent.num_blocks, agent.block_nbytes,
                            agent.memory_type, agent.device_id, self.ucx_settings, agent.gpu_share()).encode()

    def done_request_ids(self) -> list[str]:
        return self.read_notifications(notification for _peer, notification in self.agent.new_notifications())

    def close(self) -> None:
        self.agent.close()


class AgentReceiver:
    """KVReceiver over an agent: the payload's check, the probe READ and its speed check, reads that notify."""

    def __init__(self, config: TransferConfig, agent: Agent, blocks: BlockPool):
        self.transport = config.transport
        self.config = config
        self.agent = agent
        self.blocks = blocks
        self.read_gbps: dict[str, float] = {}

    @property
    def counters(self) -> TransferCounters:
        return self.agent.counters

    def add_peer(self, node_id: str, transport: str, payload: bytes) -> int:
        check_transport(self.transport, transport, node_id)
        peer = AgentPayload.decode(node_id, payload)
        self.agent.add_peer(node_id, peer.agent_metadata, peer.kv_base_addresses, peer.num_blocks, peer.block_nbytes,
                            peer.memory_type, peer.device_id, peer.gpu_share)
        try:
            self.check_read_speed(node_id, peer)
        except IncompatiblePeer:
            self.agent.remove_peer(node_id)
            raise
        return peer.num_blocks

    def check_read_speed(self, node_id: str, peer: AgentPayload) -> None:
        """Time one READ from the new peer; refuse a VRAM path that UCX emulates through host memory."""
        gbps = self.read_gbps[node_id] = self.probe(node_id, peer)
        config = self.config
        path = f"{peer.memory_type} -> {self.agent.memory_type}"
        logger.info("decode %s: KV reads from %s: %s at %.1f GB/s (probe; peer's UCX settings %s)",
                    self.agent.name, node_id, path, gbps, peer.ucx_settings or "UCX defaults")
        vram = peer.memory_type == self.agent.memory_type == "VRAM"
        if vram and gbps < config.min_vram_read_gbps and not config.allow_slow_reads:
            raise IncompatiblePeer(
                f"KV reads from {node_id} ({path}) run at {gbps:.1f} GB/s, below {config.min_vram_read_gbps} "
                f"GB/s: UCX is emulating the READ through host memory (peer's UCX settings "
                f"{peer.ucx_settings or 'defaults'}; set --kv-cuda-ipc-get-zcopy y on both nodes, or serve anyway "
                f"with --kv-allow-slow-reads)")

    def probe(self, node_id: str, peer: AgentPayload) -> float:
        """GB/s of a READ of the peer's first blocks into free blocks of ours (~PROBE_BYTES, fewer if not free)."""
        blocks = self.blocks
        num_blocks = max(1, min(PROBE_BYTES // peer.block_nbytes, peer.num_blocks - 1, blocks.num_free_blocks))
        local = blocks.allocate(num_blocks * blocks.block_size)
        if local is None:  # NOTE: every block taken: the probe waits for the peer's next handshake
            return math.inf
        try:
            return self.agent.probe_read(node_id, list(range(1, 1 + num_blocks)), local)
        finally:
            blocks.free(local)

    def has_peer(self, node_id: str) -> bool:
        return self.agent.has_peer(node_id)

    def remove_peer(self, node_id: str) -> None:
        self.agent.remove_peer(node_id)

    def start_read(self, peer: str, request_id: str, remote_block_ids: Sequence[int],
                   local_block_ids: Sequence[int]) -> ReadHandle:
        return self.agent.start_read(peer, remote_block_ids, local_block_ids, kv_done_notification(request_id))

    def poll(self, handle: ReadHandle) -> XferState:
        return self.agent.poll(handle)

    def cancel(self, handle: ReadHandle) -> bool:
        return self.agent.cancel(handle)

    def close(self) -> None:
        self.agent.close()
