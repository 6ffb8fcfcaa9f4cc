"""Engine flags: the argv the launchers pass to node processes rebuilds the same EngineConfig."""

import argparse

import pytest

from corun.config import CacheConfig, EngineConfig, SchedulerConfig
from corun.engine_args import add_engine_args, engine_args_to_argv, engine_config_from_args, parse_buckets


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
