"""Command-line flags for an EngineConfig (and a node's TransferConfig), shared by `corun generate`/`bench`/`serve`
and the node servers.

Each flag names the config field it sets; its default, its argv form (what the launchers pass to node
processes) and its place in the nested config all come from that one table and the dataclasses' own defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

from wire.config import (
    AUTO,
    DEFAULT_PREFILL_BUCKETS,
    KV_TRANSPORTS,
    Backend,
    CacheConfig,
    DType,
    EngineConfig,
    Mode,
    SchedulerConfig,
    TransferConfig,
)

SECTIONS = {"scheduler": SchedulerConfig, "cache": CacheConfig}
"""EngineConfig's nested configs, by field name."""
OWNERS = {"": EngineConfig, **SECTIONS, "transfer": TransferConfig}
"""Where a flag's field (and its default) lives: EngineConfig, one of its sections, or TransferConfig."""


def parse_sizes(text: str) -> tuple[int, ...] | str:
    if text in ("none", AUTO):
        return () if text == "none" else AUTO
    try:
        # NOTE: '/' too, for mode specs inside comma-separated lists (corun bench --modes)
        return tuple(int(size) for size in text.replace("/", ",").split(","))
    except ValueError:
        raise ValueError(f"expected comma-separated sizes (or 'none'), got {text!r}") from None


def parse_buckets(text: str) -> tuple[int, ...]:
    return DEFAULT_PREFILL_BUCKETS if text == "default" else parse_sizes(text)


def format_sizes(sizes: tuple | str) -> str:
    return sizes if sizes == AUTO else ",".join(map(str, sizes)) or "none"


def parse_switch(text: str) -> bool:
    if text not in ("on", "off"):
        raise ValueError(f"expected 'on' or 'off', got {text!r}")
    return text == "on"


def format_switch(value: bool) -> str:
    return "on" if value else "off"


def parse_names(text: str) -> tuple[str, ...]:
    return () if text == "none" else tuple(name for name in text.split(",") if name)


MIB = 2**20


@dataclass(frozen=True)
class EngineFlag:
    flag: str
    field: str
    """'name' of EngineConfig, or 'section.name' of one of its nested configs."""
    help: str | None = None
    parse: Callable[[str], Any] = int
    format: Callable[[Any], str] = str
    scale: int = 1
    """field value = flag value * scale (--kv-cache-mib sets bytes)."""
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def default(self):
        section, _, name = self.field.rpartition(".")
        value = next(f.default for f in dataclasses.fields(OWNERS[section]) if f.name == name)
        return None if value is None else value // self.scale if self.scale > 1 else value


ENGINE_FLAGS = (
    EngineFlag("--engine", "backend", "corun (the project's engine) or vllm (a vLLM engine under CoRun's rules; "
               "run from .venv-vllm, made by scripts/setup_vllm.sh)", parse=str, choices=get_args(Backend)),
    EngineFlag("--mode", "scheduler.mode", parse=str, choices=get_args(Mode)),
    EngineFlag("--max-num-seqs", "scheduler.max_num_seqs", "N: decode rows per step"),
    EngineFlag("--max-model-len", "scheduler.max_model_len", "longest prompt + generated tokens of a request"),
    EngineFlag("--prefill-chunk-size", "scheduler.prefill_chunk_size"),
    EngineFlag("--max-num-batched-tokens", "scheduler.max_num_batched_tokens", "standard mode token budget"),
    EngineFlag("--prefill-buckets", "scheduler.prefill_buckets",
               "corun: pad each isolated prefill chunk to the next of these sizes (CUDA graphs on CUDA): "
               "comma-separated sizes, 'default' for " + ",".join(map(str, DEFAULT_PREFILL_BUCKETS))
               + ", 'none' (natural length), or 'auto' (default: the buckets up to the chunk size on CUDA, none on "
               "CPU)", parse=parse_buckets, format=format_sizes),
    EngineFlag("--prefill-pack-tokens", "scheduler.prefill_pack_tokens",
               "corun: packed prefill, every prefill forward exactly this many token rows (0: isolated)"),
    EngineFlag("--prefill-pack-seqs", "scheduler.prefill_pack_seqs", "corun packed prefill: most prompts per forward"),
    EngineFlag("--decode-step-sizes", "scheduler.decode_step_sizes",
               "corun: smaller decode step row counts to try (kept only if bitwise equal to the N-row step at "
               "start-up), comma-separated, 'none' (every step at N), or 'auto' (default: powers of two from 16 and "
               "N/2 ... 7N/8 on CUDA, none on CPU)", parse=parse_sizes, format=format_sizes),
    EngineFlag("--prefill-token-budget", "scheduler.prefill_token_budget",
               "corun: most prompt tokens prefilled between decode steps while requests decode (0: no bound, "
               "Algorithm 1, which starves decoding under sustained arrivals)"),
    EngineFlag("--piecewise-graphs", "scheduler.piecewise_graphs",
               "standard/batch_invariant on CUDA: mixed steps as CUDA graphs by token count, attention eager "
               "between them (on, default; off: eager mixed steps)",
               parse=parse_switch, format=format_switch),
    EngineFlag("--block-size", "cache.block_size"),
    EngineFlag("--num-blocks", "cache.num_blocks", "KV blocks (default: from --kv-cache-mib)"),
    EngineFlag("--kv-cache-mib", "cache.memory_budget_bytes", scale=MIB),
    EngineFlag("--dtype", "dtype", parse=str, choices=get_args(DType)),
    EngineFlag("--device", "device", parse=str),
    EngineFlag("--base-seed", "seed", "seeds of requests without one derive from it"),
    EngineFlag("--max-logprobs", "max_logprobs", "top-k alternatives computed per sampled token"),
    EngineFlag("--num-threads", "num_threads", "CPU compute threads (default: torch's)"),
)
CUDA_GRAPH_FLAG = "--no-cuda-graph"
"""The one boolean: EngineConfig.use_cuda_graph, on unless this flag is given."""


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="HF-format checkpoint directory")
    for flag in ENGINE_FLAGS:
        parser.add_argument(flag.flag, type=flag.parse, default=flag.default(), choices=flag.choices, help=flag.help)
    parser.add_argument(CUDA_GRAPH_FLAG, dest="use_cuda_graph", action="store_false",
                        help="run decode steps eagerly on CUDA")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    values: dict[str, Any] = {"model": args.model, "use_cuda_graph": args.use_cuda_graph}
    sections: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for flag in ENGINE_FLAGS:
        value = getattr(args, flag.dest)
        value = value * flag.scale if value is not None and flag.scale > 1 else value
        section, _, name = flag.field.rpartition(".")
        (sections[section] if section else values)[name] = value
    return EngineConfig(**values, **{name: SECTIONS[name](**fields) for name, fields in sections.items()})


def engine_args_to_argv(config: EngineConfig) -> list[str]:
    """The flags that rebuild `config` in another process (used by the launchers)."""
    argv = ["--model", config.model]
    for flag in ENGINE_FLAGS:
        section, _, name = flag.field.rpartition(".")
        value = getattr(getattr(config, section) if section else config, name)
        if value is not None:
            argv += [flag.flag, flag.format(value // flag.scale if flag.scale > 1 else value)]
    if not config.use_cuda_graph:
        argv.append(CUDA_GRAPH_FLAG)
    return argv


TRANSFER_FLAGS = (
    EngineFlag("--kv-transport", "transfer.transport", "how KV moves between nodes (nixl; fake: one process, tests)",
               parse=str, choices=tuple(KV_TRANSPORTS)),
    EngineFlag("--kv-cuda-ipc-get-zcopy", "transfer.cuda_ipc_get_zcopy",
               "UCX's CUDA-IPC READ path between processes of one host (y; auto: only with NVLink)", parse=str,
               choices=("y", "n", "auto")),
    EngineFlag("--kv-ucx-transports", "transfer.ucx_transports", "UCX_TLS, comma-separated (default: UCX's choice)",
               parse=parse_names, format=format_sizes),
    EngineFlag("--kv-ucx-devices", "transfer.ucx_devices", "network devices UCX may use, comma-separated",
               parse=parse_names, format=format_sizes),
    EngineFlag("--kv-ucx-error-handling", "transfer.ucx_error_handling", parse=str, choices=("none", "peer")),
    EngineFlag("--kv-progress-thread", "transfer.progress_thread", "NIXL's progress thread (auto: on for GPU KV)",
               parse=str, choices=("auto", "on", "off")),
    EngineFlag("--kv-min-vram-read-gbps", "transfer.min_vram_read_gbps",
               "a VRAM peer whose probe READ is slower is refused (an emulated path)", parse=float),
)
ALLOW_SLOW_READS_FLAG = "--kv-allow-slow-reads"


def add_transfer_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("KV transfer (NIXL over UCX by default)")
    for flag in TRANSFER_FLAGS:
        group.add_argument(flag.flag, type=flag.parse, default=flag.default(), choices=flag.choices, help=flag.help)
    group.add_argument(ALLOW_SLOW_READS_FLAG, dest="kv_allow_slow_reads", action="store_true",
                       help="serve even when a VRAM peer's probe READ is slower than --kv-min-vram-read-gbps")


def transfer_config_from_args(args: argparse.Namespace) -> TransferConfig:
    values = {flag.field.partition(".")[2]: getattr(args, flag.dest) for flag in TRANSFER_FLAGS}
    return TransferConfig(**values, allow_slow_reads=args.kv_allow_slow_reads)


def transfer_args_to_argv(config: TransferConfig) -> list[str]:
    argv = []
    for flag in TRANSFER_FLAGS:
        argv += [flag.flag, flag.format(getattr(config, flag.field.partition(".")[2]))]
    return argv + ([ALLOW_SLOW_READS_FLAG] if config.allow_slow_reads else [])
