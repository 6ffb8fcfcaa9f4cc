"""A node's start-up lines about its KV cache (node_core/serving.py kv_cache_lines): what it holds, as vLLM logs it,
and a warning where a GPU node runs a budget sized for a CPU."""

from node_core.serving import kv_cache_lines
from wire.config import MIB, CacheConfig, EngineConfig, SchedulerConfig


def engine(device: str, **cache) -> EngineConfig:
    return EngineConfig(model="m", device=device, cache=CacheConfig(**cache),
                        scheduler=SchedulerConfig(max_num_seqs=8, max_model_len=512))


def test_the_capacity_line_counts_tokens_and_requests_of_max_model_len():
    capacity, warning = kv_cache_lines(engine("cpu"), 128)
    assert "128 blocks of 16 tokens = 2048 tokens" in capacity and "4.00x max_model_len (512)" in capacity
    assert "8 decode rows" in capacity and warning is None


def test_only_a_gpu_node_on_the_cpu_sized_default_budget_is_warned():
    assert "--kv-cache-mib" in kv_cache_lines(engine("cuda"), 128)[1]
    assert "--kv-cache-mib" in kv_cache_lines(engine("cuda:1"), 128)[1]
    assert kv_cache_lines(engine("cuda", memory_budget_bytes=60000 * MIB), 128)[1] is None
    assert kv_cache_lines(engine("cuda", num_blocks=4096), 4095)[1] is None
    assert kv_cache_lines(engine("cpu"), 128)[1] is None
