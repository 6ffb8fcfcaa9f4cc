"""What the device an engine runs on says about its defaults: the one question wire/config.py cannot ask itself
(it imports no torch), answered where an engine is built."""

from __future__ import annotations

import torch

from wire.config import LARGE_GPU_BYTES, EngineConfig


def is_large_gpu(device: str) -> bool:
    """vLLM's test for its larger serving defaults: a CUDA GPU of LARGE_GPU_BYTES or more that is not an A100."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return False
    properties = torch.cuda.get_device_properties(torch.device(device))
    return properties.total_memory >= LARGE_GPU_BYTES and "a100" not in properties.name.lower()


def resolved_on_device(config: EngineConfig) -> EngineConfig:
    """config.resolved() for the device it names."""
    return config.resolved(large_gpu=is_large_gpu(config.device))
