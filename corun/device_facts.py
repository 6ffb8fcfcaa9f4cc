"""What the device an engine runs on (and the checkpoint it loads) says about its defaults: the questions
wire/config.py cannot ask itself (it imports no torch and reads no model), answered where an engine is built."""

from __future__ import annotations

import torch

from corun.cublas import apply_cublas_split_k
from corun.models.config import checkpoint_dtype
from corun.models.context import check_context_length
from wire.config import AUTO, LARGE_GPU_BYTES, EngineConfig


def is_large_gpu(device: str) -> bool:
    """vLLM's test for its larger serving defaults: a CUDA GPU of LARGE_GPU_BYTES or more that is not an A100."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return False
    properties = torch.cuda.get_device_properties(torch.device(device))
    return properties.total_memory >= LARGE_GPU_BYTES and "a100" not in properties.name.lower()


BFLOAT16_CAPABILITY = (8, 0)
"""CUDA GPUs compute in bfloat16 from Ampere on; CPUs do too (slowly without AMX)."""


def cuda_capability(device: str) -> tuple[int, int] | None:
    """The compute capability of the CUDA GPU device names; None for a CPU (or no CUDA)."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(torch.device(device))


def resolved_on_device(config: EngineConfig) -> EngineConfig:
    """config.resolved() for the device it names and the checkpoint it loads. The native engine's cuBLAS setting is
    applied first: the questions below start CUDA, and torch fixes its cuBLAS workspace for the process then.
    NOTE: until stop 63 the runner applied it after this, so every engine built through LLM(...) and every `corun
    serve` node ran with split-K on (a warning said so) and kept no decode step below 128 rows on the 8B shape;
    `corun bench` applied it before its first CUDA call, so the benchmarks measured the default."""
    if config.device.startswith("cuda") and config.backend == "native":
        apply_cublas_split_k(config.cublas_split_k)
    check_context_length(config)
    capability = cuda_capability(config.device)
    bfloat16_supported = capability is None or capability >= BFLOAT16_CAPABILITY
    if config.dtype == "bfloat16" and not bfloat16_supported:
        name = torch.cuda.get_device_name(torch.device(config.device))
        raise ValueError(f"--dtype bfloat16 needs a GPU of compute capability 8.0 or more; {name} has "
                         f"{capability[0]}.{capability[1]}: give --dtype float16 (or auto, which picks it there)")
    checkpoint = checkpoint_dtype(config.model) if config.dtype == AUTO else None
    return config.resolved(large_gpu=is_large_gpu(config.device), checkpoint_dtype=checkpoint,
                           bfloat16_supported=bfloat16_supported)
