"""Host-to-device copies that do not make the host wait for the GPU.

CUDA synchronises the stream before a copy from pageable host memory to the device, so the host waits there for
every kernel queued before it (the CUDA runtime's documented behaviour of cudaMemcpyAsync). A decode step launched
ahead of the host (corun/decode_ahead.py) would then wait for the step before it at its first input copy, undoing
the overlap (measured on the H200: the step ran 1.8 ms slower than without async scheduling). Copies from pinned
memory are queued without waiting; torch's caching host allocator keeps a pinned buffer until its copy is done.

A captured graph's inputs go further: they live in one DeviceBlock and a step's values reach them in one copy; a
step's sampled rows come back in one (read_back). Both cut host time the GPU waits for around a lone prompt's step.
"""

from __future__ import annotations

import numpy as np
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


class DeviceBlock:
    """Fixed-shape device tensors kept as views of one device buffer, so that a step's values for all of them go in
    one host-to-device copy from one pinned staging buffer (load).

    NOTE: a captured graph's static inputs (corun/cuda_graphs.py). Copied one by one, each input cost a pinned
    allocation and a copy launch: eleven inputs took ~0.37 ms of host time before a lone prompt's prefill graph could
    start, time the GPU waits; in one copy its first kernel started ~0.25 ms sooner (measured on an H100,
    benchmarks/results/h100_prefill_gaps_64_trace_{before,after}_stop58.json.gz)."""

    ALIGN = 16
    """Bytes: every view starts at a multiple of this, which every dtype's alignment divides."""

    def __init__(self, like: list[torch.Tensor], device: torch.device | str):
        """One view per tensor of like, on device, of its shape and dtype, holding its values."""
        self.device = torch.device(device)
        self.spans: list[tuple[int, int]] = []
        """(byte offset, bytes) of each view in the buffer."""
        offset = 0
        for tensor in like:
            num_bytes = tensor.numel() * tensor.element_size()
            self.spans.append((offset, num_bytes))
            offset += -(-num_bytes // self.ALIGN) * self.ALIGN
        self.buffer = torch.zeros(offset, dtype=torch.uint8, device=self.device)
        self.views = [self.buffer[start:start + num_bytes].view(tensor.dtype).view(tensor.shape)
                      for (start, num_bytes), tensor in zip(self.spans, like, strict=True)]
        self.load(like)

    def load(self, sources: list[torch.Tensor]) -> None:
        """views[i].copy_(sources[i]) for every i (each of its view's shape and dtype): the host sources in one copy,
        queued without waiting for the device; a source already on the device by a copy of its own, after it."""
        staging = torch.empty(self.buffer.numel(), dtype=torch.uint8, pin_memory=self.device.type == "cuda")
        host_bytes = staging.numpy()
        on_device = []
        for (start, num_bytes), view, source in zip(self.spans, self.views, sources, strict=True):
            if source.shape != view.shape or source.dtype != view.dtype:
                raise ValueError(f"a {source.dtype} {tuple(source.shape)} source for a {view.dtype} "
                                 f"{tuple(view.shape)} view")
            if source.is_cpu:
                # NOTE: through numpy (a copy only of a source that is not contiguous): torch's per-op cost was the
                # larger part of a pack's load on the H100 host (~140 us for eleven inputs)
                host_bytes[start:start + num_bytes] = np.ascontiguousarray(source.numpy()).reshape(-1).view(np.uint8)
            else:
                on_device.append((view, source))
        self.buffer.copy_(staging, non_blocking=True)
        for view, source in on_device:
            view.copy_(source, non_blocking=True)


def read_back(tensors: list[torch.Tensor]) -> list[np.ndarray]:
    """Host copies of tensors (on one device) as numpy arrays, in one device-to-host copy: their bytes joined on the
    device, read once, split on the host with numpy views (torch slices and views cost ~80 us a step on the H100 host).

    NOTE: each .tolist() of a device tensor is a synchronising copy of its own; a step's sampled token ids and
    logprobs read one after the other cost the second ~0.12 ms of host time (measured on an H100,
    benchmarks/results/h100_prefill_gaps_trace_stop57.json.gz), after the GPU is done."""
    if all(tensor.device.type == "cpu" for tensor in tensors):
        return [tensor.numpy() for tensor in tensors]
    return read_joined(tensors)


def read_joined(tensors: list[torch.Tensor]) -> list[np.ndarray]:
    """read_back's one copy, whatever the device."""
    order = sorted(range(len(tensors)), key=lambda i: -tensors[i].element_size())  # NOTE: keeps each view aligned
    joined = torch.cat([tensors[i].reshape(-1).view(torch.uint8) for i in order]).cpu().numpy()
    host: list[np.ndarray | None] = [None] * len(tensors)
    start = 0
    for i in order:
        tensor = tensors[i]
        num_bytes = tensor.numel() * tensor.element_size()
        host[i] = joined[start:start + num_bytes].view(NUMPY_DTYPES[tensor.dtype]).reshape(tensor.shape)
        start += num_bytes
    return host


NUMPY_DTYPES = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32, torch.float64: np.float64,
                torch.bool: np.bool_, torch.uint8: np.uint8}
"""What read_back can return: the dtypes a sampler's outputs have (and a few more)."""
