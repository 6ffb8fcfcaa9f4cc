"""The vLLM settings of `--engine vllm` (corun/vllm_backend/engine_args.py), pinned: on CUDA they cannot run here
(no CUDA vLLM wheel fits the H200 test machine), so what they say is checked where it is made."""

import dataclasses

import pytest

from corun.vllm_backend.engine_args import (
    CORUN_CHUNK_SIZE_KEY,
    SCHEDULER_CLS,
    vllm_engine_kwargs,
    vllm_environment,
)
from wire.config import CPU_KV_CACHE_BYTES, CacheConfig, EngineConfig, SchedulerConfig


def config(mode: str = "fixed_shape", device: str = "cpu", **engine) -> EngineConfig:
    return EngineConfig(model="m", backend="vllm", device=device, cache=CacheConfig(block_size=32),
                        scheduler=SchedulerConfig(mode=mode, max_num_seqs=64, prefill_chunk_size=256), **engine)


def test_cuda_corun_decodes_in_one_full_graph_at_n_without_split_kv():
    kwargs = vllm_engine_kwargs(config(device="cuda"))
    assert kwargs["compilation_config"] == {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [64]}
    assert kwargs["attention_config"] == {"flash_attn_max_num_splits_for_cuda_graph": 1}
    assert kwargs["max_num_seqs"] == 64 and "enforce_eager" not in kwargs


def test_corun_schedules_isolated_chunks_without_prefix_caching_or_async_steps():
    kwargs = vllm_engine_kwargs(config())
    assert kwargs["scheduler_cls"] == SCHEDULER_CLS
    assert kwargs["additional_config"] == {CORUN_CHUNK_SIZE_KEY: 256}
    assert kwargs["enable_prefix_caching"] is False and kwargs["async_scheduling"] is False
    assert kwargs["max_num_batched_tokens"] >= 256 and kwargs["enforce_eager"] is True  # NOTE: CPU: no graphs
    assert vllm_environment(config())["VLLM_CPU_ATTN_SPLIT_KV"] == "0"


def test_standard_mode_is_vllms_own_scheduling_with_the_same_sampling():
    kwargs, fixed_shape = vllm_engine_kwargs(config("mixed")), vllm_engine_kwargs(config())
    assert "scheduler_cls" not in kwargs and "compilation_config" not in vllm_engine_kwargs(config("mixed", "cuda"))
    assert kwargs["logits_processors"] == fixed_shape["logits_processors"]
    assert vllm_environment(config("mixed"))["VLLM_CPU_ATTN_SPLIT_KV"] == "1"


def test_threads_bind_that_many_cores():
    assert vllm_environment(config(num_threads=2))["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert vllm_environment(config(num_threads=1))["VLLM_CPU_OMP_THREADS_BIND"] == "0"


def test_batch_invariant_mode_and_unknown_backends_are_refused():
    with pytest.raises(ValueError, match="fixed_shape or mixed"):
        config("batch_invariant")
    with pytest.raises(ValueError, match="engine backend"):
        dataclasses.replace(config(), backend="sglang")


def test_the_kv_cache_is_the_budget_given_or_vllms_own_sizing_on_cuda():
    assert vllm_engine_kwargs(config())["kv_cache_memory_bytes"] == CPU_KV_CACHE_BYTES
    cuda = vllm_engine_kwargs(config(device="cuda"))
    assert cuda["gpu_memory_utilization"] == 0.9 and "kv_cache_memory_bytes" not in cuda
    given = dataclasses.replace(config(device="cuda"), cache=CacheConfig(block_size=32, memory_budget_bytes=2**30))
    assert vllm_engine_kwargs(given)["kv_cache_memory_bytes"] == 2**30
    assert "gpu_memory_utilization" not in vllm_engine_kwargs(given)
    auto_n = dataclasses.replace(config(device="cuda"), scheduler=SchedulerConfig())
    assert vllm_engine_kwargs(auto_n)["max_num_seqs"] == 256
    assert vllm_engine_kwargs(config())["dtype"] == "float32" and vllm_engine_kwargs(auto_n)["dtype"] == "bfloat16"
