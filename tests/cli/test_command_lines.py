"""The programs' command lines, generated from their configs: what a launcher passes a child process (argv and
environment) rebuilds the config it started from, through that program's own parser, for the router, the nodes
and `corun serve` (local and Ray); every flag's help is its field's docstring; the README's flags all exist."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import build_parser
from cli.serve import cluster_config_from_args, ray_config_from_args
from launch import cluster as launch
from launch.cluster import ClusterConfig
from launch.ray_config import RayClusterConfig
from launch.routers import one_of_several
from node_core.serving import node_arg_parser
from router.__main__ import parse_config
from tests.wire.test_flags import ENGINES, NODES, ROUTERS, TRANSFER, assert_every_field_set
from wire.config import EngineConfig, NodeConfig, RouterConfig
from wire.flags import config_argv, config_environment, config_flags, config_from_args, field_docs, parse_port

ROOT = Path(__file__).resolve().parent.parent.parent
CUDA = dataclasses.replace(ENGINES[0], device="cuda", backend="native")
"""NOTE: colocated servers and Ray nodes need the native engine, GPU lists device cuda (on Ray 'cuda' itself)."""
ROUTER_SETTINGS = dict(served_model_name="served", host="0.0.0.0", port=9000, max_pending_requests=5,
                       request_timeout_s=1.5, strict_fields=True, trust_request_chat_template=True,
                       api_key="secret-key", enable_node_pinning=True, enable_tokenizer_info_endpoint=True,
                       max_request_bytes=1000, header_timeout_s=2.5, body_timeout_s=3.5, parse_timeout_s=4.5,
                       listen_backlog=64,
                       client_api_keys_file="/keys/clients", max_client_requests=6, max_client_decode_slots=7,
                       max_client_queued_requests=8, routing_policy="prefix_aware", enable_prompt_tokens_details=True)
CLUSTERS = [
    ClusterConfig(CUDA, num_prefill=2, num_decode=3, num_colocated=1, num_routers=2, prefill_gpus=("0", "1"),
                  decode_gpus=("2",), colocated_gpus=("3",), prefill_kv_cache_mib=100, decode_kv_cache_mib=200,
                  startup_timeout_s=9.5, drain_timeout_s=8.5, admin_port=8001, admin_max_connections=4,
                  admin_timeout_s=2.5, share_weights="off", kv_lease_seconds=2.5, log_prefill_batches=True,
                  transfer=TRANSFER, **ROUTER_SETTINGS),
    ClusterConfig(ENGINES[1], **ROUTER_SETTINGS),
]
"""NOTE: colocated servers run the native engine: the second config sets the engine's backend."""
RAY_CLUSTER = dataclasses.replace(CLUSTERS[0], prefill_gpus=(), decode_gpus=(), colocated_gpus=())
RAYS = [RayClusterConfig(RAY_CLUSTER, address="auto", placement_strategy="PACK", cpus_per_node=2.0,
                         gpus_per_node=0.5, prefill_resource="corun_prefill", decode_resource="corun_decode",
                         node_host="10.0.0.1", placement_timeout_s=7.5),
        RayClusterConfig(RAY_CLUSTER, num_cpus=4)]
"""NOTE: num_cpus needs address None (a local head): the second config sets it."""


def test_python_m_router_rebuilds_every_field_from_argv_and_environment():
    for router in ROUTERS:
        assert parse_config(config_argv(router), config_environment(router)) == router


def test_the_launcher_s_router_command_rebuilds_the_router_config():
    """launch.router_config from a cluster (every RouterSettings field set), one of several routers: its argv and
    environment, parsed as `python -m router` parses them."""
    router = launch.router_config(CLUSTERS[0], ["tcp://p:1"], ["tcp://d:1"], Path("/keys/k"), ["tcp://c:1"],
                                  **one_of_several(1, 9001, "/tmp/metrics"))
    argv = launch.router_argv(router)
    assert argv[1:3] == ["-m", "router"] and "secret-key" not in argv
    environment = launch.router_environment(router, {"PATH": "/bin", "VLLM_API_KEY": "stale"})
    assert environment == {"PATH": "/bin", "VLLM_API_KEY": "secret-key", "PROMETHEUS_MULTIPROC_DIR": "/tmp/metrics"}
    assert parse_config(argv[3:], environment) == router
    assert router.port == CLUSTERS[0].port and router.api_key == CLUSTERS[0].api_key
    alone = launch.router_config(dataclasses.replace(CLUSTERS[0], api_key=None, client_api_keys_file=None), ["tcp://p:1"],
                                 ["tcp://d:1"])
    assert "VLLM_API_KEY" not in launch.router_environment(alone, {"VLLM_API_KEY": "stale"})


@pytest.mark.parametrize("role", ["prefill", "decode", "colocated"])
def test_a_node_program_rebuilds_every_field_of_its_node_config(role):
    assert_every_field_set(NodeConfig, NODES)
    for node in NODES:
        node = dataclasses.replace(node, role=role)
        args = node_arg_parser(role).parse_args(config_argv(node))
        assert config_from_args(NodeConfig, args, role=role) == node


def test_the_launcher_s_node_command_rebuilds_the_node_config():
    argv = launch.node_argv(CLUSTERS[0], CUDA, "decode", 2, "0.0.0.0", 7001, advertise_host="10.0.0.2",
                            key_file=Path("/keys/k"))
    assert argv[1:3] == ["-m", "decode_node"]
    node = config_from_args(NodeConfig, node_arg_parser("decode").parse_args(argv[3:]), role="decode")
    assert node == NodeConfig(role="decode", node_id="decode-2", engine=CUDA, host="0.0.0.0", port=7001,
                              advertise_host="10.0.0.2", cluster_key_file="/keys/k", kv_lease_seconds=2.5,
                              transfer=TRANSFER, supervisor_pid=os.getpid(), log_prefill_batches=True)


def serve_args(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_corun_serve_rebuilds_every_field_of_its_cluster_config():
    assert_every_field_set(ClusterConfig, CLUSTERS)
    for cluster in CLUSTERS:
        args = serve_args(config_argv(cluster))
        assert cluster_config_from_args(args, config_environment(cluster)) == cluster
    assert cluster_config_from_args(serve_args(["--model", "m"]), {}) == ClusterConfig(EngineConfig(model="m"))


@pytest.mark.parametrize("flag", ["--port", "--admin-port"])
@pytest.mark.parametrize("value", ["99999", "65536", "0", "-1", "80a", ""])
def test_corun_serve_refuses_a_port_outside_1_to_65535_in_one_line(capsys, flag, value):
    """99999 once reached the bind as a traceback (OverflowError); 0 would have the kernel pick a port nobody knows."""
    with pytest.raises(SystemExit) as exited:
        serve_args(["--model", "m", flag, value])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"corun serve: error: argument {flag}: must be a port number from 1 to 65535, got {value!r}",
        "(corun serve --help lists the arguments)"]
    highest = cluster_config_from_args(serve_args(["--model", "m", flag, "65535"]), {})
    assert getattr(highest, flag[2:].replace("-", "_")) == 65535  # NOTE: inverse: the range's ends are ports


def test_every_port_flag_of_the_cluster_s_programs_takes_a_port_number():
    """`corun serve`, the router and the nodes: one flag type for every port."""
    ports = [each for config_class in (ClusterConfig, RouterConfig, NodeConfig) for each in config_flags(config_class)
             if (each.path[-1] == "port" or each.path[-1].endswith("_port")) and not each.is_bool]
    assert {each.option for each in ports} == {"--port", "--admin-port", "--control-port"}
    assert all(each.parse is parse_port for each in ports)


def test_corun_serve_launcher_ray_rebuilds_every_field_of_its_ray_config():
    # NOTE: on Ray, Ray picks each node's GPU (no --prefill-gpus ...), and the nodes run the native engine
    assert_every_field_set(RayClusterConfig, RAYS, unset=("cluster.engine.backend", "cluster.prefill_gpus",
                                                          "cluster.decode_gpus", "cluster.colocated_gpus"))
    for ray in RAYS:
        args = serve_args([*config_argv(ray.cluster), "--launcher", "ray", *config_argv(ray, exclude=("cluster",))])
        cluster = cluster_config_from_args(args, config_environment(ray.cluster))
        assert ray_config_from_args(args, cluster) == ray


def test_corun_serve_s_router_and_node_settings_are_the_router_s_and_the_node_s():
    """A router or node setting is one field, and so one flag of each command line (RouterSettings,
    NodeSettings)."""
    serve_options = {each.option for each in config_flags(ClusterConfig)}
    router_options = {each.option for each in config_flags(RouterConfig) if each.spec.is_flag}
    node_options = {each.option for each in config_flags(NodeConfig) if each.spec.is_flag}
    shared_router = {"--served-model-name", "--host", "--port", "--max-pending-requests", "--request-timeout-s",
                     "--strict-fields", "--api-key", "--enable-node-pinning", "--max-request-bytes",
                     "--header-timeout-s", "--body-timeout-s", "--parse-timeout-s"}
    assert shared_router <= serve_options & router_options
    assert {"--kv-lease-seconds", "--kv-ucx-devices", "--model", "--max-num-seqs"} <= serve_options & node_options


def _router_parser() -> argparse.ArgumentParser:
    from wire.flags import add_flags

    parser = argparse.ArgumentParser()
    add_flags(parser, RouterConfig)
    return parser


def every_option() -> set[str]:
    parsers = [*build_parser()._subparsers._group_actions[0].choices.values(), _router_parser(),
               node_arg_parser("decode")]
    return {option for parser in parsers for each in with_subcommands(parser) for action in each._actions
            for option in action.option_strings}


def with_subcommands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """parser and every parser below it (`corun scale add`'s flags are its own)."""
    nested = [child for action in parser._actions if isinstance(action, argparse._SubParsersAction)
              for child in action.choices.values()]
    return [parser, *(each for child in nested for each in with_subcommands(child))]


OTHER_PROGRAMS_FLAGS = {"--address", "--head", "--num-cpus", "--resources", "--generate", "--port", "--dist",
                        "--extra-body"}
"""Flags the README gives `ray start`, `ray get-auth-token`, pytest (the test command) and `vllm bench serve`, not a
CoRun program."""


def test_every_flag_the_readme_names_is_a_flag_of_a_corun_program():
    named = set(re.findall(r"--[a-z][a-z0-9-]*", (ROOT / "README.md").read_text()))
    assert named - every_option() - OTHER_PROGRAMS_FLAGS == set()


@pytest.mark.parametrize("config_class", [ClusterConfig, RayClusterConfig], ids=lambda cls: cls.__name__)
def test_every_launch_config_field_has_a_docstring_as_its_help(config_class):
    for each in config_flags(config_class):
        assert each.help and each.help == field_docs(each.owner).get(each.path[-1]), each.field


def test_corun_serve_and_corun_scale_import_no_torch():
    """The `corun` program with every subcommand's flags, and the local launcher `corun serve` runs: torch (2 s of
    CPU to import, hundreds of MB) is for the commands that run an engine here (bench, profile), not for the
    launcher that supervises the nodes nor for a control-port client."""
    script = "import sys, cli.main, launch.local; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert result.stdout.strip() == "False"


def test_every_command_describes_every_argument():
    """`corun make-tiny-model --help` once showed dir, --seed and --dtype with no word of what they do (and
    generate, bench, scale, profile and plan had more such)."""
    def undescribed(parser: argparse.ArgumentParser, path: str) -> list[str]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += undescribed(sub, f"{path} {name}")
            elif not action.help:
                found.append(f"{path} {action.dest}")
        return found

    assert undescribed(build_parser(), "corun") == []


@pytest.mark.parametrize("argv", [["serve", "--model", "m", "--max-num-seqs", "x"], ["bench", "--nosuch"], ["nosuch"]])
def test_a_usage_error_is_two_lines_the_error_and_where_the_flags_are(capsys, argv):
    """argparse printed the whole usage first (~80 lines for serve), and the error scrolled out of sight."""
    from cli.main import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    lines = capsys.readouterr().err.splitlines()
    assert exited.value.code == 2 and len(lines) == 2
    assert lines[0].startswith("corun") and ": error: " in lines[0] and lines[1].endswith("--help lists the arguments)")
