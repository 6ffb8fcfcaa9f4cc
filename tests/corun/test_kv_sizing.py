"""The KV cache's budget without --kv-cache-mib (corun/kv_sizing.py): a fixed one on CPU; on CUDA this node's share
of the GPU less the weights and the forwards' reserve, never more than is free. The GPU's figures are given (this host
has none); the reserve is checked against the shapes it comes from."""

import pytest
import torch

from corun.kv_cache import bytes_per_block
from corun.kv_sizing import GpuMemory, forward_reserve_bytes, gpu_kv_budget, with_kv_budget
from corun.models.presets import preset_config
from wire.config import CPU_KV_CACHE_BYTES, MIB, CacheConfig, EngineConfig, SchedulerConfig

GIB = 2**30
QWEN3_8B = preset_config("random:qwen3-8b")
H200 = GpuMemory(total_bytes=int(139.8 * GIB), free_bytes=int(123.9 * GIB), reserved_bytes=int(15.3 * GIB))
"""An H200 once an 8B model's bf16 weights are in (the figures a node sees there)."""


def cuda_engine(**cache) -> EngineConfig:
    config = EngineConfig(model="random:qwen3-8b", device="cuda", dtype="bfloat16", cache=CacheConfig(**cache),
                          scheduler=SchedulerConfig(max_model_len=6144))
    return config.resolved(large_gpu=True)


def test_cpu_gets_the_fixed_budget_and_a_given_budget_is_kept():
    cpu = EngineConfig(model="m").resolved()
    assert with_kv_budget(cpu, QWEN3_8B, torch.float32).cache.memory_budget_bytes == CPU_KV_CACHE_BYTES
    given = cuda_engine(memory_budget_bytes=60000 * MIB)
    assert with_kv_budget(given, QWEN3_8B, torch.bfloat16, H200) is given
    blocks = cuda_engine(num_blocks=4096)
    assert with_kv_budget(blocks, QWEN3_8B, torch.bfloat16, H200) is blocks


def test_a_gpu_node_gets_its_share_less_the_weights_and_the_forwards_reserve():
    config = cuda_engine()
    reserve = forward_reserve_bytes(QWEN3_8B, config.scheduler, torch.bfloat16)
    # the reserve covers the largest forward (T = 8192 packed rows: ~1 GB of activations) and N rows of logits, each
    # ACTIVATION_COPIES times (the H100's measured peak, stop 47: ~6 GiB beside the weights and the KV cache)
    assert 4 * GIB < reserve < 8 * GIB
    budget = with_kv_budget(config, QWEN3_8B, torch.bfloat16, H200).cache.memory_budget_bytes
    assert budget == int(H200.total_bytes * 0.9) - H200.reserved_bytes - reserve
    assert 100 * GIB < budget < 112000 * MIB  # NOTE: the engine benchmarks ran at 112000 MiB
    lower = with_kv_budget(cuda_engine(gpu_memory_utilization=0.45), QWEN3_8B, torch.bfloat16, H200)
    assert lower.cache.memory_budget_bytes == budget - (int(H200.total_bytes * 0.9) - int(H200.total_bytes * 0.45))


def test_a_runner_with_piecewise_graphs_reserves_their_rows_once_more():
    """The engine's joined forwards (and mixed steps) replay piecewise graphs of up to 2048 rows beside the padded
    prefill's: their buffers and pool come on top, once (one set of 2048 rows of the 8B shape: ~0.23 GiB)."""
    sched = cuda_engine().scheduler
    plain = forward_reserve_bytes(QWEN3_8B, sched, torch.bfloat16)
    with_pieces = forward_reserve_bytes(QWEN3_8B, sched, torch.bfloat16, piecewise_rows=2048)
    assert 0.15 * GIB < with_pieces - plain < 0.35 * GIB
    budget = with_kv_budget(cuda_engine(), QWEN3_8B, torch.bfloat16, H200, piecewise_rows=2048)
    assert budget.cache.memory_budget_bytes == \
        with_kv_budget(cuda_engine(), QWEN3_8B, torch.bfloat16, H200).cache.memory_budget_bytes - (with_pieces - plain)


def test_nodes_sharing_a_gpu_split_what_it_holds_beside_each_one_s_weights_and_reserve():
    reserve = forward_reserve_bytes(QWEN3_8B, cuda_engine().scheduler, torch.bfloat16)
    prefill = with_kv_budget(cuda_engine(gpu_nodes=2, gpu_kv_share=0.25), QWEN3_8B, torch.bfloat16, H200)
    decode = with_kv_budget(cuda_engine(gpu_nodes=2, gpu_kv_share=0.75), QWEN3_8B, torch.bfloat16, H200)
    both = prefill.cache.memory_budget_bytes + decode.cache.memory_budget_bytes
    assert both + 2 * (H200.reserved_bytes + reserve) <= H200.total_bytes * 0.9  # NOTE: together, within the share
    assert decode.cache.memory_budget_bytes == pytest.approx(3 * prefill.cache.memory_budget_bytes, abs=2)
    assert 60 * GIB < decode.cache.memory_budget_bytes < 70 * GIB  # NOTE: 1P1D on an H200 ran 60000 and 16000 MiB


def test_a_node_never_takes_more_than_the_gpu_has_free():
    crowded = GpuMemory(H200.total_bytes, free_bytes=40 * GIB, reserved_bytes=H200.reserved_bytes)
    assert gpu_kv_budget(crowded, 0.9, 4 * GIB) == 36 * GIB
    assert gpu_kv_budget(H200, 0.9, 4 * GIB) < gpu_kv_budget(H200, 1.0, 4 * GIB) <= H200.free_bytes - 4 * GIB


def test_a_gpu_too_full_for_one_request_is_refused_with_the_flags_that_help():
    full = GpuMemory(H200.total_bytes, free_bytes=3 * GIB, reserved_bytes=H200.reserved_bytes)
    with pytest.raises(ValueError, match="--gpu-memory-utilization.*--kv-cache-mib"):
        with_kv_budget(cuda_engine(), QWEN3_8B, torch.bfloat16, full)
    just_enough = (cuda_engine().max_blocks_per_seq + 1) * bytes_per_block(QWEN3_8B, 16, torch.bfloat16)
    reserve = forward_reserve_bytes(QWEN3_8B, cuda_engine().scheduler, torch.bfloat16)
    fits = GpuMemory(H200.total_bytes, free_bytes=reserve + just_enough, reserved_bytes=H200.reserved_bytes)
    assert with_kv_budget(cuda_engine(), QWEN3_8B, torch.bfloat16, fits).cache.memory_budget_bytes == just_enough


def test_an_engine_without_a_budget_runs_the_cpu_one(tiny_model_dir):
    from corun.engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=tiny_model_dir, scheduler=SchedulerConfig(max_model_len=256)))
    assert engine.config.cache.memory_budget_bytes == CPU_KV_CACHE_BYTES
    assert engine.config.scheduler.max_num_seqs == 32
    assert engine.runner.kv_cache.num_blocks == CPU_KV_CACHE_BYTES // bytes_per_block(
        engine.runner.model.cfg, 16, torch.float32)


def test_a_small_model_takes_twice_what_n_requests_of_max_model_len_hold_and_leaves_the_rest():
    tiny = preset_config("random:qwen3-tiny")
    config = EngineConfig(model="random:qwen3-tiny", device="cuda", dtype="bfloat16",
                          scheduler=SchedulerConfig(max_num_seqs=64, max_model_len=512)).resolved(large_gpu=True)
    block = bytes_per_block(tiny, 16, torch.bfloat16)
    small = GpuMemory(H200.total_bytes, free_bytes=H200.total_bytes - GIB, reserved_bytes=64 * MIB)
    budget = with_kv_budget(config, tiny, torch.bfloat16, small).cache.memory_budget_bytes
    assert budget == (2 * 64 * 32 + 1) * block < GIB  # NOTE: 64 rows of 32 blocks, twice, and the null block
    # the inverse: a model whose KV the GPU cannot hold twice over is not capped (the 8B above)
    reserve = forward_reserve_bytes(QWEN3_8B, cuda_engine().scheduler, torch.bfloat16)
    assert with_kv_budget(cuda_engine(), QWEN3_8B, torch.bfloat16, H200).cache.memory_budget_bytes == \
        gpu_kv_budget(H200, 0.9, reserve)


def test_the_engine_reads_its_checkpoint_s_dtype_for_auto(tiny_model_dir):
    from corun.device_facts import resolved_on_device
    from corun.models.config import checkpoint_dtype

    assert checkpoint_dtype(tiny_model_dir) == "float32" and checkpoint_dtype("random:qwen3-8b") is None
    assert resolved_on_device(EngineConfig(model=tiny_model_dir)).dtype == "float32"
    assert resolved_on_device(EngineConfig(model=tiny_model_dir, device="cuda")).dtype == "bfloat16"
    assert resolved_on_device(EngineConfig(model=tiny_model_dir, device="cuda", dtype="float32")).dtype == "float32"


def test_llm_takes_the_kv_cache_by_vllm_s_names(tiny_model_dir):
    from corun import LLM

    llm = LLM(tiny_model_dir, max_model_len=256, kv_cache_memory_bytes=8 * MIB, gpu_memory_utilization=0.5)
    assert llm.engine.config.cache.memory_budget_bytes == 8 * MIB
    assert llm.engine.config.cache.gpu_memory_utilization == 0.5
    assert llm.engine.runner.kv_cache.num_blocks == 8 * MIB // bytes_per_block(llm.engine.runner.model.cfg, 16,
                                                                               torch.float32)
