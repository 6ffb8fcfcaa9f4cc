"""A node's start-up line about its KV cache (node_core/serving.py kv_cache_line): what it holds, as vLLM logs it."""

from node_core.serving import kv_cache_line
from wire.config import EngineConfig, SchedulerConfig


def test_the_capacity_line_counts_tokens_requests_of_max_model_len_and_decode_rows():
    config = EngineConfig(model="m", scheduler=SchedulerConfig(max_num_seqs=8, max_model_len=512)).resolved()
    capacity = kv_cache_line(config, 128)
    assert "128 blocks of 16 tokens = 2048 tokens" in capacity and "4.00x max_model_len (512)" in capacity
    assert "8 decode rows" in capacity
    assert "32 decode rows" in kv_cache_line(EngineConfig(model="m").resolved(), 128)  # NOTE: N auto, CPU's


def test_the_line_says_when_requests_are_limited_below_the_model_s_context():
    """--max-model-len does not follow the model (vLLM's does): the line says so where the model is made for more.
    Inverse: not where the limit is the model's own context."""
    config = EngineConfig(model="m", scheduler=SchedulerConfig(max_model_len=1024)).resolved()
    assert "limited to 1024 tokens of the model's 40960 (--max-model-len)" in kv_cache_line(config, 128, 40960)
    assert "limited to" not in kv_cache_line(config, 128, 1024)
    assert "limited to" not in kv_cache_line(config, 128, None)
