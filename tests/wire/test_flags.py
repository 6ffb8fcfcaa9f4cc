"""Command lines generated from the config dataclasses (wire/flags.py): each field is a flag with its docstring as
help and its default; config -> argv -> parse gives the same config back, for every config class the programs
parse; a field added to a config is a flag; and the round-trip comparison does catch a field that is lost."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

import pytest

from wire.config import (
    AUTO,
    MIB,
    CacheConfig,
    EngineConfig,
    NodeConfig,
    RouterConfig,
    SchedulerConfig,
    SharedWeightsConfig,
    TransferConfig,
)
from wire.flags import (
    NOT_A_FLAG,
    add_flags,
    config_argv,
    config_environment,
    config_flags,
    config_from_args,
    field_docs,
    flag,
)

TRANSFER = TransferConfig(transport="fake", cuda_ipc_get_zcopy="auto", ucx_transports=("cuda_ipc", "rc"),
                          ucx_devices=("mlx5_0:1",),
                          ucx_error_handling="peer", progress_thread="on", min_vram_read_gbps=5.5,
                          allow_slow_reads=True, copy_on_gpu=False)
PACKED = SchedulerConfig(mode="mixed", max_num_seqs=9, max_model_len=99, prefill_chunk_size=33,
                         max_num_batched_tokens=77, prefill_buckets=(), prefill_pack_tokens=64, prefill_pack_seqs=3,
                         prefill_pack_sizes=(16, 48), decode_step_sizes=(4, 8), prefill_token_budget=5,
                         piecewise_graphs=False, async_scheduling=False, decode_kv_split_tokens=128,
                         decode_rides_prefill=False, multi_chunk_prefill=False)
BUCKETED = dataclasses.replace(PACKED, prefill_buckets=(8, 16), prefill_pack_tokens=0, prefill_pack_sizes="auto")
"""NOTE: buckets and packing exclude each other: one of the two configs sets each."""
ENGINES = [EngineConfig(model="m", dtype="bfloat16", device="cuda:1", seed=7, max_logprobs=5, use_cuda_graph=False,
                        cublas_split_k=True, num_threads=3, scheduler=scheduler, backend="vllm",
                        cache=CacheConfig(block_size=32, num_blocks=7, memory_budget_bytes=3 * MIB,
                                          gpu_memory_utilization=0.45, gpu_nodes=3, gpu_kv_share=0.2,
                                          swap_space_bytes=5 * MIB, enable_prefix_caching=False))
           for scheduler in (PACKED, BUCKETED)]
NODES = [NodeConfig(role="decode", node_id="decode-3", engine=engine, host="0.0.0.0", port=7001,
                    advertise_host="10.0.0.2", cluster_key_file="/keys/cluster.key", kv_lease_seconds=2.5,
                    transfer=TRANSFER, supervisor_pid=4321, log_prefill_batches=True,
                    weights=SharedWeightsConfig(holding="import", rendezvous="/private/w.msgpack", wait_s=9.5))
         for engine in ENGINES]
ROUTERS = [RouterConfig(model="m", prefill_addresses=("tcp://p:1", "tcp://p:2"), decode_addresses=("tcp://d:1",),
                        colocated_addresses=("tcp://c:1",), base_seed=7, cluster_key_file="/keys/cluster.key",
                        reuse_port=True, control_port=9001, metrics_dir="/tmp/metrics", instance_name="r1",
                        served_model_name="served", host="0.0.0.0", port=9000, max_pending_requests=5,
                        request_timeout_s=1.5, strict_fields=True, trust_request_chat_template=True,
                        api_key="secret-key", enable_node_pinning=True, enable_tokenizer_info_endpoint=True,
                        max_request_bytes=1000, header_timeout_s=2.5, body_timeout_s=3.5, parse_timeout_s=4.5,
                        listen_backlog=64,
                        client_api_keys_file="/keys/clients", max_client_requests=6, max_client_decode_slots=7,
                        max_client_queued_requests=8, supervisor_pid=1234, routing_policy="prefix_aware",
                        enable_prompt_tokens_details=True)]


def assert_every_field_set(config_class: type, configs: list, unset: tuple[str, ...] = ()) -> None:
    """Every field of config_class (nested ones included) differs from its default in one of configs, so that a
    round trip of configs tests every flag; unset: fields none of them can set (with the reason, at the call)."""
    never = [flag.field for flag in config_flags(config_class)
             if all(flag.value_in(config) == flag.default for config in configs)]
    assert never == list(unset), f"fields left at their default: {never}"


def round_trip(config, **given):
    """config -> its argv (and environment) -> a parser made from its class -> the config parsed."""
    parser = argparse.ArgumentParser()
    add_flags(parser, type(config))
    return config_from_args(type(config), parser.parse_args(config_argv(config)), config_environment(config),
                            **given)


@pytest.mark.parametrize("configs, given", [
    (ENGINES, {}), ([TRANSFER], {}), (NODES, {"role": "decode"}), (ROUTERS, {}),
], ids=["EngineConfig", "TransferConfig", "NodeConfig", "RouterConfig"])
def test_config_to_argv_to_config_is_the_same_config_with_every_field_set(configs, given):
    assert_every_field_set(type(configs[0]), configs)
    for config in configs:
        assert round_trip(config, **given) == config


def test_defaults_are_the_dataclass_defaults_and_auto_travels_as_asked():
    parser = argparse.ArgumentParser()
    add_flags(parser, EngineConfig)
    assert config_from_args(EngineConfig, parser.parse_args(["--model", "m"])) == EngineConfig(model="m")
    argv = config_argv(EngineConfig(model="m"))
    assert argv[argv.index("--prefill-buckets") + 1] == AUTO and "--kv-cache-mib" not in argv  # NOTE: None: auto


CONFIGS = [EngineConfig, SchedulerConfig, CacheConfig, TransferConfig, NodeConfig, RouterConfig]


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda cls: cls.__name__)
def test_every_field_has_a_docstring_and_it_is_the_flag_s_help(config_class):
    undocumented = [f.name for f in dataclasses.fields(config_class) if not field_docs(config_class).get(f.name)]
    assert undocumented == []
    parser = argparse.ArgumentParser()
    for each in add_flags(parser, config_class):
        assert each.help and each.help == field_docs(each.owner).get(each.path[-1]), each.field
    helps = {action.dest: action.help for action in parser._actions}
    assert all(helps[each.dest].replace("%%", "%").startswith(each.help) for each in config_flags(config_class)
               if each.spec.is_flag)


def test_router_flags_keep_their_spellings():
    """The flag names the README and the launchers use."""
    options = {each.option for each in config_flags(RouterConfig) if each.spec.is_flag}
    assert {"--model", "--prefill-address", "--decode-address", "--colocated-address", "--port", "--host",
            "--served-model-name", "--max-pending-requests", "--strict-fields", "--trust-request-chat-template",
            "--api-key", "--enable-node-pinning", "--enable-tokenizer-info-endpoint",
            "--cluster-key-file", "--max-request-bytes", "--header-timeout-s", "--body-timeout-s", "--reuse-port",
            "--control-port", "--instance-name", "--base-seed", "--request-timeout-s", "--parse-timeout-s",
            "--client-api-keys-file", "--max-client-requests", "--max-client-decode-slots",
            "--max-client-queued-requests", "--supervisor-pid", "--routing-policy",
            "--enable-prompt-tokens-details", "--listen-backlog"} == options
    argv = config_argv(ROUTERS[0])
    assert "secret-key" not in argv and "/tmp/metrics" not in argv  # NOTE: they travel in the environment
    assert config_environment(ROUTERS[0]) == {"VLLM_API_KEY": "secret-key", "PROMETHEUS_MULTIPROC_DIR": "/tmp/metrics"}


# -- the mechanism, on small dataclasses ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Before:
    name: str
    """The name."""
    count: int = 3
    """How many."""


@dataclass(frozen=True)
class After:
    """Before with one field more: what adding an option to a config is."""

    name: str
    """The name."""
    count: int = 3
    """How many."""
    ratio_limit: float = 0.5
    """A new option, written once: here."""


def test_adding_a_field_adds_a_flag_with_its_help_default_and_argv():
    added = {each.option for each in config_flags(After)} - {each.option for each in config_flags(Before)}
    assert added == {"--ratio-limit"}
    parser = argparse.ArgumentParser()
    add_flags(parser, After)
    assert config_from_args(After, parser.parse_args(["--name", "x"])) == After("x")
    assert config_from_args(After, parser.parse_args(["--name", "x", "--ratio-limit", "2"])).ratio_limit == 2.0
    helps = {action.dest: action.help for action in parser._actions}
    assert helps["ratio_limit"] == "A new option, written once: here. (default: 0.5)"
    assert config_argv(After("x", ratio_limit=0.25))[-2:] == ["--ratio-limit", "0.25"]
    assert round_trip(After("y", 9, 1.75)) == After("y", 9, 1.75)


@dataclass(frozen=True)
class Spellings:
    switch: bool = False
    """--switch / --no-switch."""
    on_by_default: bool = True
    """--no-on-by-default turns it off."""
    names: tuple[str, ...] = ("a", "b")
    """Comma-separated."""
    sizes: tuple[int, ...] = ()
    """Comma-separated ints; 'none': empty."""
    maybe: int | None = None
    """Left out of argv when None."""
    choice: str = field(default="x", metadata=flag("--pick"))
    """Another name."""
    bytes_: int = field(default=4 * MIB, metadata=flag("--mib", scale=MIB))
    """A unit."""
    items: tuple[str, ...] = field(default=(), metadata=flag("--item", repeat=True))
    """Once per element."""
    program_sets: str = field(default="p", metadata=NOT_A_FLAG)
    """No flag."""


def test_each_type_s_spelling_round_trips():
    parser = argparse.ArgumentParser()
    add_flags(parser, Spellings)
    assert config_from_args(Spellings, parser.parse_args([])) == Spellings()
    odd = Spellings(switch=True, on_by_default=False, names=(), sizes=(1, 2), maybe=0, choice="y", bytes_=MIB,
                    items=("i", "j"))
    argv = config_argv(odd)
    assert argv == ["--switch", "--no-on-by-default", "--names", "none", "--sizes", "1,2", "--maybe", "0",
                    "--pick", "y", "--mib", "1", "--item", "i", "--item", "j"]
    assert config_from_args(Spellings, parser.parse_args(argv)) == odd
    assert "--maybe" not in config_argv(Spellings())
    with pytest.raises(ValueError, match="not a whole number of --mib units"):
        config_argv(Spellings(bytes_=MIB + 1))
    with pytest.raises(SystemExit):
        parser.parse_args(["--program-sets", "q"])


def test_the_environment_is_a_fallback_that_the_flag_beats():
    @dataclass(frozen=True)
    class Keyed:
        key: str | None = field(default=None, metadata=flag(environment="TEST_KEY"))

    parser = argparse.ArgumentParser()
    add_flags(parser, Keyed)
    assert config_from_args(Keyed, parser.parse_args([]), {"TEST_KEY": "env"}).key == "env"
    assert config_from_args(Keyed, parser.parse_args(["--key", "flag"]), {"TEST_KEY": "env"}).key == "flag"
    assert config_from_args(Keyed, parser.parse_args([]), {"TEST_KEY": ""}).key is None  # NOTE: empty = unset
    assert config_argv(Keyed("k")) == [] and config_environment(Keyed("k")) == {"TEST_KEY": "k"}


def test_a_type_without_a_spelling_or_a_default_none_cannot_have_is_refused():
    @dataclass(frozen=True)
    class Unspellable:
        table: dict = field(default_factory=dict)

    @dataclass(frozen=True)
    class OptionalWithDefault:
        limit: int | None = 5

    with pytest.raises(TypeError, match="no command-line spelling"):
        config_flags(Unspellable)
    with pytest.raises(TypeError, match="default must be None"):
        config_flags(OptionalWithDefault)


# -- inverse: the round-trip comparison does catch a lost field ----------------------------------------------------


def test_a_dropped_field_fails_the_round_trip():
    """Drop one field's flag from the argv (a launcher that forgets it): the parsed config differs, for each field
    of a config with every field set; and a field that is not a flag cannot round trip."""
    config = ENGINES[0]
    parser = argparse.ArgumentParser()
    add_flags(parser, EngineConfig)
    argv = config_argv(config)
    for each in config_flags(EngineConfig):
        if each.required:
            continue
        at = argv.index(each.negative if each.is_bool and not each.value_in(config) else each.option)
        dropped = argv[:at] + argv[at + (1 if each.is_bool else 2):]
        try:
            assert config_from_args(EngineConfig, parser.parse_args(dropped)) != config, each.field
        except ValueError:
            pass  # NOTE: the default does not even fit the other fields (prefill_chunk_size above the packing)
    lossy = Spellings(program_sets="q")
    assert round_trip(lossy) != lossy and round_trip(lossy, program_sets="q") == lossy


def test_a_config_left_at_a_default_is_caught_by_the_every_field_check():
    with pytest.raises(AssertionError, match="scheduler.max_num_seqs"):
        assert_every_field_set(EngineConfig, [dataclasses.replace(ENGINES[0], scheduler=dataclasses.replace(
            PACKED, max_num_seqs=SchedulerConfig.max_num_seqs, decode_step_sizes=()))])
