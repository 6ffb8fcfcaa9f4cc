"""`vllm bench serve` without the `vllm` command (whose entry point needs vLLM's package metadata, which the CPU build
in .venv-vllm lacks): the same arguments, the same code. Run with .venv-vllm's python."""

import sys

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(sys.argv[1:]))
