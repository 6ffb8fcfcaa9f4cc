"""The latency-target flags: milliseconds, named so (`--ttft-p99-ms`, `--tpot-p99-ms`), as `corun bench --goodput`
takes them. The spellings before (`--ttft-p99` in seconds, `--tpot` in milliseconds) are refused with the flag and
unit to use, so an old command line fails loudly instead of planning for a target a thousand times off."""

from __future__ import annotations

import argparse

RENAMED_FLAGS = {"--ttft-p99": ("--ttft-p99-ms", "seconds"), "--tpot": ("--tpot-p99-ms", "milliseconds")}
"""old flag -> (its replacement, the unit the old one took)."""


class RefusedFlag(argparse.Action):
    """A flag that no longer exists: an argparse error (exit 2) naming its replacement."""

    def __call__(self, parser, namespace, values, option_string=None):
        new_flag, old_unit = RENAMED_FLAGS[option_string]
        parser.error(f"{option_string} is gone (it took {old_unit}): use {new_flag}, in milliseconds as every "
                     "latency target of corun (e.g. --ttft-p99-ms 500 --tpot-p99-ms 50)")


def add_slo_flags(cmd, required: bool = True, ttft_default: float | None = None,
                  tpot_default: float | None = None) -> None:
    """--ttft-p99-ms and --tpot-p99-ms (planner.slo.SLO.from_ms checks them), and the refused old spellings."""
    cmd.add_argument("--ttft-p99-ms", type=float, required=required, default=ttft_default,
                     help="TTFT p99 target, milliseconds (as `corun bench --goodput ttft:MS`)")
    cmd.add_argument("--tpot-p99-ms", type=float, required=required, default=tpot_default,
                     help="TPOT p99 target, milliseconds (as `corun bench --goodput tpot:MS`)")
    for old_flag in RENAMED_FLAGS:
        cmd.add_argument(old_flag, action=RefusedFlag, nargs="?", help=argparse.SUPPRESS)
