"""A CUDA tensor described for another process on the same GPU (CUDA IPC, as torch.multiprocessing shares one), and
whether the process that owns it still runs: the vocabulary of nodes that map each other's GPU memory (the weights:
corun/shared_weights.py; a prefill node's KV: transfer/agent.py).

No torch here: a caller hands in what torch's UntypedStorage._share_cuda_() returned (SharedCudaTensor.of) and
rebuilds the tensor with torch.multiprocessing.reductions.rebuild_cuda_tensor(*shared.rebuild_args(...)).

The memory stays its owner's: once the owner ends, the driver frees it and may give it to another allocation. A
process that maps it checks the owner (ProcessWatch) after the GPU work that read it has ended and before trusting
what that work made: an owner that has not begun to exit then was alive, its memory what it published, throughout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

PF_EXITING = 0x4
"""/proc/PID/stat's flags bit the kernel sets as a process begins to exit (before it lets go of its memory)."""


def dtype_name(dtype: Any) -> str:
    """A torch dtype as SharedCudaTensor.dtype names it: bfloat16, float32, ..."""
    return str(dtype).removeprefix("torch.")


class CudaStorage(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """torch's CUDA IPC description of one storage (UntypedStorage._share_cuda_'s tuple, by name)."""

    device: int
    handle: bytes
    size_bytes: int
    offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes | None
    event_sync_required: bool


class SharedCudaTensor(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    dtype: str
    """torch's name without the module: bfloat16, float32, ..."""
    shape: list[int]
    stride: list[int]
    storage_offset: int
    """In elements, of the tensor in its storage."""
    storage: CudaStorage

    @classmethod
    def of(cls, dtype: str, shape: list[int], stride: list[int], storage_offset: int,
           shared_storage: tuple) -> SharedCudaTensor:
        """shared_storage: what the tensor's untyped_storage()._share_cuda_() returned."""
        return cls(dtype, shape, stride, storage_offset, CudaStorage(*shared_storage))

    def rebuild_args(self, tensor_cls: Any, storage_cls: Any, dtype: Any, size: Any) -> tuple:
        """torch.multiprocessing.reductions.rebuild_cuda_tensor's arguments (tensor_cls torch.Tensor, storage_cls
        torch.storage.TypedStorage, dtype the torch dtype, size torch.Size(self.shape))."""
        s = self.storage
        return (tensor_cls, size, tuple(self.stride), self.storage_offset, storage_cls, dtype, s.device, s.handle,
                s.size_bytes, s.offset_bytes, False, s.ref_counter_handle, s.ref_counter_offset, s.event_handle,
                s.event_sync_required)


@dataclass(frozen=True)
class ProcessState:
    start_ticks: int
    exiting: bool


def process_state(pid: int) -> ProcessState | None:
    """The process' start time (clock ticks after boot) and whether it has begun to exit (None: no such process)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()  # NOTE: after the command name, which may hold spaces
    state, flags, start_ticks = fields[0], int(fields[6]), int(fields[19])
    return ProcessState(start_ticks, state in ("Z", "X", "x") or bool(flags & PF_EXITING))


def own_start_ticks() -> int:
    state = process_state(os.getpid())
    assert state is not None
    return state.start_ticks


@dataclass(frozen=True)
class ProcessWatch:
    """Whether the process that owns memory this one maps still runs: the same pid and start time (a pid the kernel
    gave another process since does not match), not exiting."""

    pid: int
    start_ticks: int

    def alive(self) -> bool:
        state = process_state(self.pid)
        return state is not None and state.start_ticks == self.start_ticks and not state.exiting
