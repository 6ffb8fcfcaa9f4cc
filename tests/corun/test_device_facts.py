"""The device's one fact the defaults need (corun/device_facts.py): a large GPU, as vLLM tells one."""

import json
from types import SimpleNamespace

import pytest
import torch

from corun.device_facts import is_large_gpu, resolved_on_device
from wire.config import DEFAULT_BATCHED_TOKENS, LARGE_GPU_BATCHED_TOKENS, EngineConfig, SchedulerConfig

GIB = 2**30


def test_a_cpu_is_never_a_large_gpu(tiny_model_dir):
    assert not is_large_gpu("cpu")
    assert resolved_on_device(EngineConfig(model=tiny_model_dir)).scheduler.max_num_batched_tokens == \
        DEFAULT_BATCHED_TOKENS


def test_h100_and_h200_are_large_an_a100_and_small_gpus_are_not(monkeypatch):
    def gpu(name: str, gib: int) -> bool:
        properties = SimpleNamespace(name=name, total_memory=gib * GIB, major=9, minor=0)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: properties)
        return is_large_gpu("cuda:0")

    assert gpu("NVIDIA H200", 140) and gpu("NVIDIA H100 80GB HBM3", 79)
    assert not gpu("NVIDIA A100-SXM4-80GB", 79) and not gpu("NVIDIA L4", 22) and not gpu("NVIDIA A10G", 22)
    gpu("NVIDIA H200", 140)
    config = resolved_on_device(EngineConfig(model="m", device="cuda"))
    assert config.scheduler.max_num_batched_tokens == config.scheduler.prefill_pack_tokens == LARGE_GPU_BATCHED_TOKENS


def test_a_max_model_len_beyond_the_models_context_is_refused(tiny_model_dir):
    # NOTE: vLLM's rule: config.json's max_position_embeddings (2048 for the tiny model), or the tokenizer's less
    resolved_on_device(EngineConfig(model=tiny_model_dir, scheduler=SchedulerConfig(max_model_len=2048)))
    with pytest.raises(ValueError, match=r"--max-model-len 2049 is longer than the model's context, 2048 "
                                         r"\(max_position_embeddings in config.json"):
        resolved_on_device(EngineConfig(model=tiny_model_dir, scheduler=SchedulerConfig(max_model_len=2049)))
    with pytest.raises(ValueError, match="context, 2048 .the preset's"):
        resolved_on_device(EngineConfig(model="random:qwen3-tiny", scheduler=SchedulerConfig(max_model_len=4096)))


def test_the_context_is_the_tokenizers_limit_where_less_and_a_linear_ropes_stretch(tmp_path):
    from corun.models.config import context_length

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    assert context_length(tmp_path) == (4096, "max_position_embeddings in config.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1000}))
    assert context_length(tmp_path) == (1000, "model_max_length in tokenizer_config.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1e30}))  # NOTE: "no limit"
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096, "rope_scaling": {
        "rope_type": "linear", "factor": 2.0}}))
    assert context_length(tmp_path) == (8192, "max_position_embeddings in config.json x RoPE factor 2")
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0}}))  # NOTE: llama3's positions are the scaled ones already
    assert context_length(tmp_path)[0] == 4096
    assert context_length(tmp_path / "absent") is None


def test_auto_is_float16_and_an_explicit_bfloat16_refused_on_a_gpu_without_bfloat16(monkeypatch):
    """vLLM's rule on a GPU before Ampere (a T4, a V100): auto runs a bfloat16 checkpoint in float16, and --dtype
    bfloat16 is an error at start-up naming the GPU. Inverse: the same config on an Ampere GPU keeps bfloat16."""
    capability = (7, 5)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(name="Tesla T4", total_memory=16 * GIB))
    assert resolved_on_device(EngineConfig(model="random:qwen3-8b", device="cuda")).dtype == "float16"
    with pytest.raises(ValueError, match="Tesla T4 has 7.5"):
        resolved_on_device(EngineConfig(model="random:qwen3-8b", device="cuda", dtype="bfloat16"))
    assert resolved_on_device(EngineConfig(model="random:qwen3-8b", device="cuda", dtype="float16")).dtype == \
        "float16"
    capability = (8, 0)
    assert resolved_on_device(EngineConfig(model="random:qwen3-8b", device="cuda")).dtype == "bfloat16"
    assert resolved_on_device(EngineConfig(model="random:qwen3-8b", device="cuda", dtype="bfloat16")).dtype == \
        "bfloat16"
