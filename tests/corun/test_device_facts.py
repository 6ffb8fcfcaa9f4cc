"""The device's one fact the defaults need (corun/device_facts.py): a large GPU, as vLLM tells one."""

from types import SimpleNamespace

import torch

from corun.device_facts import is_large_gpu, resolved_on_device
from wire.config import DEFAULT_BATCHED_TOKENS, LARGE_GPU_BATCHED_TOKENS, EngineConfig

GIB = 2**30


def test_a_cpu_is_never_a_large_gpu(tiny_model_dir):
    assert not is_large_gpu("cpu")
    assert resolved_on_device(EngineConfig(model=tiny_model_dir)).scheduler.max_num_batched_tokens == \
        DEFAULT_BATCHED_TOKENS


def test_h100_and_h200_are_large_an_a100_and_small_gpus_are_not(monkeypatch):
    def gpu(name: str, gib: int) -> bool:
        properties = SimpleNamespace(name=name, total_memory=gib * GIB)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: properties)
        return is_large_gpu("cuda:0")

    assert gpu("NVIDIA H200", 140) and gpu("NVIDIA H100 80GB HBM3", 79)
    assert not gpu("NVIDIA A100-SXM4-80GB", 79) and not gpu("NVIDIA L4", 22) and not gpu("NVIDIA A10G", 22)
    gpu("NVIDIA H200", 140)
    config = resolved_on_device(EngineConfig(model="m", device="cuda"))
    assert config.scheduler.max_num_batched_tokens == config.scheduler.prefill_pack_tokens == LARGE_GPU_BATCHED_TOKENS
