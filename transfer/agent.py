"""KVTransferAgent: a node's one NIXL agent, moving paged-KV blocks between nodes by READ.

Once per node: apply the UCX settings of its TransferConfig, make the agent, register the KV segments (one region
each: a block-major tensor, or one per layer).
Once per peer (after the zmq handshake): load the peer's agent metadata; probe_read() times one READ, so a path
UCX emulates (VRAM through host memory) is seen before any request depends on it.
Per request: one READ whose descriptors are runs of adjacent blocks (a run is adjacent on both sides: one
descriptor per segment however many blocks it holds), posted with a notification (opaque bytes here: the senders
post wire.protocol.KVReadDone); the caller polls it between model steps, and the peer gets the notification (keyed
by this agent's name) once the bytes are read.

NOTE: on CPU KV there is no NIXL progress thread by default (on a 2-core host it cost ~3x bandwidth): work only
advances inside this object's calls, so a node must keep calling poll() / new_notifications() in its loop,
including while it waits for something else, or a posted read stalls and a completion notification may never leave
the process. GPU KV runs the thread (TransferConfig.progress_thread).

The "nixl" KV transport (wire.config.KV_TRANSPORTS): open_sender and open_receiver put this agent behind the seam
(transfer/transport.py) by transfer/endpoints.py.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from nixl._api import nixl_agent, nixl_agent_config, nixl_xfer_handle, nixlBind

from transfer.compat import IncompatiblePeer
from transfer.counters import TransferCounters
from transfer.endpoints import AgentReceiver, AgentSender
from transfer.gpu_peers import GpuPeers, GpuRead, GpuShare
from transfer.reads import (
    PROBE_TIMEOUT_S,
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

logger = logging.getLogger(__name__)

_TRANSFER_ERRORS = (nixlBind.nixlRemoteDisconnectError, nixlBind.nixlBackendError, nixlBind.nixlCancelledError,
                    nixlBind.nixlUnknownError)
"""What NIXL raises (instead of returning "ERR") when a transfer fails at run time, e.g. the peer died."""


@dataclass(frozen=True)
class _Peer:
    name: str
    num_blocks: int
    kv_base_addresses: tuple[int, ...]
    device_id: int


class KVTransferAgent(KVRegion):
    def __init__(self, name: str, kv_data: KVData, config: TransferConfig = TransferConfig()):
        """config.ucx_error_handling (verified here, nixl 1.5.1, two processes on one host):
        "none" (default): the first read to a peer takes ~0.3 ms, and a read completes without the peer calling
            into NIXL; a dead peer is still detected on one host (the cma copy fails: state "ERR").
        "peer": the first read takes 10-200 ms, and every read posted with a notification stays "PROC" until
            the peer next calls into NIXL, i.e. up to one of the prefill node's model steps per read."""
        self._segments = kv_segments(kv_data)  # NOTE: held so the registered memory outlives the registration
        check_kv_data(self._segments)
        self.name = name
        self.counters = TransferCounters()
        self._peers: dict[str, _Peer] = {}
        vram = self.memory_type == "VRAM"
        apply_ucx_environment(config, vram=vram)
        progress = config.uses_progress_thread(vram=vram)
        self._nixl = nixl_agent(name, nixl_agent_config(enable_prog_thread=progress, enable_listen_thread=False,
                                                        backends=[], capture_telemetry=True))
        self._nixl.create_backend("UCX", {"ucx_error_handling_mode": config.ucx_error_handling,
                                          "ucx_devices": ",".join(config.ucx_devices)})
        self._registration = self._nixl.register_memory(list(self._segments))
        self._gpu_peers = GpuPeers(self._segments) if vram and config.copy_on_gpu else None
        """Peers on this GPU whose reads this process copies (transfer/gpu_peers.py); None: every read is NIXL's."""

    def gpu_share(self) -> GpuShare | None:
        """This node's KV as a process on its GPU maps it (the handshake carries it); None on CPU or when turned off."""
        return None if self._gpu_peers is None else self._gpu_peers.share()

    # --- what the handshake reply carries ---------------------------------------------------------------------
    def metadata(self) -> bytes:
        return self._nixl.get_agent_metadata()

    # --- peers ------------------------------------------------------------------------------------------------
    def add_peer(self, node_id: str, agent_metadata: bytes, kv_base_addresses: Sequence[int], num_blocks: int,
                 block_nbytes: int, memory_type: str, device_id: int = 0, gpu_share: GpuShare | None = None) -> None:
        """Load a peer's metadata and prepare its block list; a peer added again (a restart) is replaced.

        kv_base_addresses: one per peer segment, in the order its segments pair with ours.
        device_id: the peer's GPU index for VRAM (its KV segments' device), 0 for DRAM.
        gpu_share: its KV as CUDA IPC handles: where it is on this GPU, its reads are copied here."""
        check_peer_layout(self, node_id, kv_base_addresses, block_nbytes)
        if memory_type not in ("DRAM", "VRAM"):
            raise IncompatiblePeer(f"peer {node_id} offers memory type {memory_type!r}, not DRAM or VRAM")
        self.remove_peer(node_id)
        loaded_name = _as_str(self._nixl.add_remote_agent(agent_metadata))
        if loaded_name != node_id:
            self._nixl.remove_remote_agent(loaded_name)
            raise IncompatiblePeer(f"peer {node_id} sent the NIXL metadata of agent {loaded_name}")
        self._peers[node_id] = _Peer(node_id, num_blocks, tuple(kv_base_addresses), device_id)
        if self._gpu_peers is not None:
            self._gpu_peers.add(node_id, gpu_share)

    def has_peer(self, node_id: str) -> bool:
        return node_id in self._peers

    def remove_peer(self, node_id: str) -> None:
        """Forget a peer (reads still in flight to it should be polled to the end first)."""
        if self._gpu_peers is not None:
            self._gpu_peers.remove(node_id)
        if self._peers.pop(node_id, None) is not None:
            self._nixl.remove_remote_agent(node_id)

    # --- reads ------------------------------------------------------------------------------------------------
    def start_read(self, peer: str, remote_block_ids: Sequence[int], local_block_ids: Sequence[int],
                   notification: bytes) -> ReadHandle:
        """Post a READ of the peer's blocks into ours (pairwise, in order); the peer gets `notification` when
        the read completes. Never waits for the peer; a read that fails to post (dead peer) comes back "ERR".

        NOTE: between processes of one host UCX copies with cma (process_vm_readv) inside this call, so the
        copy's CPU time is spent here (~60 ms for 600 MB) and the read usually comes back "DONE" at once."""
        remote = self._peers[peer]
        check_block_ids(remote_block_ids, local_block_ids, remote.num_blocks, self.num_blocks)
        self.counters.reads_started += 1
        runs = block_runs(remote_block_ids, local_block_ids)
        self.counters.descriptors_posted += len(runs) * len(self._segments)
        num_blocks = len(local_block_ids)
        handle = ReadHandle(peer, num_blocks, num_blocks * self.block_nbytes, "PROC", None)
        if self._gpu_peers is not None and self._gpu_peers.has(peer):
            self.counters.reads_on_gpu += 1
            handle.backend_handle = self._gpu_peers.start_read(peer, runs, notification)
            return handle
        try:
            handle.backend_handle = self._post_read(remote, runs, notification)
            state = self._nixl.transfer(handle.backend_handle)
        except _TRANSFER_ERRORS as error:
            state, handle.error = "ERR", repr(error)
        self._advance(handle, state)
        return handle

    def probe_read(self, peer: str, remote_block_ids: Sequence[int], local_block_ids: Sequence[int]) -> float:
        """GB/s of one READ of these blocks (free ones locally: a probe must not overwrite a request's KV), with no
        notification. Waits for it: once per peer, at the handshake. Not counted as a read."""
        remote = self._peers[peer]
        check_block_ids(remote_block_ids, local_block_ids, remote.num_blocks, self.num_blocks)
        runs = block_runs(remote_block_ids, local_block_ids)
        start = time.perf_counter()
        xfer = self._post_read(remote, runs, b"")
        state = self._nixl.transfer(xfer)
        while state == "PROC" and time.perf_counter() - start < PROBE_TIMEOUT_S:
            state = self._nixl.check_xfer_state(xfer)
        seconds = time.perf_counter() - start
        self._release(xfer, must_succeed=False)
        if state != "DONE":
            raise IncompatiblePeer(f"the probe READ from {peer} did not complete ({state} after {seconds:.1f} s)")
        return len(local_block_ids) * self.block_nbytes / seconds / 1e9

    def poll(self, handle: ReadHandle) -> XferState:
        """The read's state; the first time it is "DONE" or "ERR" the transfer handle is released and counted."""
        if handle.state == "PROC" and isinstance(handle.backend_handle, GpuRead):
            self._advance_gpu_read(handle)
        elif handle.state == "PROC":
            try:
                state = self._nixl.check_xfer_state(handle.backend_handle)
            except _TRANSFER_ERRORS as error:
                state, handle.error = "ERR", repr(error)
            self._advance(handle, state)
        return handle.state

    def _advance_gpu_read(self, handle: ReadHandle) -> None:
        """A read copied on this GPU: once done, the peer hears of it as of a NIXL READ (its notification)."""
        read: GpuRead = handle.backend_handle
        state, handle.error = self._gpu_peers.state(read)
        if state == "DONE":
            try:
                self._nixl.send_notif(read.peer, read.notification)
            except _TRANSFER_ERRORS as error:  # NOTE: the peer's lease then ends at its deadline
                logger.warning("%s: the end of a read could not be sent to %s: %r", self.name, read.peer, error)
            seconds = time.perf_counter() - read.posted_at
            self.counters.read_copy_seconds_total += GpuPeers.copy_seconds(read)
            self.counters.read_transfer_seconds_total += seconds
            self.counters.read_transfer_seconds_max = max(self.counters.read_transfer_seconds_max, seconds)
            self.counters.reads_over_1ms += seconds > 1e-3
        if state != "PROC":
            handle.backend_handle = None
            self._advance(handle, state)

    def cancel(self, handle: ReadHandle) -> bool:
        """Give up a READ still in flight (it took too long); True when NIXL released it, so nothing more will be
        written into its local blocks. Counted as a failed read."""
        if handle.state != "PROC":
            return True
        if isinstance(handle.backend_handle, GpuRead):
            finished = self._gpu_peers.copy_finished(handle.backend_handle)
            handle.backend_handle, handle.state, handle.error = None, "ERR", "cancelled: the READ took too long"
            count_finished(self.counters, handle)
            return finished
        xfer, handle.backend_handle = handle.backend_handle, None
        handle.state, handle.error = "ERR", "cancelled: the READ took too long"
        count_finished(self.counters, handle)
        try:
            self._nixl.release_xfer_handle(xfer)
        except _TRANSFER_ERRORS as error:
            logger.error("%s: a timed-out read from %s could not be released: %r", self.name, handle.peer, error)
            return False
        return True

    def new_notifications(self) -> list[tuple[str, bytes]]:
        """(peer agent name, message) of every notification received since the last call."""
        return [(_as_str(name), message) for name, messages in self._nixl.get_new_notifs().items()
                for message in messages]

    def close(self) -> None:
        for node_id in list(self._peers):
            self.remove_peer(node_id)
        if self._registration is not None:
            self._nixl.deregister_memory(self._registration)
            self._registration = None

    # --- helpers ----------------------------------------------------------------------------------------------
    def _advance(self, handle: ReadHandle, state: XferState) -> None:
        handle.state = state
        if state == "PROC":
            return
        if state == "ERR":
            handle.error = handle.error or "NIXL reported the transfer failed"
            logger.warning("%s: read of %d blocks from %s failed: %s", self.name, handle.num_blocks, handle.peer,
                           handle.error)
        xfer, handle.backend_handle = handle.backend_handle, None
        if xfer is not None:
            if state == "DONE":
                self._count_transfer_time(xfer)
            self._release(xfer, must_succeed=state == "DONE")
        count_finished(self.counters, handle)

    def _count_transfer_time(self, xfer: nixl_xfer_handle) -> None:
        """NIXL's own post + transfer time of a completed READ (what the wire took, without the wait for this
        node's next poll that read_seconds_total includes)."""
        try:
            telemetry = self._nixl.get_xfer_telemetry(xfer)
        except _TRANSFER_ERRORS:  # NOTE: telemetry is a measurement; its absence must not fail a read
            return
        seconds = (telemetry.postDuration + telemetry.xferDuration) / 1e6
        self.counters.read_post_seconds_total += telemetry.postDuration / 1e6
        self.counters.read_transfer_seconds_total += seconds
        self.counters.read_transfer_seconds_max = max(self.counters.read_transfer_seconds_max, seconds)
        self.counters.reads_over_1ms += seconds > 1e-3

    def _release(self, xfer: nixl_xfer_handle, must_succeed: bool) -> None:
        try:
            self._nixl.release_xfer_handle(xfer)
        except _TRANSFER_ERRORS:  # NOTE: a failed read's handle may refuse release; NIXL frees it at teardown
            if must_succeed:
                raise

    def _post_read(self, remote: _Peer, runs: list[tuple[int, int, int]], notification: bytes) -> nixl_xfer_handle:
        """A READ of (remote first block, local first block, blocks) runs, one descriptor per run and segment."""
        starts = np.asarray(runs, dtype=np.uint64).reshape(-1, 3)
        local = self._run_descs(self.kv_base_addresses, starts[:, 1], starts[:, 2], self.device_id)
        peer = self._run_descs(remote.kv_base_addresses, starts[:, 0], starts[:, 2], remote.device_id)
        return self._nixl.initialize_xfer("READ", self._nixl.get_xfer_descs(local, self.memory_type),
                                          self._nixl.get_xfer_descs(peer, self.memory_type), remote.name,
                                          notification)

    def _run_descs(self, base_addresses: Sequence[int], first_blocks: np.ndarray, num_blocks: np.ndarray,
                   device_id: int) -> np.ndarray:
        """[segments * runs, 3] (address, nbytes, device id) of block runs of the block-major segments at
        base_addresses, segment by segment (both sides list them in the same order, so descriptors pair up).

        NOTE: the peer's segments cut blocks as ours do (add_peer checks it), so our segment_block_nbytes is its."""
        segment_block_nbytes = np.uint64(self.segment_block_nbytes)
        bases = np.asarray(base_addresses, dtype=np.uint64)
        descs = np.empty((len(bases), len(first_blocks), 3), dtype=np.uint64)
        descs[:, :, 0] = bases[:, None] + first_blocks[None, :] * segment_block_nbytes
        descs[:, :, 1] = num_blocks[None, :] * segment_block_nbytes
        descs[:, :, 2] = device_id
        return descs.reshape(-1, 3)


def open_sender(config: TransferConfig, node_id: str, kv_data: KVData, lease_seconds: float) -> AgentSender:
    return AgentSender(config, KVTransferAgent(node_id, kv_data, config), lease_seconds)


def open_receiver(config: TransferConfig, node_id: str, kv_data: KVData, blocks: BlockPool) -> AgentReceiver:
    return AgentReceiver(config, KVTransferAgent(node_id, kv_data, config), blocks)


UCX_VARIABLES = ("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "UCX_TLS", "UCX_NET_DEVICES")
"""The UCX settings TransferConfig owns: whatever the environment held for them is replaced."""


def apply_ucx_environment(config: TransferConfig, vram: bool) -> None:
    """Before NIXL makes its UCX context (create_backend): UCX reads these settings only from the environment."""
    settings = config.ucx_environment(vram)
    for name in UCX_VARIABLES:
        if name in settings:
            os.environ[name] = settings[name]
        else:
            os.environ.pop(name, None)


def _as_str(name: str | bytes) -> str:
    # NOTE: nixl 1.5.1's add_remote_agent returns bytes while notification dicts are keyed by str; a bytes key
    # never matches, so every name is normalized to str at this boundary.
    return name.decode() if isinstance(name, bytes) else name
