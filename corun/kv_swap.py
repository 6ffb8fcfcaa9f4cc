"""KV blocks moved to host memory and back, bit for bit: how a decode node admits more requests than its KV cache
holds at their full length (CacheConfig.swap_space_bytes) without ever computing a token's KV again.

Why swap and not recompute (vLLM and SGLang preempt by recomputing a request's KV): KV written by decode steps was
computed at the N-row step's shape; a prefill of the same tokens computes other bits, so a recomputed request would
continue on other logprobs. A copy keeps the bytes; the attention reads a request's blocks in table order, wherever
they are, so new block ids change nothing.

Why admission stays safe: a decode node admits a request only while the whole sequences (prompt + max_tokens) of
everything admitted fit the cache and the swap space together. When a running request needs a block and none is free,
the blocks held in host memory are then at most swap space - (blocks every admitted request still needs), so the swap
space has room for at least the block that request needs (blocks whose copy out has not ended are coming back: a
request short of one waits for them, about a step). The oldest request is never the one swapped out, so it always
finishes, and its blocks come back to the others (decode_node/server.py, grow_running).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from corun.kv_cache import PagedKVCache
from wire.block_runs import block_runs
from wire.config import GPU_SWAP_SHARE_OF_HOST_MEMORY, CacheConfig, EngineConfig


def swap_capacity_blocks(config: EngineConfig, kv_cache) -> int:
    """How many of kv_cache's blocks the swap space holds (none for the vLLM backend, whose KV layout is vLLM's)."""
    if config.backend != "native":
        return 0
    return swap_space_bytes(config.cache, config.device) // kv_cache.block_nbytes


def host_swap_for(config: EngineConfig, kv_cache) -> HostSwap | None:
    """An engine's or colocated node's swap space (corun/swap_preemption.py), None where it has none."""
    capacity = swap_capacity_blocks(config, kv_cache)
    return HostSwap(kv_cache, capacity) if capacity else None


def swap_space_bytes(cache: CacheConfig, device: str) -> int:
    """The swap space a node gets: as configured, or (auto) GPU_SWAP_SHARE_OF_HOST_MEMORY of the host memory available
    now, split among the host's GPUs, on CUDA; none on CPU (its KV cache is host memory already)."""
    if cache.swap_space_bytes is not None:
        return cache.swap_space_bytes
    if not device.startswith("cuda"):
        return 0
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(available * GPU_SWAP_SHARE_OF_HOST_MEMORY) // host_gpu_count()


def host_gpu_count() -> int:
    """The host's NVIDIA GPUs, every one (a node's process sees only its own through CUDA_VISIBLE_DEVICES, so its
    torch.cuda.device_count() would give each of eight decode nodes a quarter of the host's memory)."""
    gpus = "/proc/driver/nvidia/gpus"
    count = len(os.listdir(gpus)) if os.path.isdir(gpus) else torch.cuda.device_count()
    return max(1, count)


@dataclass(eq=False)
class HostCopy:
    """The blocks of one swap-out, in host memory."""

    data: torch.Tensor
    """[num_blocks, ...]: the blocks' bytes (pinned on CUDA)."""
    copied: torch.cuda.Event | None
    """Fires once the copy from the cache is complete (None: it was when made, on CPU)."""
    block_ids: list[int]
    """The cache blocks copied: they go back to the pool only once `copied` has fired."""

    @property
    def num_blocks(self) -> int:
        return self.data.shape[0]

    def done(self) -> bool:
        return self.copied is None or self.copied.query()


@dataclass(eq=False)
class SwappedBlocks:
    """A paused request's blocks in host memory, in order: one part per swap-out (a later one holds earlier blocks)."""

    parts: list[HostCopy]

    @property
    def num_blocks(self) -> int:
        return sum(part.num_blocks for part in self.parts)

    def followed_by(self, later: SwappedBlocks) -> SwappedBlocks:
        """These blocks, then later's."""
        return SwappedBlocks(self.parts + later.parts)


class HostSwap:
    """Moves blocks of kv_cache to host memory and back, within capacity_blocks blocks of host memory.

    On CUDA a copy out runs on a stream of its own once the kernels queued before it have run (the step in flight
    that writes the blocks), so the next step need not wait for it; its blocks go back to the pool when it is complete
    (copied_blocks), never earlier: a KV READ given them does not wait for this process's kernels. A copy back waits
    on the device for the copy out it reads, before the next step reads its blocks."""

    def __init__(self, kv_cache: PagedKVCache, capacity_blocks: int):
        self.kv_cache = kv_cache
        self.capacity_blocks = capacity_blocks
        self.used_blocks = 0
        self.num_blocks_out = 0
        """Blocks copied to host memory so far (only grows)."""
        self.num_blocks_in = 0
        self.copying: list[HostCopy] = []
        """Copies out whose cache blocks are not back in the pool yet."""
        data = kv_cache.data
        self.copy_stream = torch.cuda.Stream(data.device) if capacity_blocks and data.is_cuda else None

    @property
    def room(self) -> int:
        return self.capacity_blocks - self.used_blocks

    @property
    def blocks_in_copy(self) -> int:
        return sum(part.num_blocks for part in self.copying)

    def swap_out(self, block_ids: list[int]) -> SwappedBlocks:
        """The blocks copied to host memory, after every kernel queued before; they are not free until copied_blocks
        gives them back."""
        if len(block_ids) > self.room:
            raise ValueError(f"{len(block_ids)} blocks do not fit the swap space's {self.room} free blocks")
        data = self.kv_cache.data
        host = torch.empty((len(block_ids), *data.shape[1:]), dtype=data.dtype, pin_memory=data.is_cuda)
        copied = None
        if self.copy_stream is not None:
            self.copy_stream.wait_stream(torch.cuda.current_stream(data.device))
            with torch.cuda.stream(self.copy_stream):
                copy_runs(host, data, block_ids, to_cache=False)
                copied = torch.cuda.Event()
                copied.record(self.copy_stream)
        else:
            copy_runs(host, data, block_ids, to_cache=False)
        part = HostCopy(host, copied, list(block_ids))
        self.copying.append(part)
        self.used_blocks += len(block_ids)
        self.num_blocks_out += len(block_ids)
        return SwappedBlocks([part])

    def copied_blocks(self) -> list[int]:
        """The cache blocks whose copies out have completed since the last call: theirs to free now."""
        done, copying = [], []
        for part in self.copying:  # NOTE: one look each: an event may fire between two
            (done if part.done() else copying).append(part)
        self.copying = copying
        return [block for part in done for block in part.block_ids]

    def swap_in(self, swapped: SwappedBlocks, block_ids: list[int]) -> None:
        """The swapped blocks' bytes into block_ids, queued on the current stream (before the next step reads them)."""
        if len(block_ids) != swapped.num_blocks:
            raise ValueError(f"{swapped.num_blocks} swapped blocks into {len(block_ids)} blocks")
        data = self.kv_cache.data
        start = 0
        for part in swapped.parts:
            if part.copied is not None:
                torch.cuda.current_stream(data.device).wait_event(part.copied)
            copy_runs(part.data, data, block_ids[start:start + part.num_blocks], to_cache=True)
            start += part.num_blocks
        self.drop(swapped)
        self.num_blocks_in += len(block_ids)

    def pause_tail(self, request, count: int, earlier: SwappedBlocks | None) -> SwappedBlocks:
        """The request's last count blocks copied out (after the step in flight, which writes its KV) and gone from
        its block ids; -> all it has in host memory now, in order (these blocks come before earlier's)."""
        if count < 1:  # NOTE: block_ids[-0:] is every block
            raise ValueError(f"a pause moves at least one block, got {count}")
        head, tail = request.block_ids[:-count], request.block_ids[-count:]
        swapped = self.swap_out(tail)
        request.block_ids = head
        return swapped if earlier is None else swapped.followed_by(earlier)

    def resume(self, request, swapped: SwappedBlocks, block_manager) -> None:
        """The request's swapped blocks copied back into new blocks of block_manager, after those it holds."""
        blocks = block_manager.allocate(swapped.num_blocks * block_manager.block_size)
        self.swap_in(swapped, blocks)
        request.block_ids = request.block_ids + blocks  # NOTE: replaced, never mutated (step_inputs caches it)

    def drop(self, swapped: SwappedBlocks) -> None:
        """The swapped blocks are not needed any more (copied back, or their request ended)."""
        self.used_blocks -= swapped.num_blocks


def copy_runs(host: torch.Tensor, data: torch.Tensor, block_ids: list[int], to_cache: bool) -> None:
    """host[i] <-> the cache's block block_ids[i], a copy per run of adjacent ids (asynchronous on CUDA)."""
    # NOTE: a gather of a paused request's blocks would take as much GPU memory again: a copy per run instead
    for first, place, count in block_runs(block_ids, range(len(block_ids))):
        cache_part, host_part = data[first:first + count], host[place:place + count]
        if to_cache:
            cache_part.copy_(host_part, non_blocking=data.is_cuda)
        else:
            host_part.copy_(cache_part, non_blocking=data.is_cuda)

