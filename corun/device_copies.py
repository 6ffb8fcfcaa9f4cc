"""Host-to-device copies that do not make the host wait for the GPU.

CUDA synchronises the stream before a copy from pageable host memory to the device, so the host waits there for
every kernel queued before it (the CUDA runtime's documented behaviour of cudaMemcpyAsync). A decode step launched
ahead of the host (corun/decode_ahead.py) would then wait for the step before it at its first input copy, undoing
the overlap (measured on the H200: the step ran 1.8 ms slower than without async scheduling). Copies from pinned
memory are queued without waiting; torch's caching host allocator keeps a pinned buffer until its copy is done.
"""

from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """tensor on device, queued without waiting for the device when it goes from the host to a GPU."""
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def copy_into(target: torch.Tensor, source: torch.Tensor) -> None:
    """target.copy_(source), queued without waiting for the device when source is on the host and target on a GPU."""
    if target.is_cuda and source.device.type == "cpu":
        source = source.pin_memory()
    target.copy_(source, non_blocking=True)
