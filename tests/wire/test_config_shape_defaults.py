"""The 'auto' shape settings: one resolution per device, explicit values kept, resolved values in the fingerprint."""

import argparse

import pytest

from wire.config import (
    AUTO,
    CPU_DECODE_SIZE_CANDIDATES,
    CPU_MAX_NUM_SEQS,
    DECODE_TILE_TOKENS,
    DEFAULT_BATCHED_TOKENS,
    DEFAULT_PREFILL_BUCKETS,
    DEFAULT_PREFILL_CHUNK,
    GPU_MAX_NUM_SEQS,
    LARGE_GPU_BATCHED_TOKENS,
    PACK_SIZE_LADDER,
    SMALL_PREFILL_CHUNK,
    EngineConfig,
    SchedulerConfig,
    auto_decode_step_candidates,
    auto_pack_size_candidates,
    resolve_dtype,
    resolve_shape_defaults,
)
from wire.engine_args import add_engine_args, engine_args_to_argv, engine_config_from_args


def resolved(device="cuda", use_cuda_graph=True, backend="native", **scheduler) -> SchedulerConfig:
    return resolve_shape_defaults(SchedulerConfig(**scheduler), device, use_cuda_graph, backend)


def test_defaults_are_auto_and_the_budget_bounds_prefill():
    sched = SchedulerConfig()
    assert (sched.prefill_buckets, sched.decode_step_sizes) == (AUTO, AUTO) and not sched.is_resolved
    assert sched.prefill_pack_tokens is None and sched.prefill_pack_sizes == AUTO
    assert sched.prefill_token_budget is None  # NOTE: auto, one mixed step's token budget
    assert sched.max_num_batched_tokens is None  # NOTE: auto, by device
    assert resolved().decode_wait_tokens == resolved().max_num_batched_tokens > 0
    assert resolved(max_num_batched_tokens=8192).prefill_token_budget == 8192
    assert resolved(max_num_batched_tokens=8192, prefill_token_budget=0).prefill_token_budget == 0


def test_cuda_gets_packed_prefill_at_the_batch_token_budget_with_pack_and_decode_candidates():
    sched = resolved(max_num_seqs=256, prefill_chunk_size=4096, max_num_batched_tokens=8192, max_model_len=6144)
    assert (sched.prefill_pack_tokens, sched.prefill_buckets) == (8192, ())
    assert sched.prefill_pack_sizes == auto_pack_size_candidates(8192)
    assert sched.decode_step_sizes == (1, 2, 4, 8) + tuple(range(16, 256, 16))  # NOTE: mixed mode's graph sizes
    assert resolved(prefill_chunk_size=4096, max_num_batched_tokens=2048).prefill_pack_tokens == 4096  # NOTE: >= chunk


def test_the_batch_token_budget_is_vllm_s_for_the_device():
    # NOTE: a large GPU (H100, H200) gets 8192, as vLLM's API server sets it there; everything else 2048; the packed
    # forward's rows and the prefill token budget follow it, and an explicit value is kept
    def on(device, large_gpu, **scheduler):
        return resolve_shape_defaults(SchedulerConfig(**scheduler), device, True, "native", large_gpu)

    large = on("cuda", True)
    assert large.max_num_batched_tokens == large.prefill_pack_tokens == large.prefill_token_budget == \
        LARGE_GPU_BATCHED_TOKENS == 8192
    assert on("cuda", True, mode="mixed").max_num_batched_tokens == LARGE_GPU_BATCHED_TOKENS
    small = on("cuda", False)
    assert small.max_num_batched_tokens == small.prefill_pack_tokens == DEFAULT_BATCHED_TOKENS == 2048
    assert on("cpu", True).max_num_batched_tokens == DEFAULT_BATCHED_TOKENS  # NOTE: a GPU's fact, never a CPU's
    assert on("cuda", True, max_num_batched_tokens=4096).max_num_batched_tokens == 4096
    config = EngineConfig(model="m", device="cuda")
    assert config.resolved(large_gpu=True).scheduler.max_num_batched_tokens == LARGE_GPU_BATCHED_TOKENS
    assert config.scheduler.max_num_batched_tokens is None  # NOTE: the config as asked keeps auto


def test_cuda_gets_buckets_up_to_the_chunk_size_when_packing_is_off():
    sched = resolved(max_num_seqs=256, prefill_chunk_size=512, max_model_len=4096, prefill_pack_tokens=0)
    assert sched.prefill_buckets == (16, 32, 64, 128, 256, 384, 512) and sched.prefill_pack_sizes == ()
    assert resolved(prefill_chunk_size=4096, max_model_len=6144, prefill_pack_tokens=0).prefill_buckets == \
        DEFAULT_PREFILL_BUCKETS
    assert resolved(prefill_chunk_size=500, max_model_len=6144, prefill_pack_tokens=0).prefill_buckets[-1] == 512
    assert resolved(prefill_buckets=(16, 32)).prefill_pack_tokens == 0  # NOTE: buckets asked for: isolated


def test_the_chunk_is_small_only_where_a_prompt_runs_several_chunks_per_forward():
    assert SchedulerConfig().prefill_chunk_size is None  # NOTE: auto
    assert resolved().prefill_chunk_size == SMALL_PREFILL_CHUNK
    assert resolved(max_num_batched_tokens=16).prefill_chunk_size == 16  # NOTE: never above the pack's rows
    one_per_forward = (resolved(multi_chunk_prefill=False), resolved(prefill_pack_tokens=0), resolved(device="cpu"),
                       resolved(use_cuda_graph=False), resolved(mode="mixed"), resolved(backend="vllm"))
    assert {sched.prefill_chunk_size for sched in one_per_forward} == {DEFAULT_PREFILL_CHUNK}
    assert resolved(prefill_chunk_size=512).prefill_chunk_size == 512
    assert resolved(prefill_chunk_size=512).prefill_pack_tokens == 2048
    assert SMALL_PREFILL_CHUNK % 16 == DEFAULT_PREFILL_CHUNK % 16 == 0  # NOTE: whole KV blocks, for the prefix cache


def test_no_graphs_other_modes_and_the_vllm_engine_get_the_papers_shapes():
    for sched in (resolved(use_cuda_graph=False), resolved(mode="mixed"), resolved(backend="vllm"),
                  resolved(device="cpu", mode="mixed")):
        assert (sched.prefill_buckets, sched.decode_step_sizes, sched.prefill_pack_tokens) == ((), (), 0)


def test_cpu_prefills_at_natural_length_and_tries_the_small_decode_sizes_below_n():
    sched = resolved(device="cpu")
    assert (sched.prefill_buckets, sched.prefill_pack_tokens) == ((), 0)
    assert sched.decode_step_sizes == tuple(s for s in CPU_DECODE_SIZE_CANDIDATES if s < sched.max_num_seqs)
    assert resolved(device="cpu", max_num_seqs=4).decode_step_sizes == (1, 2)


def test_packed_prefill_takes_no_buckets_but_keeps_decode_candidates():
    sched = resolved(max_num_seqs=64, prefill_pack_tokens=2048, prefill_chunk_size=512)
    assert sched.prefill_buckets == () and sched.decode_step_sizes == auto_decode_step_candidates(64)


def test_pack_size_candidates_resolve_below_t_on_cuda_only():
    sched = resolved(max_num_seqs=256, prefill_pack_tokens=8192, prefill_chunk_size=4096)
    assert sched.prefill_pack_sizes == auto_pack_size_candidates(8192)
    assert sched.prefill_pack_sizes[0] == PACK_SIZE_LADDER[0] and max(sched.prefill_pack_sizes) < 8192
    assert resolved(prefill_pack_tokens=2048, device="cpu").prefill_pack_sizes == ()
    assert resolved(prefill_pack_tokens=0).prefill_pack_sizes == ()  # NOTE: no packed prefill, nothing to try
    assert resolved(prefill_pack_tokens=2048, prefill_pack_sizes=(512,)).prefill_pack_sizes == (512,)


def test_explicit_values_are_kept():
    sched = resolved(prefill_buckets=(), decode_step_sizes=(8,), max_num_seqs=16)
    assert (sched.prefill_buckets, sched.decode_step_sizes) == ((), (8,))
    assert resolved(device="cpu", prefill_buckets=(16, 32)).prefill_buckets == (16, 32)


@pytest.mark.parametrize("max_num_seqs", [1, 2, 16, 17, 100, 256, 512])
def test_decode_candidates_are_valid_sizes_below_n(max_num_seqs):
    candidates = auto_decode_step_candidates(max_num_seqs)
    SchedulerConfig(max_num_seqs=max_num_seqs, decode_step_sizes=candidates)  # NOTE: validates them
    assert all(size < max_num_seqs for size in candidates)


def test_auto_travels_to_node_processes_as_asked_and_resolves_there():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    config = engine_config_from_args(parser.parse_args(["--model", "m", "--device", "cuda"]))
    argv = engine_args_to_argv(config)
    assert argv[argv.index("--prefill-buckets") + 1] == "auto"
    again = engine_config_from_args(parser.parse_args(argv))
    assert again == config and again.resolved().scheduler.is_resolved


def test_the_fingerprint_hashes_the_resolved_shapes(tiny_model_dir):
    from node_core.serving import engine_fingerprint

    auto = EngineConfig(model=tiny_model_dir)
    cpu_sizes = tuple(s for s in CPU_DECODE_SIZE_CANDIDATES if s < CPU_MAX_NUM_SEQS)
    explicit = EngineConfig(model=tiny_model_dir, scheduler=SchedulerConfig(prefill_buckets=(),
                                                                            decode_step_sizes=cpu_sizes))
    assert engine_fingerprint(auto.resolved(), "d") == engine_fingerprint(explicit.resolved(), "d")
    bucketed = EngineConfig(model=tiny_model_dir, scheduler=SchedulerConfig(prefill_buckets=(16,)))
    assert engine_fingerprint(bucketed.resolved(), "d") != engine_fingerprint(auto.resolved(), "d")


@pytest.mark.parametrize("tokens", [-DECODE_TILE_TOKENS, 100, DECODE_TILE_TOKENS // 2, DECODE_TILE_TOKENS + 64])
def test_decode_kv_split_tokens_must_be_whole_kernel_tiles(tokens):
    with pytest.raises(ValueError, match=f"decode_kv_split_tokens must be a multiple of {DECODE_TILE_TOKENS}"):
        SchedulerConfig(decode_kv_split_tokens=tokens)
    assert SchedulerConfig(decode_kv_split_tokens=0).decode_kv_split_tokens == 0  # NOTE: off, the default


def test_n_is_auto_by_device_and_explicit_sizes_are_checked_against_the_resolved_n():
    assert SchedulerConfig().max_num_seqs is None
    assert resolved().max_num_seqs == GPU_MAX_NUM_SEQS and resolved("cpu").max_num_seqs == CPU_MAX_NUM_SEQS
    assert resolved(max_num_seqs=8).max_num_seqs == 8 and resolved("cpu", max_num_seqs=64).max_num_seqs == 64
    assert resolved().decode_step_sizes == auto_decode_step_candidates(GPU_MAX_NUM_SEQS)
    assert resolved(decode_step_sizes=(64,)).decode_step_sizes == (64,)
    with pytest.raises(ValueError, match="decode_step_sizes"):
        resolved("cpu", decode_step_sizes=(64,))  # NOTE: at or above the CPU's N


def test_dtype_auto_is_float32_on_cpu_and_the_checkpoint_s_half_precision_on_cuda():
    assert EngineConfig(model="m").dtype == AUTO
    assert resolve_dtype(AUTO, "cpu", "bfloat16") == "float32"
    assert resolve_dtype(AUTO, "cuda", "float16") == "float16"
    assert resolve_dtype(AUTO, "cuda:1", "bfloat16") == "bfloat16"
    assert resolve_dtype(AUTO, "cuda", "float32") == resolve_dtype(AUTO, "cuda", None) == "bfloat16"
    assert resolve_dtype("float32", "cuda", "bfloat16") == "float32"  # NOTE: explicit values are kept
    assert resolve_dtype(AUTO, "cuda", "bfloat16", bfloat16_supported=False) == "float16"  # NOTE: a T4, a V100
    assert resolve_dtype(AUTO, "cuda", None, bfloat16_supported=False) == "float16"
    assert EngineConfig(model="m", device="cuda").resolved(checkpoint_dtype="float16").dtype == "float16"
    with pytest.raises(ValueError, match="dtype must be auto"):
        EngineConfig(model="m", dtype="fp8")


@pytest.mark.parametrize("value", [0, -3])
@pytest.mark.parametrize("name", ["max_num_seqs", "max_model_len", "prefill_pack_seqs", "max_num_batched_tokens",
                                  "prefill_chunk_size"])
def test_a_size_below_1_is_refused_and_0_is_not_auto(name, value):
    """max_num_seqs 0 once passed as auto (the cluster started, and refused every request), max_model_len 0 crashed
    the nodes (a division by it): only None is auto."""
    with pytest.raises(ValueError, match=f"^{name} must be >= 1, got {value}$"):
        SchedulerConfig(**{name: value})


@pytest.mark.parametrize("flag, name", [("--max-num-seqs", "max_num_seqs"), ("--max-model-len", "max_model_len")])
def test_the_flags_and_llm_refuse_0_by_the_config_s_rule(tiny_model_dir, flag, name):
    """`corun bench`, `corun generate`, `corun serve` and the nodes build their engine's config from these flags."""
    from corun.llm import LLM

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    with pytest.raises(ValueError, match=f"^{name} must be >= 1, got 0$"):
        engine_config_from_args(parser.parse_args(["--model", tiny_model_dir, flag, "0"]))
    with pytest.raises(ValueError, match=f"^{name} must be >= 1, got 0$"):
        LLM(tiny_model_dir, **{name: 0})
