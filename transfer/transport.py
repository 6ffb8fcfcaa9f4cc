"""The KV transport seam: a prefill node's sender and a decode node's receiver, whatever moves the bytes.

A transport is one module of transfer/ with open_sender and open_receiver (KVTransport below), named in the registry
wire.config.KV_TRANSPORTS; TransferConfig.transport picks one, and make_transport() opens the side a node's role
needs, importing that module only then. NIXL (transfer/agent.py) and the in-process fake (transfer/fake.py) are the
two; both build their sides from transfer/endpoints.py. Every sender's leases are transfer/leases.py's.

One request's KV (the nodes' messages in between are wire/protocol.py's):
  prefill: lease() when token 1 is sampled; to a decode node's HandshakeRequest, HandshakeReply(transport,
      handshake_payload())
  decode:  add_peer(prefill node, transport, payload) once per peer: readable, or IncompatiblePeer (refused)
  prefill: claim() on ClaimKV -> the block ids (ClaimReply)
  decode:  start_read() -> poll() each turn until "DONE" (the transport tells the sender) or "ERR"; cancel() gives
      up a read that takes too long
  prefill: poll() each turn -> the leases now free: read, or past their deadline; release() ends a claimed lease its
      claimer will not read (ReleaseKV), release_claims_of() every lease of a claimer that is gone (InstanceGone),
      abort() an unclaimed one (the router gave up)
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

from transfer.compat import IncompatiblePeer
from transfer.counters import TransferCounters
from transfer.leases import Claim, Claimer, Lease
from transfer.reads import KVData, ReadHandle, XferState
from wire.config import KV_TRANSPORTS, TransferConfig


class KVSender(Protocol):
    """The prefill side: each prefilled request's blocks under a lease until a decode node has read them, gives them
    back, or the lease's deadline passes. transfer.leases.LeasingSender is every call but handshake_payload() and
    close(); a transport adds those and how its done notifications arrive."""

    transport: str
    """Its name in wire.config.KV_TRANSPORTS (what HandshakeReply.transport says)."""
    name: str
    """The node's id, as its peers know it."""
    counters: TransferCounters
    """kv_released and lease_expiries are the sender's; a node's stats report every field."""
    leases: dict[str, Lease]
    """Request id -> its lease, claimed or not."""
    num_released_unread: int
    """Leases a claimer gave back unread (ReleaseKV), or ended unread as their claimer was gone (InstanceGone)."""

    def handshake_payload(self) -> bytes:
        """What this transport's receiver needs to read this node's blocks (HandshakeReply.transport_payload)."""
        ...

    def lease(self, request_id: str, holder: Any, block_ids: Sequence[int]) -> None:
        """Keep block_ids for a decode node to claim, for the lease's life from now; holder is what poll(),
        release() and abort() hand back when the lease ends (the node frees it)."""
        ...

    def claim(self, request_id: str, claimer: Claimer) -> Claim:
        """A decode node's ClaimKV: the blocks, once, and a new deadline for the READ; refused with the reason when
        the lease is claimed already, expired or unknown."""
        ...

    def release(self, request_id: str, reason: str) -> Lease | None:
        """The claimer's ReleaseKV: it will not read (or finish reading) the blocks; the lease ends now."""
        ...

    def release_claims_of(self, claimer: Claimer, reason: str) -> list[Lease]:
        """The claimer's process is gone (InstanceGone): every lease it claimed ends now, released unread."""
        ...

    def abort(self, request_id: str) -> Lease | None:
        """The router gave the request up: an unclaimed lease ends; a claimed one is left to its claimer and its
        deadline (a decode node may be reading the blocks right now)."""
        ...

    def poll(self) -> list[Lease]:
        """Once per loop turn: the leases that ended since the last call, read (their reader's done notification)
        or past their deadline. NOTE: a transport without a progress thread also moves its work on here."""
        ...

    def close(self) -> None: ...


class KVReceiver(Protocol):
    """The decode side: a prefill node's blocks made readable from its handshake, then read into local blocks."""

    transport: str
    counters: TransferCounters
    """The reads_* / blocks_read / bytes_read / descriptors_posted counters are the receiver's."""
    read_gbps: dict[str, float]
    """Per prefill peer: GB/s of its probe READ at the handshake (a refused peer's too)."""

    def add_peer(self, node_id: str, transport: str, payload: bytes) -> int:
        """Make a prefill node readable from its HandshakeReply (a peer added again, after a restart, is replaced);
        -> how many KV blocks it has. Raises IncompatiblePeer, saying why, for another transport's payload, one
        that does not fit this node's KV, or a read path too slow to use (the node refuses the peer); the peer is
        not added then."""
        ...

    def has_peer(self, node_id: str) -> bool: ...

    def remove_peer(self, node_id: str) -> None:
        """Forget a peer (reads still in flight to it should be polled to the end first)."""
        ...

    def start_read(self, peer: str, request_id: str, remote_block_ids: Sequence[int],
                   local_block_ids: Sequence[int]) -> ReadHandle:
        """Post a READ of the peer's blocks into ours (pairwise, in order); once it completes the peer's sender
        learns it (its poll() ends the lease). Never waits for the peer; a read that fails to post is "ERR"."""
        ...

    def poll(self, handle: ReadHandle) -> XferState:
        """The read's state, counted once when it leaves "PROC"."""
        ...

    def cancel(self, handle: ReadHandle) -> bool:
        """Give up a read still in flight; True when nothing more will be written into its local blocks."""
        ...

    def close(self) -> None: ...


class BlockPool(Protocol):
    """Free local blocks a receiver borrows for its probe READ (the node's corun.block_manager.BlockManager)."""

    block_size: int

    @property
    def num_free_blocks(self) -> int: ...

    def allocate(self, num_tokens: int) -> list[int] | None: ...

    def free(self, block_ids: list[int]) -> None: ...


class KVTransport(Protocol):
    """What a transport's module defines (wire.config.KV_TRANSPORTS names the module)."""

    def open_sender(self, config: TransferConfig, node_id: str, kv_data: KVData,
                    lease_seconds: float) -> KVSender: ...

    def open_receiver(self, config: TransferConfig, node_id: str, kv_data: KVData,
                      blocks: BlockPool) -> KVReceiver: ...


def transport_module(name: str) -> KVTransport:
    if name not in KV_TRANSPORTS:  # NOTE: TransferConfig refuses it first; a name given here directly too
        raise ValueError(f"unknown KV transport {name!r}: one of {', '.join(KV_TRANSPORTS)}")
    return importlib.import_module(KV_TRANSPORTS[name])


def make_transport(role: str, config: TransferConfig, node_id: str, kv_data: KVData, *, lease_seconds: float,
                   blocks: BlockPool) -> KVSender | KVReceiver | None:
    """A node's side of the transport config.transport names: a prefill node's sender, a decode node's receiver
    (node_id names the node to its peers); None for a colocated node, which moves no KV."""
    if role == "colocated":
        return None
    module = transport_module(config.transport)
    if role == "prefill":
        return module.open_sender(config, node_id, kv_data, lease_seconds)
    if role == "decode":
        return module.open_receiver(config, node_id, kv_data, blocks)
    raise ValueError(f"no KV transport side for role {role!r}")


def check_transport(local: str, remote: str, node_id: str) -> None:
    """A receiver reads only its own transport's payloads: another one's fields mean something else."""
    if remote != local:
        raise IncompatiblePeer(f"peer {node_id} offers its KV over transport {remote!r}, this node reads over "
                               f"{local!r} (--kv-transport)")
