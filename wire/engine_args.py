"""Command-line flags for an EngineConfig (and a node's TransferConfig), shared by `corun generate`/`bench`/`serve`
and the node servers.

The flags are wire/flags.py's, generated from the dataclasses: each one's name, help, default and argv form (what
the launchers pass to node processes) come from its field, so that a field added to the engine's config is a flag
of every one of those command lines.
"""

from __future__ import annotations

import argparse

from wire.config import (
    TRANSFER_FLAG_PREFIX,
    EngineConfig,
    TransferConfig,
    format_sizes,
    parse_buckets,
    parse_sizes,
)
from wire.flags import add_flags, config_argv, config_flags, config_from_args, format_switch, parse_names, parse_switch

__all__ = ["ENGINE_FLAGS", "add_engine_args", "add_transfer_args", "engine_args_to_argv", "engine_config_from_args",
           "format_sizes", "format_switch", "parse_buckets", "parse_names", "parse_sizes", "parse_switch",
           "transfer_args_to_argv", "transfer_config_from_args"]

ENGINE_FLAGS = config_flags(EngineConfig)
"""One flag per field of EngineConfig, its scheduler's and its cache's fields included."""


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, EngineConfig)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return config_from_args(EngineConfig, args)


def engine_args_to_argv(config: EngineConfig) -> list[str]:
    """The flags that rebuild `config` in another process (used by the launchers)."""
    return config_argv(config)


def add_transfer_args(parser: argparse.ArgumentParser) -> None:
    add_flags(parser.add_argument_group("KV transfer (NIXL over UCX)"), TransferConfig, prefix=TRANSFER_FLAG_PREFIX)


def transfer_config_from_args(args: argparse.Namespace) -> TransferConfig:
    return config_from_args(TransferConfig, args, prefix=TRANSFER_FLAG_PREFIX)


def transfer_args_to_argv(config: TransferConfig) -> list[str]:
    return config_argv(config, prefix=TRANSFER_FLAG_PREFIX)
