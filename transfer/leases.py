"""A prefill node's KV leases: one bookkeeping for every transport's sender (transfer/transport.py, KVSender).

A lease keeps a prefilled request's blocks for a decode node: lease_seconds to be claimed, then lease_seconds
again from the claim (decode nodes end their READ within half of it, so a lease that outlives it has a dead or lost
claimer). It ends once, in one of four ways:
  read: the reader's done notification (wire.protocol.KVReadDone) arrives (counters.kv_released += 1)
  released unread: its claimer's ReleaseKV (the READ failed, timed out or was aborted), or its claimer's process is
    known to be gone (wire.protocol.InstanceGone: it will never read) (num_released_unread += 1)
  expired: its deadline passed, claimed or not (counters.lease_expiries += 1); a later claim is refused
  aborted: the router gave the request up before any claim (not counted)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from transfer.counters import TransferCounters
from wire.protocol import ProtocolError, kv_done_request_id

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claimer:
    """The decode process that claimed a lease (wire.protocol.ClaimKV's node_id and instance_id)."""

    node_id: str
    instance_id: str


@dataclass
class Lease:
    request_id: str
    holder: Any
    """What the node frees when the lease ends (the prefill node's Request, which holds the blocks)."""
    block_ids: tuple[int, ...]
    deadline: float
    """time.monotonic() past which the lease expires."""
    claimer: Claimer | None = None
    """Who claimed it (None: nobody yet); while that process lives it may be reading the blocks."""

    @property
    def claimed(self) -> bool:
        return self.claimer is not None


@dataclass(frozen=True)
class Claim:
    """A claim's answer: the blocks, or why not."""

    ok: bool
    block_ids: tuple[int, ...] = ()
    reason: str = ""


class LeasingSender:
    """KVSender's lease calls; a transport's sender subclasses it and adds done_request_ids(), handshake_payload()
    and close()."""

    transport: str

    def __init__(self, name: str, lease_seconds: float, counters: TransferCounters | None = None):
        self.name = name
        """The node's id (its logs)."""
        self.lease_seconds = lease_seconds
        self.counters = TransferCounters() if counters is None else counters
        self.leases: dict[str, Lease] = {}
        self.num_released_unread = 0

    def lease(self, request_id: str, holder: Any, block_ids: Sequence[int]) -> None:
        self.leases[request_id] = Lease(request_id, holder, tuple(block_ids), time.monotonic() + self.lease_seconds)

    def claim(self, request_id: str, claimer: Claimer) -> Claim:
        lease = self.leases.get(request_id)
        if lease is None or lease.claimed:
            return Claim(False, reason="KV lease already claimed" if lease else "unknown or expired KV lease")
        lease.claimer, lease.deadline = claimer, time.monotonic() + self.lease_seconds
        return Claim(True, lease.block_ids)

    def release(self, request_id: str, reason: str) -> Lease | None:
        lease = self.leases.pop(request_id, None)
        if lease is not None:
            logger.info("prefill %s: lease of %s released unread: %s", self.name, request_id, reason)
            self.num_released_unread += 1
        return lease

    def release_claims_of(self, claimer: Claimer, reason: str) -> list[Lease]:
        """Every lease this process claimed, ended now: it is gone (InstanceGone), so it reads none of them. Leases of
        any other process, another instance of the same node included, are left alone."""
        gone = [request_id for request_id, lease in self.leases.items() if lease.claimer == claimer]
        return [self.release(request_id, reason) for request_id in gone]

    def abort(self, request_id: str) -> Lease | None:
        lease = self.leases.get(request_id)
        if lease is None or lease.claimed:
            return None  # NOTE: a claimed lease is never ended here: a decode node may be reading its blocks now
        return self.leases.pop(request_id)

    def poll(self) -> list[Lease]:
        read = [lease for request_id in self.done_request_ids()
                if (lease := self.leases.pop(request_id, None)) is not None]
        self.counters.kv_released += len(read)
        return read + self.expire()

    def expire(self) -> list[Lease]:
        now = time.monotonic()
        expired = [lease for lease in self.leases.values() if lease.deadline < now]
        for lease in expired:
            del self.leases[lease.request_id]
            self.counters.lease_expiries += 1
            logger.warning("prefill %s: KV lease of %s expired", self.name, lease.request_id)
        return expired

    def done_request_ids(self) -> list[str]:
        """The requests whose reader finished since the last call (the transport's done notifications)."""
        raise NotImplementedError

    def read_notifications(self, notifications: Iterable[bytes]) -> list[str]:
        """The requests the KV-done notifications (wire.protocol.KVReadDone) name; any other one (another protocol
        version, junk) is logged and dropped: its lease ends by expiry."""
        request_ids = []
        for notification in notifications:
            try:
                request_ids.append(kv_done_request_id(notification))
            except ProtocolError as error:
                logger.warning("prefill %s: dropping a KV transport notification: %s", self.name, error)
        return request_ids
