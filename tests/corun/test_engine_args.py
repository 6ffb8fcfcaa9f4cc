"""Engine flags: the argv the launchers pass to node processes rebuilds the same EngineConfig."""

import argparse
import dataclasses

import pytest

from wire.config import CacheConfig, EngineConfig, SchedulerConfig
from wire.engine_args import add_engine_args, engine_args_to_argv, engine_config_from_args, parse_buckets


@pytest.mark.parametrize("scheduler", [
    SchedulerConfig(),
    SchedulerConfig(prefill_buckets=(16, 32, 64), decode_step_sizes=(8, 16), prefill_token_budget=128),
    SchedulerConfig(prefill_chunk_size=256, prefill_pack_tokens=1024, prefill_pack_seqs=8),
])
def test_argv_round_trips_the_config(scheduler):
    config = EngineConfig(model="m", num_threads=2, scheduler=scheduler, cache=CacheConfig(num_blocks=99))
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_config_from_args(parser.parse_args(engine_args_to_argv(config))) == config


def test_bucket_lists_parse_or_fail_clearly():
    assert parse_buckets("none") == () and parse_buckets("4/8,16") == (4, 8, 16)
    assert parse_buckets("default")[0] == 16
    with pytest.raises(ValueError, match="comma-separated sizes"):
        parse_buckets("16,big")


def test_flag_defaults_are_the_config_defaults(tiny_model_dir):
    """One definition of each default: the flags and the offline API's keywords take the dataclasses'."""
    from corun import LLM

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_config_from_args(parser.parse_args(["--model", tiny_model_dir])) == EngineConfig(model=tiny_model_dir)
    assert LLM(tiny_model_dir).config == EngineConfig(model=tiny_model_dir)


def test_every_config_field_has_exactly_one_flag():
    """A field added to the engine's config without a flag would silently take its default in node processes."""
    from wire.engine_args import ENGINE_FLAGS

    flagged = sorted(flag.field for flag in ENGINE_FLAGS)  # NOTE: --model and --cuda-graph are in the table now
    sections = {"scheduler": SchedulerConfig, "cache": CacheConfig}
    fields = [f"{section}.{f.name}" for section, owner in sections.items() for f in dataclasses.fields(owner)]
    fields += [f.name for f in dataclasses.fields(EngineConfig) if f.name not in sections]
    assert sorted(flagged) == sorted(fields)


def test_a_non_default_value_of_every_flag_reaches_the_config():
    config = EngineConfig(model="m", dtype="bfloat16", device="cuda:1", seed=7, max_logprobs=5, use_cuda_graph=False,
                          num_threads=3, cache=CacheConfig(block_size=32, num_blocks=7, memory_budget_bytes=3 * 2**20),
                          scheduler=SchedulerConfig(mode="mixed", max_num_seqs=9, max_model_len=99,
                                                    prefill_chunk_size=33, max_num_batched_tokens=77,
                                                    prefill_buckets=(8,), decode_step_sizes=(4,),
                                                    prefill_token_budget=5, prefill_pack_seqs=3))
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    rebuilt = engine_config_from_args(parser.parse_args(engine_args_to_argv(config)))
    assert rebuilt == config and rebuilt != EngineConfig(model="m")


def test_transfer_flags_round_trip_and_reach_the_node_argv():
    from launch.cluster import ClusterConfig, node_argv
    from wire.config import TransferConfig
    from wire.engine_args import add_transfer_args, transfer_args_to_argv, transfer_config_from_args

    parser = argparse.ArgumentParser()
    add_transfer_args(parser)
    assert transfer_config_from_args(parser.parse_args([])) == TransferConfig()
    config = TransferConfig(cuda_ipc_get_zcopy="auto", ucx_transports=("cuda_ipc", "rc"), ucx_devices=("mlx5_0:1",),
                            ucx_error_handling="peer", progress_thread="on", min_vram_read_gbps=5.5,
                            allow_slow_reads=True)
    assert transfer_config_from_args(parser.parse_args(transfer_args_to_argv(config))) == config != TransferConfig()
    argv = node_argv(ClusterConfig(EngineConfig(model="m"), transfer=config), EngineConfig(model="m"), "decode", 0,
                     "127.0.0.1", 1)
    assert argv[argv.index("--kv-ucx-transports") + 1] == "cuda_ipc,rc" and "--kv-allow-slow-reads" in argv


def test_ucx_settings_come_from_the_config_alone():
    from wire.config import TransferConfig

    assert TransferConfig().ucx_environment(vram=True) == {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"}
    assert TransferConfig().ucx_environment(vram=False) == {}  # NOTE: a CPU-only UCX warns about the CUDA one
    assert TransferConfig(cuda_ipc_get_zcopy="auto", ucx_transports=("sm", "self")).ucx_environment(vram=True) == {
        "UCX_TLS": "sm,self"}
    with pytest.raises(ValueError, match="cuda_ipc_get_zcopy"):
        TransferConfig(cuda_ipc_get_zcopy="yes")
