"""The `corun` command: one parser, each subcommand's flags in its own module, one line per user error."""

from __future__ import annotations

import argparse
import sys

from cli import bench, engine_commands, plan, scale, serve
from launch.cluster import StartupError


class BriefErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is two lines: the error and where the flags are listed.
    NOTE: argparse prints the whole usage first, ~80 lines for `corun serve`, and the error scrolled out of sight."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help lists the arguments)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = BriefErrorParser(prog="corun", description="Deterministic LLM serving (CoRun).")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (engine_commands.add_make_tiny_model, engine_commands.add_make_random_model,
                engine_commands.add_generate, bench.add_bench, serve.add_serve, scale.add_scale, plan.add_profile,
                plan.add_plan):
        add(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError, StartupError) as error:
        print(f"corun {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
