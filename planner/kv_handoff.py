"""Measuring the KV hand-off of a P/D request: the decode node's NIXL READ of a prompt's KV blocks from the prefill
node, by prompt length, between two processes on the profiled engine's device, with the agent the nodes use
(transfer/agent.py's KVTransferAgent and its default TransferConfig; benchmarks/kv_transfer.py measures the same READ
in more settings).

This process plays the decode node (a block pool of the engine's block shape, read into); a spawned process plays
the prefill node (the same pool, holding the blocks and taking the READs' notifications, as a node's loop does).
The block ids are scattered on both sides (one descriptor per block, as on a node whose cache has been in use).
Each length is read once first (the path's set-up), then `repeats` times (the median counts), and per request + per
prompt token is fitted to the medians, as the planner models the hand-off (planner/perf_profile.py KVHandoff).

NOTE: this is the READ on an idle device. Under load (1P1D sharing one GPU) a READ also waits for the GPU's time
slice and for the decode loop's next poll; the profile's shared_gpu holds that hand-off, measured in a served run.
"""

from __future__ import annotations

import logging
import multiprocessing
import random
import statistics
import time
import traceback
from collections.abc import Callable, Sequence

import numpy as np
import torch

from planner.perf_profile import KVHandoff, fit_nonnegative
from wire.config import TransferConfig

PREFILL_AGENT = "profile-prefill"
DECODE_AGENT = "profile-decode"
FILL_BYTE = 7
"""Every byte of the holder's pool: a READ that reports DONE but moved nothing is caught."""
STEP_TIMEOUT_S = 120.0
"""How long either side waits for the other (the holder's start includes importing torch and NIXL, and a CUDA
context on a GPU)."""
DEFAULT_REPEATS = 5
TRANSFER = TransferConfig(ucx_devices=("lo",))
"""Both sides' settings: the defaults, on loopback, as the nodes of one host run them (node_core.server's
transfer_for_host)."""


def measure_kv_handoff(block_shape: Sequence[int], dtype: torch.dtype, device: str, block_size: int,
                       prompt_lens: Sequence[int], repeats: int = DEFAULT_REPEATS, seed: int = 0,
                       progress: Callable[[str], None] = lambda line: None) -> KVHandoff:
    """The fitted hand-off over prompt_lens (block_shape: one KV block, as the engine's cache holds it). Where NIXL
    is not installed or the READ fails, a zero hand-off whose source says why (the planner then takes it as free)."""
    try:
        import nixl  # noqa: F401  NOTE: only to learn whether the transfer layer can run here
    except ImportError as error:
        return unmeasured(f"NIXL is not installed here ({error})")
    lengths = sorted(set(prompt_lens))
    num_blocks = [-(-length // block_size) for length in lengths]
    pool_shape = (1 + 2 * max(num_blocks), *block_shape)  # NOTE: the null block, and room to scatter the ids
    try:
        medians = read_medians(pool_shape, dtype, device, num_blocks, repeats, random.Random(seed), progress)
    except (RuntimeError, TimeoutError) as error:
        return unmeasured(f"the READ failed: {error}")
    return fitted_handoff(lengths, medians, repeats, device, pool_shape, dtype)


def unmeasured(reason: str) -> KVHandoff:
    return KVHandoff(source=f"not measured: {reason}; taken as zero")


def fitted_handoff(lengths: list[int], medians: list[float], repeats: int, device: str,
                   pool_shape: tuple[int, ...], dtype: torch.dtype) -> KVHandoff:
    features = np.stack([np.ones(len(lengths)), np.array(lengths, dtype=float)], axis=1)
    if len(lengths) < 2:  # NOTE: one length cannot separate the two terms: all of it is per request
        features[:, 1] = 0.0
    (per_request_s, per_token_s), max_error = fit_nonnegative(features, np.array(medians))
    block_mib = torch.Size(pool_shape[1:]).numel() * dtype.itemsize / 2**20
    points = ", ".join(f"{length} tokens {1e3 * s:.3g} ms" for length, s in zip(lengths, medians, strict=True))
    source = (f"measured: NIXL READ of a prompt's KV ({block_mib:.3g} MiB blocks, scattered) between two idle "
              f"processes on {device}, median of {repeats} per length: {points}; fit max error "
              f"{100 * max_error:.0f}%")
    return KVHandoff(per_request_s, per_token_s, source)


def read_medians(pool_shape: tuple[int, ...], dtype: torch.dtype, device: str, num_blocks: list[int], repeats: int,
                 rng: random.Random, progress: Callable[[str], None]) -> list[float]:
    """Median seconds of a READ of each block count, the holder in a spawned process."""
    from transfer.agent import KVTransferAgent

    quiet_nixl_logs()
    context = multiprocessing.get_context("spawn")  # NOTE: a forked child would share this process' CUDA state
    conn, child_conn = context.Pipe()
    holder = context.Process(target=hold_blocks, args=(child_conn, pool_shape, dtype, device), daemon=True)
    holder.start()
    pool = torch.zeros(pool_shape, dtype=dtype, device=device)
    agent = KVTransferAgent(DECODE_AGENT, pool, TRANSFER)
    try:
        agent.add_peer(**received(conn, agent.new_notifications))
        medians = []
        for count in num_blocks:
            remote_ids, local_ids = (rng.sample(range(1, pool_shape[0]), count) for _ in range(2))
            seconds = [timed_read(agent, remote_ids, local_ids) for _ in range(1 + repeats)][1:]
            medians.append(statistics.median(seconds))
            progress(f"KV hand-off: {count} blocks, {1e3 * medians[-1]:.3g} ms")
            if not bool((pool[local_ids].view(torch.uint8) == FILL_BYTE).all()):
                raise RuntimeError(f"a READ of {count} blocks reported DONE but its bytes did not land")
        conn.send("done")
        return medians
    finally:
        agent.close()
        holder.join(timeout=10)
        if holder.is_alive():
            holder.terminate()


def timed_read(agent, remote_ids: list[int], local_ids: list[int]) -> float:
    """Seconds from posting the READ (with a notification, as the decode node posts it) to its DONE."""
    start = time.perf_counter()
    handle = agent.start_read(PREFILL_AGENT, remote_ids, local_ids, b"handoff")
    while agent.poll(handle) == "PROC":
        pass
    if handle.state != "DONE":
        raise RuntimeError(f"the READ of {len(local_ids)} blocks ended {handle.state}: {handle.error}")
    return time.perf_counter() - start


def hold_blocks(conn, pool_shape: tuple[int, ...], dtype: torch.dtype, device: str) -> None:
    """The prefill side: a filled pool, its agent's handshake sent, NIXL called until the reader is done."""
    try:
        from transfer.agent import KVTransferAgent

        quiet_nixl_logs()
        pool = torch.empty(pool_shape, dtype=dtype, device=device)
        pool.view(torch.uint8).fill_(FILL_BYTE)
        agent = KVTransferAgent(PREFILL_AGENT, pool, TRANSFER)
        conn.send({"node_id": agent.name, "agent_metadata": agent.metadata(),
                   "kv_base_addresses": agent.kv_base_addresses, "num_blocks": agent.num_blocks,
                   "block_nbytes": agent.block_nbytes, "memory_type": agent.memory_type,
                   "device_id": agent.device_id})
        # NOTE: without a progress thread (CPU KV) a notification leaves only inside the holder's NIXL calls
        received(conn, agent.new_notifications)
        agent.close()
    except BaseException:
        conn.send({"error": traceback.format_exc()})
        raise


def quiet_nixl_logs() -> None:
    # NOTE: NIXL logs an INFO line per agent and backend to *stdout*, where `corun plan` writes its JSON
    logging.getLogger("nixl").setLevel(logging.WARNING)


def received(conn, keep_alive: Callable[[], object]):
    """The next message from the other side, calling keep_alive (NIXL progress) while waiting."""
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while not conn.poll(0.001):
        keep_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other side of the KV hand-off sent nothing within {STEP_TIMEOUT_S:g} s")
    message = conn.recv()
    if isinstance(message, dict) and "error" in message:
        raise RuntimeError(f"the prefill side failed:\n{message['error']}")
    return message
