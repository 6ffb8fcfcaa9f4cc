"""Command-line flags for an EngineConfig, shared by `corun generate`, the node servers and `corun serve`."""

from __future__ import annotations

import argparse
from typing import get_args

from corun.config import DEFAULT_PREFILL_BUCKETS, CacheConfig, DType, EngineConfig, Mode, SchedulerConfig


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="HF-format checkpoint directory")
    parser.add_argument("--mode", default=SchedulerConfig.mode, choices=get_args(Mode))
    parser.add_argument("--max-num-seqs", type=int, default=SchedulerConfig.max_num_seqs,
                        help="N: decode rows per step")
    parser.add_argument("--max-model-len", type=int, default=SchedulerConfig.max_model_len)
    parser.add_argument("--prefill-chunk-size", type=int, default=SchedulerConfig.prefill_chunk_size)
    parser.add_argument("--max-num-batched-tokens", type=int, default=SchedulerConfig.max_num_batched_tokens,
                        help="standard mode token budget")
    parser.add_argument("--prefill-buckets", type=parse_buckets, default=SchedulerConfig.prefill_buckets,
                        help="corun: pad each isolated prefill chunk to the next of these sizes (CUDA graphs on "
                             "CUDA): comma-separated sizes, 'default' for "
                             + ",".join(map(str, DEFAULT_PREFILL_BUCKETS)) + ", or 'none' (natural length, default)")
    parser.add_argument("--prefill-pack-tokens", type=int, default=SchedulerConfig.prefill_pack_tokens,
                        help="corun: packed prefill, every prefill forward exactly this many token rows (0: isolated)")
    parser.add_argument("--prefill-pack-seqs", type=int, default=SchedulerConfig.prefill_pack_seqs,
                        help="corun packed prefill: most prompts per forward")
    parser.add_argument("--decode-step-sizes", type=parse_sizes, default=SchedulerConfig.decode_step_sizes,
                        help="corun: smaller decode step row counts to try (kept only if bitwise equal to the N-row "
                             "step at start-up), comma-separated; default none (every step at N)")
    parser.add_argument("--prefill-token-budget", type=int, default=SchedulerConfig.prefill_token_budget,
                        help="corun: most prompt tokens prefilled between decode steps while requests decode "
                             "(0: no bound, Algorithm 1)")
    parser.add_argument("--block-size", type=int, default=CacheConfig.block_size)
    parser.add_argument("--num-blocks", type=int, default=None, help="KV blocks (default: from --kv-cache-mib)")
    parser.add_argument("--kv-cache-mib", type=int, default=CacheConfig.memory_budget_bytes // 2**20)
    parser.add_argument("--dtype", default=EngineConfig.dtype, choices=get_args(DType))
    parser.add_argument("--device", default=EngineConfig.device)
    parser.add_argument("--base-seed", type=int, default=EngineConfig.seed,
                        help="seeds of requests without one derive from it")
    parser.add_argument("--num-threads", type=int, default=None, help="CPU compute threads (default: torch's)")
    parser.add_argument("--no-cuda-graph", action="store_true")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model, dtype=args.dtype, device=args.device, seed=args.base_seed, num_threads=args.num_threads,
        use_cuda_graph=not args.no_cuda_graph,
        scheduler=SchedulerConfig(mode=args.mode, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                                  prefill_chunk_size=args.prefill_chunk_size,
                                  max_num_batched_tokens=args.max_num_batched_tokens,
                                  prefill_buckets=args.prefill_buckets, prefill_pack_tokens=args.prefill_pack_tokens,
                                  prefill_pack_seqs=args.prefill_pack_seqs,
                                  prefill_token_budget=args.prefill_token_budget,
                                  decode_step_sizes=args.decode_step_sizes),
        cache=CacheConfig(block_size=args.block_size, num_blocks=args.num_blocks,
                          memory_budget_bytes=args.kv_cache_mib * 2**20))


def engine_args_to_argv(config: EngineConfig) -> list[str]:
    """The flags that rebuild `config` in another process (used by the launchers)."""
    sched, cache = config.scheduler, config.cache
    argv = ["--model", config.model, "--mode", sched.mode, "--max-num-seqs", str(sched.max_num_seqs),
            "--max-model-len", str(sched.max_model_len), "--prefill-chunk-size", str(sched.prefill_chunk_size),
            "--max-num-batched-tokens", str(sched.max_num_batched_tokens),
            "--prefill-buckets", ",".join(map(str, sched.prefill_buckets)) or "none",
            "--prefill-pack-tokens", str(sched.prefill_pack_tokens),
            "--prefill-pack-seqs", str(sched.prefill_pack_seqs),
            "--prefill-token-budget", str(sched.prefill_token_budget),
            "--decode-step-sizes", ",".join(map(str, sched.decode_step_sizes)) or "none",
            "--block-size", str(cache.block_size),
            "--kv-cache-mib", str(cache.memory_budget_bytes // 2**20), "--dtype", config.dtype,
            "--device", config.device, "--base-seed", str(config.seed)]
    if cache.num_blocks is not None:
        argv += ["--num-blocks", str(cache.num_blocks)]
    if config.num_threads is not None:
        argv += ["--num-threads", str(config.num_threads)]
    if not config.use_cuda_graph:
        argv.append("--no-cuda-graph")
    return argv


def parse_buckets(text: str) -> tuple[int, ...]:
    return DEFAULT_PREFILL_BUCKETS if text == "default" else parse_sizes(text)


def parse_sizes(text: str) -> tuple[int, ...]:
    if text == "none":
        return ()
    try:
        # NOTE: '/' too, for mode specs inside comma-separated lists (corun bench --modes)
        return tuple(int(size) for size in text.replace("/", ",").split(","))
    except ValueError:
        raise ValueError(f"expected comma-separated sizes (or 'none'), got {text!r}") from None
