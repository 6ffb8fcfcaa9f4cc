"""Engine, node and router configuration: one frozen dataclass per concern, validated once when built.

Every field is also a command-line flag (wire/flags.py): its docstring is the flag's help, its default the flag's,
and what its type does not say about the flag sits next to it, in its metadata.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal, get_args

from wire.auth import API_KEY_ENV, check_api_key
from wire.flags import NOT_A_FLAG, PORTS, flag, format_switch, name_parser, parse_port, parse_switch

MIB = 2**20
GIB = 2**30

DEFAULT_PREFILL_BUCKETS = (16, 32, 64, 128, 256, 384, 512, 768, 1024)
"""`--prefill-buckets default`: fine steps where a prefill is launch-bound, coarser where it is compute-bound;
none above 1024, where the eager forward's launches hide behind its kernels."""
DEFAULT_PREFILL_CHUNK = 256
"""prefill_chunk_size where a prompt runs one chunk per forward (CPU, isolated prefill). Measured (issue 25): on the
H200 (8B shape, packed prefill, t = 0) against 512 with the cache off it gave 1.00-1.03x on the shared-prefix
workloads and, against 4096, 1.00x/1.02x/1.05x on ShareGPT-/BurstGPT-like and 1024x2048
(benchmarks/results/h200_prefix_cache_stop33.json, h200_chunk_size.json), while its cache hits went from 0.63 to 0.95 of
the few-shot prompt tokens (2.6x -> 8.7x); on the 2-core CPU host (tiny model, isolated prefill) 1.01-1.02x on
prompts of 256 and 768 tokens (cpu_chunk_size.json). Smaller chunks cost a long prompt a forward each there: a lone
4096-token prompt chunk by chunk took 188 ms at 256, 305 at 128, 608 at 64 (h200_prefill_cost_by_chunk.json)."""
SMALL_PREFILL_CHUNK = 32
"""prefill_chunk_size on CUDA with packed prefill, where a prompt runs as many chunks in one forward as the pack holds
(multi_chunk_prefill), so a small chunk costs a long prompt nothing and hits more of the prefix cache (a hit stops at
the last whole chunk of the shared part). Measured on the H200 (8B shape, engine, 256 requests at t = 0, cache on
against off; benchmarks/results/h200_prefix_cache_chunk32_all.json, h200_prefix_cache_multi_chunk.json,
h200_prefill_cost_chunk32.json, h200_prefill_cost_multi_chunk.json), chunk 32 / 64 / 256: multiple choice 3.34x /
3.18x / 2.21x, multi-turn 1.52x / 1.46x / 1.23x (1.53x against 1.47x in a second call), few-shot 13.0x / 12.8x /
12.6x, no shared prefix 0.99x / 1.00x / 1.00x; a lone 1024-/4096-token prompt prefilled in 23.9/107.5 ms at 32 against
24.3/109.8 at 64 (one call) and 25.8/106.9 at 64 against 25.5/107.2 at 256 (another); at 64 one chunk per forward
took 119.7/610.2. With the cache off, 32 and 64 gave 0.99-1.05x of 256. The price, not measured: a request asking for
prompt logprobs computes them chunk by chunk, so it reads the LM head once per 32 prompt tokens. Block-aligned (a
multiple of CacheConfig.block_size, 16), which the prefix cache needs."""

DEFAULT_BATCHED_TOKENS = 2048
"""max_num_batched_tokens on CPU and on GPUs under LARGE_GPU_BYTES (vLLM's API-server default there)."""
LARGE_GPU_BATCHED_TOKENS = 8192
"""max_num_batched_tokens on a large GPU (LARGE_GPU_BYTES or more, not an A100), as vLLM's API server sets it there.
Measured on the H200 (8B shape, bf16, N = 256, one run, benchmarks/results/h200_defaults_user.json, stop 44): at t = 0
fixed_shape at 2048 gave 0.989x / 0.957x / 0.995x / 0.863x of 8192 (ShareGPT-, BurstGPT-, RL-rollout-like,
1024x2048: 8192 prefills 4 times the tokens per forward while decode rows ride each one, and a 10-s window of a t = 0
run is mostly prefill) and TTFT p50 1.09-1.13x; mixed mode at 2048 0.94x / 0.89x / 0.99x / 0.74x of itself at 8192.
The price: a decoding request waits for a whole forward, so ITL p99 at t = 0 went from 57-71 ms to 192-205 ms, and
BurstGPT-like TPOT p99 from 63 to 131 ms (every earlier issue-20 table ran at 8192: h200_defaults.json). Poisson
ShareGPT-like at 16 and 32 req/s ran at 8192 in stop 40 (h200_defaults_poisson_*.json, default corun 297 and 300 of
300 good) and at 2048 now (297 and 300 of 300: the same)."""
LARGE_GPU_BYTES = 70 * GIB
"""vLLM's line for its larger defaults (H100, H200; an A100 of 80 GiB keeps the smaller: a larger budget measured
slower there, vllm-project/vllm#17885)."""

AUTO = "auto"
"""A shape setting resolved on the device when the EngineConfig is built (resolve_shape_defaults): the values that
measured fastest there, so a user without tuning flags gets the benchmarked path."""

CPU_MAX_NUM_SEQS = 32
"""max_num_seqs (N) on CPU: each fixed_shape decode step computes N rows, and a CPU has no graphs to amortise them."""
GPU_MAX_NUM_SEQS = 256
"""max_num_seqs (N) on CUDA: the N every H200 figure ran at (8B shape: benchmarks/results/h200_*.json), and vLLM's
default on GPUs under LARGE_GPU_BYTES. vLLM takes 1024 on larger ones; a fixed_shape step of 1024 rows is unmeasured
here (it would also capture and verify four times the decode sizes at start-up)."""
CPU_KV_CACHE_BYTES = 512 * MIB
"""The KV cache on CPU when --kv-cache-mib is not given (the tiny model: 16k tokens)."""
GPU_SWAP_SHARE_OF_HOST_MEMORY = 0.25
"""CacheConfig.swap_space_bytes auto on CUDA: this share of the host memory available when the node starts, split
among the host's GPUs (taken only as blocks are swapped out). Measured on an H100 host (125 GiB; 1P1D on the one GPU,
1024x2048 at t = 0, benchmarks/results/h100_front_door_1p1d_swap*_stop52.json): auto, ~31 GiB, doubled the decode
node's rows (95.5 against 48.7 per step) and gave 0.732x the engine's tok/s against 0.629x with none; 64 GiB gave
0.660x (more pauses, more copies); ShareGPT-like, where the KV does not bind, 0.946x against 0.950x."""
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
"""The share of a GPU's memory a node may use when --kv-cache-mib is not given (vLLM's gpu_memory_utilization; 0.9
in its releases before 0.11)."""

LOCAL_HOST = "127.0.0.1"
"""Where a server listens unless told otherwise: this host alone."""

Mode = Literal["fixed_shape", "mixed", "batch_invariant"]
"""How an engine schedules its steps: fixed_shape, every forward at a shape that is a function of the request alone
(isolated or packed prefill at verified row counts, decode steps of N rows); mixed, vLLM-style steps that mix
prefill chunks and decodes under a token budget; batch_invariant, mixed steps on batch-invariant kernels."""
Sizes = tuple[int, ...] | Literal["auto"]
DType = Literal["float32", "bfloat16", "float16"]
EngineDType = Literal["auto", "float32", "bfloat16", "float16"]
"""An engine's dtype as asked: a DType, or auto (resolve_dtype)."""


def resolve_dtype(dtype: str, device: str, checkpoint_dtype: str | None, bfloat16_supported: bool = True) -> str:
    """auto -> float32 on CPU (the fastest there without AMX, and what the determinism tests run); on CUDA the
    checkpoint's dtype (config.json's torch_dtype) when it is bfloat16 or float16, else bfloat16: vLLM's rule ("auto"
    runs float32 checkpoints at the GPU's preferred half precision), and float16 for bfloat16 on a GPU without it
    (bfloat16_supported: compute capability 8.0 or more; vLLM's auto picks float16 there too). Explicit values are
    kept (corun/device_facts.py refuses an explicit bfloat16 where the GPU has none)."""
    if dtype != AUTO:
        return dtype
    if not device.startswith("cuda"):
        return "float32"
    half = checkpoint_dtype if checkpoint_dtype in ("bfloat16", "float16") else "bfloat16"
    return "float16" if half == "bfloat16" and not bfloat16_supported else half


Role = Literal["prefill", "decode", "colocated"]
Backend = Literal["native", "vllm"]
"""The engine that runs a node's forwards: native, the project's own (corun/); vllm, a vLLM engine under the same
rules (corun/vllm_backend)."""

OLD_NAMES: dict[str, dict[str, str]] = {
    "mode": {"corun": "fixed_shape", "standard": "mixed"},
    "backend": {"corun": "native"},
}
"""The names modes and engine backends had before issue 22 (when "corun" named the project, the package, a mode, a
backend and a scheduler) -> their names now. Accepted wherever a user names one (--mode, --engine, the mode specs of
`corun bench --modes`, LLM(mode=..., backend=...), SchedulerConfig and EngineConfig) and made the new name there,
once: past that point the code, the fingerprint, logs and reports know only the new names."""
canonical_mode = name_parser("mode", get_args(Mode), OLD_NAMES["mode"])
"""A mode's name, or its old name -> its name (ValueError, listing the names, for any other)."""
canonical_backend = name_parser("engine backend", get_args(Backend), OLD_NAMES["backend"])
"""An engine backend's name, or its old name -> its name (ValueError, listing the names, for any other)."""


def canonical_mode_spec(spec: str) -> str:
    """A mode spec of `corun bench --modes` (`mode` or `mode:field=value:...`, benchmarks.harness.scheduler_for)
    with its mode's name made canonical, as reports name it: corun:prefill_buckets=default ->
    fixed_shape:prefill_buckets=default."""
    mode, sep, settings = spec.partition(":")
    return canonical_mode(mode) + sep + settings


def parse_sizes(text: str) -> tuple[int, ...] | str:
    """A Sizes flag: comma-separated sizes, 'none' (no sizes) or 'auto'."""
    if text in ("none", AUTO):
        return () if text == "none" else AUTO
    try:
        # NOTE: '/' too, for mode specs inside comma-separated lists (corun bench --modes)
        return tuple(int(size) for size in text.replace("/", ",").split(","))
    except ValueError:
        raise ValueError(f"expected comma-separated sizes (or 'none'), got {text!r}") from None


def parse_buckets(text: str) -> tuple[int, ...]:
    """As parse_sizes, and 'default': DEFAULT_PREFILL_BUCKETS."""
    return DEFAULT_PREFILL_BUCKETS if text == "default" else parse_sizes(text)


def format_sizes(sizes: tuple | str) -> str:
    return sizes if sizes == AUTO else ",".join(map(str, sizes)) or "none"


def check_at_least(config, lowest: int, *names: str) -> None:
    """A ValueError naming the first of config's fields (names) below lowest; None (auto) passes. NOTE: None alone is
    auto: a falsy test let max_num_seqs 0 through, and every request was then refused at the nodes."""
    for name in names:
        value = getattr(config, name)
        if value is not None and value < lowest:
            raise ValueError(f"{name} must be >= {lowest}, got {value}")


DECODE_TILE_TOKENS = 128
"""Tokens per inner iteration of the CUDA decode attention kernel: part of every decode row's reduction order.
128 rather than 64 since stop 37: a program's per-tile cost, not bandwidth, bounds a step of few long rows, and on the
H200 (8B shape, one layer in CUDA graphs, h200_decode_attention_tiles.json) 16 rows with 8 of 1.2k tokens took
26.3 us against 38.0, while 256 rows of 1k tokens took 257.8 against 254.2."""


@dataclass(frozen=True)
class SchedulerConfig:
    mode: Mode = field(default="fixed_shape", metadata=flag(parse=canonical_mode))
    """fixed_shape: isolated (or packed) prefill and decode steps of N rows, every shape a function of the request
    alone. mixed: vLLM-style continuous batching, prefill chunks and decodes mixed in one step. batch_invariant: mixed
    scheduling on batch-invariant Triton kernels (CUDA; Triton's CPU interpreter in tests). The names before issue
    22, corun (fixed_shape) and standard (mixed), are accepted too (OLD_NAMES)."""
    max_num_seqs: int | None = None
    """N: the most requests running at once; in fixed_shape mode every decode step computes exactly N rows. None
    (auto): GPU_MAX_NUM_SEQS (256) on CUDA, CPU_MAX_NUM_SEQS (32) on CPU (see resolve_shape_defaults)."""
    max_model_len: int = 1024
    """Longest sequence (prompt + generated tokens) a request may reach."""
    prefill_chunk_size: int | None = None
    """Prompts longer than this are prefilled in chunks of exactly this many tokens (the last one shorter). Also the
    prefix cache's unit (CacheConfig.enable_prefix_caching): only whole chunks are shared. None (auto):
    SMALL_PREFILL_CHUNK (32) on CUDA with packed prefill (where a prompt runs several chunks in one forward,
    multi_chunk_prefill), DEFAULT_PREFILL_CHUNK (256) elsewhere (see resolve_shape_defaults)."""
    max_num_batched_tokens: int | None = None
    """mixed mode: token budget of one mixed prefill+decode step; fixed_shape on CUDA: the packed prefill forward's
    rows (T) when prefill_pack_tokens is auto. None (auto): LARGE_GPU_BATCHED_TOKENS on a large GPU, else
    DEFAULT_BATCHED_TOKENS (see resolve_shape_defaults)."""
    prefill_buckets: Sizes = field(default=AUTO, metadata=flag(parse=parse_buckets, format=format_sizes,
                                                               metavar="SIZES|default|none|auto"))
    """fixed_shape mode (as are the settings below; other modes ignore them). Isolated prefill: a prompt's first
    chunk of l tokens runs padded to the smallest bucket >= l (padding rows write only the null block and are
    never sampled), so its shape is still a function of the prompt alone; on CUDA each bucket is one captured
    CUDA graph, which removes the per-kernel launch cost of short prefills. Longer chunks and a long prompt's
    later chunks run at their natural length. () = natural length always (the paper). auto: DEFAULT_PREFILL_BUCKETS
    (up to the chunk size) on CUDA with graphs when packed prefill is off (prefill_pack_tokens 0), () elsewhere
    (see resolve_shape_defaults)."""
    prefill_pack_tokens: int | None = None
    """fixed_shape's packed prefill when > 0: a prefill forward holds up to this many token rows (T), filled with whole
    prefill chunks (cut at multiples of prefill_chunk_size: positions that depend on the prompt alone) of up to
    prefill_pack_seqs prompts, each attending only to its own sequence; the rest is padding. It runs at T rows, or
    at the smallest verified smaller size that holds it (prefill_pack_sizes), so a prompt's outputs depend on T
    (part of the contract) but not on what it is packed with. Needs prefill_chunk_size <= T. 0 = isolated prefill
    (one prompt per forward). None (auto): max(max_num_batched_tokens, prefill_chunk_size) on CUDA with graphs, 0
    elsewhere and when prefill_buckets are given (see resolve_shape_defaults)."""
    prefill_pack_seqs: int = 64
    """Packed prefill: the most prompts in one forward (S); token 1 of each is sampled on exactly S rows."""
    prefill_pack_sizes: Sizes = field(default=AUTO, metadata=flag(parse=parse_sizes, format=format_sizes,
                                                                  metavar="SIZES|none|auto"))
    """Packed prefill: candidate row counts below T. At start-up each is run against the T-row forward on random
    prompts and kept only if every prompt's KV and token-1 logits and samples are bitwise those of the T-row
    forward; a pack of r rows then runs at the smallest kept size >= r, so a lone prompt does not pay T rows and
    outputs do not change. Which pass depends on the GPU and kernels (measured on the H200, Qwen3-8B shape: every
    projection gave a row the same bits at 192 and at every count from 320 to 8448 with cuBLAS split-K on,
    benchmarks/results/h200_gemm_row_invariance.json; every count from 1 to 8192 without it, the default,
    h200_gemm_rows_no_split_k.json). () = every pack at T. auto: the candidates
    of auto_pack_size_candidates(T) on CUDA with graphs, () elsewhere (see resolve_shape_defaults)."""
    decode_step_sizes: Sizes = field(default=AUTO, metadata=flag(parse=parse_sizes, format=format_sizes,
                                                                 metavar="SIZES|none|auto"))
    """fixed_shape: candidate row counts below N for decode steps with few running requests. At start-up each one is
    run against the N-row step on random KV, tokens, contexts and sampling parameters, and kept only if every
    row's logits and sampled outputs are bitwise those of the N-row step (kernels choose their algorithm by
    shape alone, so agreement there means the same reduction order for every input); a step of k running
    requests then runs at the smallest kept size >= k. Which pass depends on the GPU and kernels (measured on the
    H200, Qwen3-8B shape, N = 256: with cuBLAS split-K 128, 160 and 224 only; without it, the default since issue 20's
    eighth round, every candidate from 16 to 240: benchmarks/results/h200_determinism_stop39.json). () = every step at
    N (the paper).
    auto: auto_decode_step_candidates(N) on CUDA, CPU_DECODE_SIZE_CANDIDATES below N on CPU (resolve_shape_defaults)."""
    decode_kv_split_tokens: int = 0
    """fixed_shape on CUDA: > 0 cuts each decode row's context into ranges of this many tokens (a multiple of
    DECODE_TILE_TOKENS, the kernel's tile), computed by separate programs and merged in range order, so where the
    cuts fall depends only on the request's context length and its bits only on the request (split-KV by token count,
    never by batch size). 0 = one program per (row, kv head) over the whole context (the paper's "no split-KV").
    Part of the outputs (the fingerprint); mixed mode keeps its batch-dependent split, CPU its per-request attention.
    NOTE: 0 by default, measured on the H200 (8B shape, N = 256, t = 0,
    benchmarks/results/h200_kv_splits_t0_merged.json): ranges of 512 made the tail's 128-row steps (7 real rows,
    contexts ~1.2k) 6.66 ms against 7.20, but a full step 11.80 ms against 11.31 (the range kernels run one-range
    rows ~15% slower than the one-range kernel: h200_decode_attention_splits_merged.json), so ShareGPT-like gained
    1.9% and RL-rollout-like lost 2.5%."""
    prefill_token_budget: int | None = None
    """fixed_shape: the most prompt tokens prefilled between two decode steps while requests are decoding (the
    prefill that crosses the budget still runs whole), so decode is not starved by a queue of prompts. Where the
    decode step rides the prefill forward (decode_rides_prefill), the budget caps that forward's pack instead: it is
    what a running request waits through for its next token (a pack of T = 8192 rows on the 8B shape is ~0.2 s).
    Measured on the H200 (8B shape, t = 0, one machine, benchmarks/results/h200_budget_*t0_stop50.json): ITL p99
    193.6 / 205.8 ms at the default (ShareGPT-like / 1024x2048), 61.8 / 68.7 at 2048 for 0.990x / 0.832x the tok/s,
    47.4 / 50.8 at 1024 for 0.915x / 0.43x (every decode step then rides a 1,024-row pack while prompts wait).
    0 = Algorithm 1 (prefill everything admissible before the next decode step). Changes latency, not outputs.
    None (auto): max_num_batched_tokens, the token budget of one of mixed mode's steps, so a running request
    waits at most about what it waits there between two of its tokens.
    NOTE: 0 starves decoding whenever prompts arrive faster than they are prefilled (measured on the H200: 0 of 300
    requests finished at 16 req/s with the eager prefill). Measured on the H200 (8B shape, N = 256, T = 8192, one
    machine, benchmarks/results/h200_budget_*.json): at t = 0 a budget of one full pack (8192) gave 1.00-1.06x of
    a 2048 budget (1024x2048 4,820 against 4,560 tok/s: a small budget adds decode steps at small batches while the
    batch fills), and at Poisson 16 and 32 req/s the same good requests (294 and 300 of 300)."""
    multi_chunk_prefill: bool = field(default=True, metadata=flag(parse=parse_switch, format=format_switch,
                                                                  metavar="on|off"))
    """fixed_shape with packed prefill: a prompt runs as many of its chunks in one forward as the pack has rows for
    (cut at multiples of prefill_chunk_size as before, so the prefix cache keeps them chunk by chunk), where the
    start-up probe (corun/chunk_invariance.py) finds that a prompt's chunks give it the same K, V and token-1 logits
    in one forward as one by one; elsewhere one chunk per prompt per forward. A prompt asking for prompt logprobs runs
    a chunk per forward (its logprobs are computed per chunk). So a small chunk (more prefix-cache hits) no longer
    costs a long prompt a forward per chunk. NOTE: measured on the H200 (8B shape): chunk by chunk and whole gave
    the same bits in 6 of 6 cases (benchmarks/results/h200_chunk_invariance.json); its speed is not measured yet."""
    decode_rides_prefill: bool = field(default=True, metadata=flag(parse=parse_switch, format=format_switch,
                                                                   metavar="on|off"))
    """fixed_shape with packed prefill, on an engine or colocated node: while requests decode, each prefill forward
    carries their decode step too (decode rows first, at the step's verified size, then the pack at its size), so
    the weights are read once for both, as mixed mode's steps do, and a queue of prompts never stalls the decoding
    requests (prefill_token_budget then caps the pack of such a forward). Kept only where it changes no bits: at
    start-up every (decode size, pack size) pair is run joined and apart on random KV, prompts and sampling parameters
    (corun/joined_steps.py), and only pairs whose every decode row and prompt agree bit for bit are joined; the
    rest run as two forwards. NOTE: on the H200 without cuBLAS split-K every GEMM row count from 1 to 8192 gives a
    row the bits it gets at 256 and 2048 rows (benchmarks/results/h200_gemm_rows_no_split_k.json), and the decode
    and packed prefill attention kernels reduce per row and per token position; the probe kept all 104 pairs of the
    8B shape in bf16 (and none in float32 there). Measured on the H200 (8B shape, N = 256, t = 0, one machine,
    h200_joined_t0.json): ShareGPT-like 7,597 tok/s against 7,561 apart (TTFT p50 0.98 s against 1.07) and
    RL-rollout-like 14,955 against 14,940; mixed mode 7,670 and 15,015 there. A pack below
    corun.joined_steps.MIN_PACK_ROWS_OVER_A_GRAPH rows rides through the piecewise graphs (piecewise_graphs), a larger
    one eagerly. Measured on an H100 with every pair of up to 2048 rows through the pieces (8B shape, Poisson
    ShareGPT-like, one machine, benchmarks/results/h100_defaults_poisson_*_pieces*_stop49.json): 224-227 of 225-228
    prefill forwards joined at 32 req/s against 22 of 232-234 without the pieces, TPOT p50 11.51 and 12.03 against
    11.70 and 12.34 ms (16 req/s: 8.59 against 8.88), ITL p99 49.7 against ~40 ms (the padded large packs, which now
    ride eagerly). With that split, on the H200 (h200_defaults_poisson_32_stop50.json,
    h200_poisson_32_pieces_off_stop50.json): 242 of 243 joined at 32 req/s against 22 of 236, TPOT p50 9.42 against
    9.56 ms, ITL p99 41.6 against 41.8 ms, start-up 40.5 against 27.7 s. Off: prefill_token_budget decides when the
    decode step runs between prefill forwards, as before."""
    piecewise_graphs: bool = field(default=True, metadata=flag(parse=parse_switch, format=format_switch,
                                                               metavar="on|off"))
    """mixed and batch_invariant modes on CUDA: mixed prefill+decode steps (and prefill-only steps) of up to 2048 tokens
    run as CUDA graphs by token-count bucket, split at attention, which runs eagerly between them (vLLM's piecewise
    scheme), so the baseline's speed depends less on the host CPU's. Larger steps run eagerly (GEMMs dominate them).
    fixed_shape on the engine and colocated nodes: a joined forward (decode_rides_prefill) whose pack is below
    corun.joined_steps.MIN_PACK_ROWS_OVER_A_GRAPH rows runs through the same graphs, so packs of any size may carry the
    decode step (eagerly, only packs from that size are worth joining); the start-up probe tries each pair the way it
    will run. NOTE: measured on the H200 (t = 0, one run, benchmarks/results/h200_standard_flash.json): BurstGPT-like
    4,068 tok/s against 3,746 eager, ShareGPT-like 6,103 against 5,857. Before prompt attention called FlashAttention
    directly, an engine with the graphs captured ran ~3x slower in `corun bench`, its eager steps included, with SDPA
    choosing cuDNN per new shape; that did not recur (benchmarks/results/README.md)."""
    async_scheduling: bool = field(default=True, metadata=flag(parse=parse_switch, format=format_switch,
                                                               metavar="on|off"))
    """vLLM's async scheduling (its default there too): a decode step is launched before the host has read the
    tokens of the one before, taking each continuing row's input token from the device, so the GPU does not idle
    while the host reads, streams and schedules (corun/decode_ahead.py). Outputs do not change. Penalties count the
    token in flight on the device. Steps with rows whose logits depend on the values of their last tokens on the host
    (bad words, structured outputs), prefill forwards and mixed prefill+decode steps run synchronously. Measured on
    the H200 (8B shape, N = 256, benchmarks/results/h200_async_*.json): GPU idle per decode step 0.9 ms against 3.4
    without; at t = 0 1.01-1.14x (fixed_shape) and 1.03-1.19x (mixed); through HTTP 1.13-1.16x on colocated nodes."""

    def __post_init__(self):
        object.__setattr__(self, "mode", canonical_mode(self.mode))  # NOTE: an old name becomes the new one here
        check_at_least(self, 1, "max_num_seqs", "max_model_len", "prefill_pack_seqs", "max_num_batched_tokens",
                       "prefill_chunk_size")
        if self.decode_kv_split_tokens < 0 or self.decode_kv_split_tokens % DECODE_TILE_TOKENS:
            raise ValueError(f"decode_kv_split_tokens must be a multiple of {DECODE_TILE_TOKENS} (0 = no split), "
                             f"got {self.decode_kv_split_tokens}")
        check_at_least(self, 0, "prefill_pack_tokens", "prefill_token_budget")
        buckets, sizes = self.prefill_buckets, self.decode_step_sizes
        if buckets != AUTO and (any(b < 1 for b in buckets) or list(buckets) != sorted(set(buckets))):
            raise ValueError(f"prefill_buckets must be increasing positive sizes or 'auto', got {buckets}")
        if sizes != AUTO and (any(not 1 <= size < (self.max_num_seqs or size + 1) for size in sizes)
                              or list(sizes) != sorted(set(sizes))):
            raise ValueError(f"decode_step_sizes must be increasing sizes in [1, max_num_seqs) or 'auto', got {sizes}")
        pack_sizes = self.prefill_pack_sizes
        pack_tokens = self.prefill_pack_tokens
        if pack_sizes not in (AUTO, ()) and (pack_tokens == 0 or any(
                not 1 <= size < (pack_tokens or size + 1) for size in pack_sizes) or list(pack_sizes) != sorted(
                set(pack_sizes))):
            raise ValueError(f"prefill_pack_sizes must be increasing sizes in [1, prefill_pack_tokens) with packed "
                             f"prefill on, or 'auto', got {pack_sizes}")
        if self.prefill_pack_tokens and buckets not in (AUTO, ()):
            raise ValueError("prefill_buckets (isolated prefill) and prefill_pack_tokens (packed) exclude each other")
        if self.prefill_pack_tokens and (self.prefill_chunk_size or 0) > self.prefill_pack_tokens:
            raise ValueError(f"packed prefill needs prefill_chunk_size ({self.prefill_chunk_size}) <= "
                             f"prefill_pack_tokens ({self.prefill_pack_tokens})")

    @property
    def prefill_seqs_per_forward(self) -> int:
        """Prompts one fixed_shape prefill forward holds, and samples token 1 on: S packed, 1 isolated."""
        return self.prefill_pack_seqs if self.prefill_pack_tokens else 1

    def prefill_rows(self, num_tokens: int) -> int:
        """Token rows of the forward that prefills a chunk of num_tokens alone (isolated mode)."""
        return next((b for b in self.prefill_buckets if b >= num_tokens), num_tokens)

    @property
    def is_resolved(self) -> bool:
        return AUTO not in (self.prefill_buckets, self.decode_step_sizes, self.prefill_pack_sizes) and None not in (
            self.prefill_pack_tokens, self.prefill_token_budget, self.prefill_chunk_size, self.max_num_batched_tokens,
            self.max_num_seqs)

    @property
    def decode_wait_tokens(self) -> int:
        """The prefill token budget in force (auto: max_num_batched_tokens); 0: none. On a resolved config (an
        unresolved one may not know max_num_batched_tokens yet)."""
        budget = self.prefill_token_budget
        return self.max_num_batched_tokens if budget is None else budget


DECODE_SIZE_STEP = 16
"""Decode step candidates from this size on are its multiples (auto_decode_step_candidates)."""

SMALL_DECODE_SIZES = (1, 2, 4, 8)
"""Decode step candidates below DECODE_SIZE_STEP on CUDA: the few rows of a run's tail (stop 63)."""

PACK_SIZE_LADDER = (32, 48, 64, 96, 128, 192, 256, 320, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288,
                    16384)
"""Row counts worth trying for packed prefill: steps of at most 1.5x, so a pack pays at most half again its rows.
NOTE: from 32 since stop 40; it began at 192, the smallest count the H200 verified while cuBLAS split-K was on.
Without split-K (the default since stop 37) every GEMM row count from 1 to 8192 gives a row the same bits there
(benchmarks/results/h200_gemm_rows_no_split_k.json). A lone 64-token prompt paid 192 rows, 7.25 ms
(h200_prefill_cost_no_split_k.json); with the ladder from 32 the H200 kept every size and it took 6.24 ms, 8B
determinism unchanged (h200_prefill_cost_ladder32.json, h200_determinism_stop40.json)."""


def auto_pack_size_candidates(pack_tokens: int) -> tuple[int, ...]:
    """The ladder below T (none without packing). Only those that reproduce the T-row forward's bits are kept
    at start-up, so a generous list costs start-up time and graph memory, never outputs."""
    return tuple(size for size in PACK_SIZE_LADDER if size < pack_tokens)


def auto_decode_step_candidates(max_num_seqs: int) -> tuple[int, ...]:
    """Smaller decode steps worth trying: SMALL_DECODE_SIZES, every multiple of DECODE_SIZE_STEP below N, and every
    eighth of N from N/2 (for N = 256: 1, 2, 4, 8, 16, 32, ..., 240: mixed mode's capture_sizes). Only those that
    reproduce the N-row step's bits are kept at start-up, so a generous list costs start-up time and graph memory,
    never outputs.
    NOTE: steps of 16 since issue 20's tenth round. With the earlier set (16, 32, 64, 128, 160, 192, 224) a batch of
    65-127 requests ran at 128 rows: at Poisson ShareGPT-like 32 req/s (H200, 8B shape, one machine,
    benchmarks/results/h200_defaults_poisson_32_stop38.json) 540 of 1,996 steps ran at 128 and 477 at 64, and TPOT
    p50 was 9.70 ms against mixed mode's 9.07; the H200 kept every size from 16 to 256 there (stop 37).
    NOTE: 1, 2, 4 and 8 since stop 63. An H100 (8B shape, ShareGPT-like at t = 0, one run,
    benchmarks/results/h100_small_decode_sizes_stop63.json) kept all four, and the tail's steps of 1, 4 and 8 running
    requests took 6.87, 6.95 and 7.17 ms at them against 7.00, 7.13 and 7.26 at 16 rows (standard: 6.66, 6.85,
    7.08); full steps and start-up the same. Stop 38's H200 had kept 4 and 8 and found them no faster."""
    steps = [size for size in range(DECODE_SIZE_STEP, max_num_seqs, DECODE_SIZE_STEP)]
    eighths = [max_num_seqs * k // 8 for k in range(4, 8) if max_num_seqs * k % 8 == 0]
    return tuple(sorted({s for s in list(SMALL_DECODE_SIZES) + steps + eighths if 1 <= s < max_num_seqs}))


CPU_DECODE_SIZE_CANDIDATES = (1, 2, 4, 8, 16, 24)
"""Smaller decode steps tried on CPU (below N; each kept only if it reproduces the N-row step's bits). On CPU a padding
row costs its whole share of the step, so a few running requests decode faster at their own size. Measured on the
2-core AMD EPYC host (tiny model, N = 32, benchmarks/results/cpu_small_decode_sizes_stop62_*.json; this CPU kept 4, 8,
16 and 24): 8 requests at once 1.95x (64x32) and 1.52x (256x128) the tok/s of every step at N; 32 requests 1.11x and
1.00x; 64 requests, where every step runs at N anyway, the same steps (1.01x and 1.29x in two runs, 0.76x in another:
this host's noise). Start-up: ~0.2 s more on the tiny model."""


def resolve_shape_defaults(sched: SchedulerConfig, device: str, use_cuda_graph: bool, backend: str,
                           large_gpu: bool = False) -> SchedulerConfig:
    """The one place where 'auto' becomes sizes, by device (explicit values are kept as given). large_gpu: the
    device is a GPU of LARGE_GPU_BYTES or more that is not an A100 (corun/device_facts.py asks it).

    On CUDA with graphs: packed prefill at T = max_num_batched_tokens, each forward at the smallest verified size
    that holds its pack, and the verified smaller decode steps. Measured on the H200 (8B shape, bf16, N = 256, one
    machine, benchmarks/results/h200_pack_sizes_t0.json, issue 20): against bucketed isolated prefill (one CUDA
    graph per bucket, the default before) it gave 1.00x, 1.09x, 1.06x and 1.23x at t = 0 (ShareGPT-, BurstGPT-,
    RL-rollout-like, 1024x2048; 0.998-0.919x the graph-captured mixed mode), and at Poisson 16 req/s 294 good
    requests of 300 against 296 (mixed 287); a lone short prompt pays the smallest verified size that holds it
    (the ladder starts at 32 rows; it started at 192 until stop 40). Verified smaller decode steps carried
    743 of 962 steps at 128 rows (6.7 ms against 8.3 at 256). On CPU there are no graphs to amortise: padding rows
    are pure extra work, so prefill runs at natural length, one prompt per forward, and a decode step of a few
    requests runs at the smallest of CPU_DECODE_SIZE_CANDIDATES the CPU verifies (not every CPU keeps one: an AMX
    host kept only N; until stop 62 every CPU step ran at N, from benchmarks/results/cpu_defaults.json, whose 64
    requests ran every step at N either way). The vLLM backend runs none of them (its engine refuses them)."""
    if sched.is_resolved:
        return sched
    if sched.max_num_seqs is None:  # NOTE: replace() checks explicit decode_step_sizes against it
        sched = dataclasses.replace(sched, max_num_seqs=GPU_MAX_NUM_SEQS if device.startswith("cuda")
                                    else CPU_MAX_NUM_SEQS)
    if sched.max_num_batched_tokens is None:
        large = large_gpu and device.startswith("cuda")
        sched = dataclasses.replace(sched, max_num_batched_tokens=LARGE_GPU_BATCHED_TOKENS if large
                                    else DEFAULT_BATCHED_TOKENS)
    fast_cuda = device.startswith("cuda") and use_cuda_graph and sched.mode == "fixed_shape" and backend == "native"
    pack_tokens = sched.prefill_pack_tokens
    if pack_tokens is None:
        wanted = fast_cuda and sched.prefill_buckets in (AUTO, ())
        pack_tokens = max(sched.max_num_batched_tokens, sched.prefill_chunk_size or 0) if wanted else 0
    chunk = sched.prefill_chunk_size
    if chunk is None:
        several_per_forward = fast_cuda and pack_tokens and sched.multi_chunk_prefill
        chunk = min(SMALL_PREFILL_CHUNK, pack_tokens) if several_per_forward else DEFAULT_PREFILL_CHUNK
    buckets = sched.prefill_buckets
    if buckets == AUTO:
        wanted = fast_cuda and not pack_tokens
        longest = min(chunk, sched.max_model_len)
        buckets = tuple(b for i, b in enumerate(DEFAULT_PREFILL_BUCKETS)
                        if i == 0 or DEFAULT_PREFILL_BUCKETS[i - 1] < longest) if wanted else ()
    sizes = sched.decode_step_sizes
    if sizes == AUTO:
        on_cpu = device == "cpu" and sched.mode == "fixed_shape" and backend == "native"
        sizes = (auto_decode_step_candidates(sched.max_num_seqs) if fast_cuda else
                 tuple(size for size in CPU_DECODE_SIZE_CANDIDATES if size < sched.max_num_seqs) if on_cpu else ())
    pack_sizes = sched.prefill_pack_sizes
    if pack_sizes == AUTO:
        pack_sizes = auto_pack_size_candidates(pack_tokens) if fast_cuda else ()
    return dataclasses.replace(sched, prefill_chunk_size=chunk, prefill_pack_tokens=pack_tokens,
                               prefill_buckets=buckets, decode_step_sizes=sizes, prefill_pack_sizes=pack_sizes,
                               prefill_token_budget=sched.decode_wait_tokens)


NULL_BLOCK = 0
"""The KV block no request holds: padding rows read and write it, so a block id a node is sent must be above it."""


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    """Tokens per KV block."""
    num_blocks: int | None = None
    """Number of KV blocks; when None it is derived from memory_budget_bytes."""
    memory_budget_bytes: int | None = field(default=None, metadata=flag("--kv-cache-mib", scale=MIB))
    """KV cache memory when num_blocks is not given (the flag: in MiB). None (auto): CPU_KV_CACHE_BYTES on CPU; on
    CUDA what gpu_memory_utilization leaves beside the weights and a reserve for activations, at most twice what N
    requests of max_model_len hold (corun/kv_sizing.py), sized when the model has loaded."""
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    """CUDA, when memory_budget_bytes is auto: the share of the GPU's memory its nodes may use, weights, activations
    and KV caches together (vLLM's flag). A node never takes more than the GPU has free."""
    gpu_nodes: int = 1
    """CUDA, KV auto: the nodes on this node's GPU, itself included, each holding a reserve for its forwards and the
    model's weights (unless they share one copy: NodeConfig.weights) (the launchers set it: launch/cluster.py
    gpu_kv_split, Ray by --gpus-per-node)."""
    gpu_kv_share: float = 1.0
    """CUDA, KV auto: this node's part of the KV memory its GPU holds beside the gpu_nodes' weights and reserves
    (the launchers set it; 1.0 where a node has its GPU alone)."""
    swap_space_bytes: int | None = field(default=None, metadata=flag("--swap-space-mib", scale=MIB))
    """Host memory a decode node, a colocated node or an engine may move KV blocks to (the flag: in MiB), so that it
    may admit requests whose whole sequences (prompt + max_tokens) hold up to this much more than its KV cache: a
    request's blocks are allocated as its tokens need them, and when the cache runs out the newest requests' blocks
    are copied to host memory (pinned, taken as needed) and back, bit for bit, before they decode again
    (corun/kv_swap.py; an engine's, corun/swap_preemption.py, lets the prefix cache's chunks a paused request held go
    once copied, and copies back its own). 0: every
    request's whole sequence is reserved at admission and nothing is paused. None (auto): on CUDA
    GPU_SWAP_SHARE_OF_HOST_MEMORY of the host memory available at start-up, split among the host's GPUs; 0 on CPU."""
    enable_prefix_caching: bool = True
    """Keep the KV of full prompt chunks after use and prefill only the chunks after a prompt's longest cached
    full-chunk prefix (prefill and colocated nodes, the engine; corun/prefix_cache.py). Outputs are bitwise those of
    a cold prefill: only chunks of prefill_chunk_size tokens starting at a multiple of it are shared, whose KV a cold
    prefill computes alike. In force only in mode fixed_shape on the native engine with prefill_chunk_size a
    multiple of block_size (EngineConfig.resolved turns it off elsewhere: mixed steps' KV depends on the batch).
    Requests asking prompt_logprobs look nothing up (their chunks' rows are computed for them)."""

    def __post_init__(self):
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes < 1:
            raise ValueError("memory_budget_bytes must be >= 1")
        if self.swap_space_bytes is not None and self.swap_space_bytes < 0:
            raise ValueError(f"swap_space_bytes must be >= 0, got {self.swap_space_bytes}")
        for name in ("gpu_memory_utilization", "gpu_kv_share"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.gpu_nodes < 1:
            raise ValueError(f"gpu_nodes must be >= 1, got {self.gpu_nodes}")


KV_POOL_SIZING = ("num_blocks", "memory_budget_bytes", "gpu_memory_utilization", "gpu_nodes", "gpu_kv_share",
                  "swap_space_bytes")
"""CacheConfig's fields that size the KV pool: they decide where a request's KV lives, never what it is (left out of
the fingerprint and of the prefix cache's salt)."""


@dataclass(frozen=True)
class EngineConfig:
    model: str
    """Directory of an HF-format checkpoint (config.json, *.safetensors, tokenizer.json)."""
    dtype: EngineDType = AUTO
    """The weights' and the activations' dtype. auto: float32 on CPU, the checkpoint's half precision on CUDA
    (bfloat16 for a float32 checkpoint; resolve_dtype)."""
    device: str = "cpu"
    """torch device: cpu, cuda, cuda:1, ..."""
    seed: int = field(default=0, metadata=flag("--base-seed"))
    """Base seed for requests that bring none (their seed is derived from it and the request id)."""
    max_logprobs: int = 20
    """Top-k alternatives computed for every sampled row (a fixed width keeps the sampler shape fixed)."""
    use_cuda_graph: bool = field(default=True, metadata=flag("--cuda-graph"))
    """On CUDA, capture the N-row decode step once and replay it (--no-cuda-graph: decode steps run eagerly)."""
    num_threads: int | None = None
    """CPU compute threads (torch.set_num_threads); None keeps torch's default. Results are reproducible for a
    fixed thread count; nodes sharing a small host do better with 1 each than with spinning thread pools."""
    cublas_split_k: bool = False
    """CUDA: let cuBLAS split a GEMM's inner dimension (corun/cublas.py). Off, a row's GEMM reductions stay the same
    at more decode step sizes (the H200 keeps 16-row steps) and the 8B shape's decode GEMMs ran faster on the H200.
    Process-wide: applied when the engine is built, before CUDA starts; part of the outputs (the fingerprint)."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """How requests are batched into steps (its fields are flags of their own: --mode, --max-num-seqs, ...)."""
    cache: CacheConfig = field(default_factory=CacheConfig)
    """The paged KV cache (--block-size, --num-blocks, --kv-cache-mib)."""
    backend: Backend = field(default="native", metadata=flag("--engine", parse=canonical_backend))
    """`--engine`: native, the project's engine (corun/: Qwen3 and Llama dense models); vllm, a vLLM engine under
    the same rules (corun/vllm_backend: any model vLLM runs; needs the venv of scripts/setup_vllm.sh), mode
    fixed_shape or mixed. corun, the name before issue 22, is accepted for native (OLD_NAMES)."""

    def __post_init__(self):
        object.__setattr__(self, "backend", canonical_backend(self.backend))  # NOTE: as SchedulerConfig's mode
        if self.backend == "vllm" and self.scheduler.mode == "batch_invariant":
            raise ValueError("the vllm engine runs mode fixed_shape or mixed (vLLM's batch-invariant kernels do not "
                             "run on its CPU build)")
        if self.dtype not in get_args(EngineDType):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.max_logprobs < 0:
            raise ValueError("max_logprobs must be >= 0")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")

    def resolved(self, large_gpu: bool = False, checkpoint_dtype: str | None = None,
                 bfloat16_supported: bool = True) -> EngineConfig:
        """This config with every 'auto' shape setting and the dtype resolved for its device (large_gpu:
        resolve_shape_defaults; checkpoint_dtype, bfloat16_supported: resolve_dtype; corun/device_facts.py
        resolved_on_device asks the device and reads the checkpoint). An engine (LLMEngine, a node server, the vLLM
        engine) resolves its config once when it is built; the fingerprint hashes the result. The config as asked
        keeps 'auto', so it travels to node processes and bench variants as the user gave it."""
        sched = resolve_shape_defaults(self.scheduler, self.device, self.use_cuda_graph, self.backend, large_gpu)
        caching = self.cache.enable_prefix_caching and sched.mode == "fixed_shape" and \
            self.backend == "native" and sched.prefill_chunk_size % self.cache.block_size == 0
        dtype = resolve_dtype(self.dtype, self.device, checkpoint_dtype, bfloat16_supported)
        return dataclasses.replace(self, scheduler=sched, dtype=dtype,
                                   cache=dataclasses.replace(self.cache, enable_prefix_caching=caching))

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.scheduler.max_model_len // self.cache.block_size)


ZcopySetting = Literal["y", "n", "auto"]
TRANSFER_FLAG_PREFIX = "kv-"
"""What the flags of a node's TransferConfig start with: --kv-ucx-devices, --kv-allow-slow-reads, ..."""

KV_TRANSPORTS: dict[str, str] = {
    "nixl": "transfer.agent",
    "fake": "transfer.fake",
}
"""The KV transports, by the name TransferConfig.transport takes -> the module of transfer/ that implements it
(transfer/transport.py: a module with open_sender and open_receiver). A new transport is its own module and one line
here. NOTE: named, not imported: wire imports nothing of the project, and a node imports only the transport it runs
(the fake one loads no NIXL)."""
KVTransportName = Literal[tuple(KV_TRANSPORTS)]
"""A name in KV_TRANSPORTS (its flag offers those)."""


@dataclass(frozen=True)
class TransferConfig:
    """How a node's KV transport moves blocks: which transport, and NIXL's settings (UCX, the probe READ). Applied
    when the transport is opened; none of it changes outputs, so none of it is in the fingerprint."""

    transport: KVTransportName = "nixl"
    """The KV transport, a name in KV_TRANSPORTS: "nixl", NIXL READs over UCX (the cluster's); "fake", in one
    process (unit tests: its nodes find each other by name in that process)."""
    cuda_ipc_get_zcopy: ZcopySetting = "y"
    """UCX's CUDA-IPC READ path between processes of one host (UCX_CUDA_IPC_ENABLE_GET_ZCOPY). UCX's "auto"
    turns it on only where it sees NVLink; without it a VRAM READ falls back to software emulation through host
    memory (measured on one H200: 0.7 GB/s, against 300+ GB/s with "y")."""
    ucx_transports: tuple[str, ...] = ()
    """UCX_TLS, e.g. ("cuda_ipc", "cuda_copy", "rc", "sm", "self"); () leaves the choice to UCX."""
    ucx_devices: tuple[str, ...] = ()
    """Network devices UCX may use (NIXL's ucx_devices, e.g. ("mlx5_0:1",)); () = every device UCX finds."""
    ucx_error_handling: Literal["none", "peer"] = "none"
    """NIXL's ucx_error_handling_mode (see transfer/agent.py for what each costs)."""
    progress_thread: Literal["auto", "on", "off"] = "auto"
    """NIXL's progress thread. Without it a READ advances only inside the agents' calls, and a VRAM READ needs
    the holder's too: between two processes on one H200 a 88 MB read took 18 ms, the holder's loop turns it
    waited for. auto: on for GPU KV, off for CPU KV (on a 2-core host the thread cost ~3x bandwidth)."""
    min_vram_read_gbps: float = 5.0
    """A VRAM peer whose probe READ (at the handshake) is slower than this is on an emulated path: the decode
    node refuses it, naming the setting, unless allow_slow_reads. NOTE: the emulated path measures 0.7-0.8 GB/s on
    the H200, a direct one 60-127 GB/s idle but 11.5 GB/s with four 8B nodes busy on the same GPU (issue 13's
    topology run: 20 GB/s refused that peer once, and the retry's handshake measured 33 GB/s)."""
    allow_slow_reads: bool = False
    """Serve even with a VRAM peer whose probe READ is slower than min_vram_read_gbps."""
    copy_on_gpu: bool = True
    """A decode node reads the KV of a prefill node on its own GPU (the same device UUID) by a copy of its own from
    that node's memory mapped over CUDA IPC, not by NIXL's READ: on one H100 under load the READ took 9-23 ms on
    average where such a copy took ~1 ms (transfer/gpu_peers.py). NIXL still carries the handshake and the end of
    the read to the prefill node."""

    def __post_init__(self):
        if not isinstance(self.transport, str) or self.transport not in KV_TRANSPORTS:
            raise ValueError(f"KV transport must be one of {', '.join(KV_TRANSPORTS)}, got "
                             f"{str(self.transport)[:40]!r}")
        if self.cuda_ipc_get_zcopy not in get_args(ZcopySetting):
            raise ValueError(f"cuda_ipc_get_zcopy must be 'y', 'n' or 'auto', got {self.cuda_ipc_get_zcopy!r}")
        if self.progress_thread not in ("auto", "on", "off"):
            raise ValueError(f"progress_thread must be 'auto', 'on' or 'off', got {self.progress_thread!r}")
        if self.ucx_error_handling not in ("none", "peer"):
            raise ValueError(f"ucx_error_handling must be 'none' or 'peer', got {self.ucx_error_handling!r}")
        if not self.min_vram_read_gbps >= 0:
            raise ValueError(f"min_vram_read_gbps must be >= 0, got {self.min_vram_read_gbps}")

    def uses_progress_thread(self, vram: bool) -> bool:
        return self.progress_thread == "on" or (self.progress_thread == "auto" and vram)

    def ucx_environment(self, vram: bool) -> dict[str, str]:
        """The UCX settings that exist only as environment variables (UCX reads them when NIXL makes its
        context, i.e. in the agent's constructor). NOTE: the CUDA-IPC one only for GPU KV: a CPU-only UCX warns
        about it as unused."""
        zcopy = vram and self.cuda_ipc_get_zcopy != "auto"
        env = {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": self.cuda_ipc_get_zcopy} if zcopy else {}
        # NOTE: NIXL's ucx_devices parameter picks the devices of transfers, but UCX still listens on every
        # network device unless UCX_NET_DEVICES names them (measured: a listener on the host's public address).
        env |= {"UCX_NET_DEVICES": ",".join(self.ucx_devices)} if self.ucx_devices else {}
        return env | ({"UCX_TLS": ",".join(self.ucx_transports)} if self.ucx_transports else {})


WeightsHolding = Literal["own", "export", "import"]
WEIGHTS_FLAG_PREFIX = "weights-"
"""What the flags of a node's SharedWeightsConfig start with: --weights-holding, --weights-rendezvous, ..."""


@dataclass(frozen=True)
class SharedWeightsConfig:
    """Whether a node holds its own copy of the model's weights or one copy shared with the other nodes on its GPU
    (corun/shared_weights.py). The launchers set it (launch/cluster.py weights_sharing); it never changes outputs
    (the bytes are the same), so none of it is in the fingerprint."""

    holding: WeightsHolding = "own"
    """own: the node loads its weights for itself. export: it loads them and publishes them at rendezvous for the
    other nodes on its GPU (CUDA IPC; on CPU one memory-mapped file). import: it loads none and maps those the
    exporting node published; on CUDA it stops when that node ends (its memory goes with it)."""
    rendezvous: str | None = None
    """The file the exporting node writes when its weights are in and the importing nodes read (the launcher's
    private directory); required unless holding is own."""
    wait_s: float = 600.0
    """How long an importing node waits for the exporting node's file (it loads and publishes its weights first)."""

    def __post_init__(self):
        if self.holding not in get_args(WeightsHolding):
            raise ValueError(f"weights holding must be own, export or import, got {self.holding!r}")
        if self.holding != "own" and not self.rendezvous:
            raise ValueError(f"weights holding {self.holding} needs a rendezvous file")
        if not self.wait_s > 0:
            raise ValueError(f"weights wait_s must be > 0, got {self.wait_s}")


@dataclass(frozen=True, kw_only=True)
class NodeSettings:
    """What every node of a cluster is given alike: NodeConfig's and ClusterConfig's fields (the launchers hand
    them on by name, settings_of), so that a node setting is one field here and a flag of both command lines."""

    kv_lease_seconds: float = 60.0
    """prefill: how long a finished prefill's KV blocks wait to be claimed by a decode node before being freed,
    and how long a claimed lease waits for its READ to end (a longer wait means a dead or lost claimer)."""
    transfer: TransferConfig = field(default_factory=TransferConfig, metadata=flag(prefix=TRANSFER_FLAG_PREFIX))
    """How the node's KV agent moves blocks (its fields' flags: --kv-...)."""
    log_prefill_batches: bool = False
    """Log a line per prefill forward (SGLang's "Prefill batch" line): its prompts, tokens, cached tokens, the queue
    and the forward's start on the host's monotonic clock, which a benchmark's clients share: where a burst's time
    goes, forward by forward."""

    def __post_init__(self):
        if self.kv_lease_seconds <= 0:
            raise ValueError("kv_lease_seconds must be > 0")


@dataclass(frozen=True, kw_only=True)
class Supervised:
    """A process a launcher starts (a node, a router), which must not outlive it (wire/supervision.py)."""

    supervisor_pid: int | None = None
    """The launcher's pid, the process' parent: the process stops when that one dies (parent-death signal and a
    watch of its parent), so a killed `corun serve` leaves no cluster serving unsupervised. None: it runs on its
    own (started by hand)."""


@dataclass(frozen=True)
class NodeConfig(NodeSettings, Supervised):
    """A prefill or decode server process."""

    role: Role = field(metadata=NOT_A_FLAG)
    """prefill, decode or colocated: the program that runs (`python -m prefill_node`) says which."""
    node_id: str
    """Unique in the cluster; also the node's NIXL agent name."""
    engine: EngineConfig
    """The node's engine (its fields are the engine's flags: --model, --max-num-seqs, ...)."""
    host: str = LOCAL_HOST
    """Interface the control socket binds (0.0.0.0: all of them)."""
    # NOTE: a flag the node process must be given: 0 (bind any free port) suits in-process tests alone, since nobody
    # could reach a node process at a port it chose itself
    port: int = field(default=0, metadata=flag(required=True, parse=parse_port))
    """zmq ROUTER control port (router requests, decode->prefill handshakes and claims)."""
    advertise_host: str | None = None
    """Host the router and the other nodes reach this node at (the host's IP when it binds 0.0.0.0 on one of
    several hosts); None: host."""
    cluster_key_file: str | None = None
    """The cluster's CURVE key pair (wire.node_auth): only its holders may talk to this node. None: no
    authentication (in-process tests); the launchers always make one."""
    weights: SharedWeightsConfig = field(default_factory=SharedWeightsConfig,
                                         metadata=flag(prefix=WEIGHTS_FLAG_PREFIX))
    """Its own copy of the weights, or one shared by the nodes on its GPU (the flags: --weights-...)."""

    def __post_init__(self):
        if self.role not in get_args(Role):
            raise ValueError(f"role must be 'prefill', 'decode' or 'colocated', got {self.role!r}")
        super().__post_init__()

    @property
    def bind_address(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        """Where others reach this node; it travels in KV handles, so decode nodes on other hosts can connect."""
        return f"tcp://{self.advertise_host or self.host}:{self.port}"


METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Where a router process finds RouterConfig.metrics_dir: prometheus_client's own switch to multiprocess mode."""


@dataclass(frozen=True, kw_only=True)
class RouterSettings:
    """What an operator sets for every router of a cluster alike: RouterConfig's and ClusterConfig's fields (the
    launchers hand them on by name, settings_of), so that a router setting is one field here, a flag of both
    `python -m router` and `corun serve`, and reaches every router process that `corun serve` starts."""

    served_model_name: str | None = None
    """The model name clients send and /v1/models lists. None: the model as given (--model), as vLLM names it."""
    host: str = LOCAL_HOST
    """The interface the router's HTTP server binds (`corun serve`: the local launcher's nodes bind it too)."""
    port: int = field(default=8000, metadata=flag(parse=parse_port))
    """The router's HTTP port."""
    max_pending_requests: int = 4096
    """Samples (prompts x n) in flight, queued or running; beyond this a request gets 429 with Retry-After. NOTE:
    nodes queue what they cannot run yet, so this bounds the router's memory, not the cluster's work: it was 256, one
    decode node's rows, and of the burst vLLM's benchmark sends by default (`vllm bench serve`: 1000 prompts at once)
    743-744 got a 429 (benchmarks/results/cpu_vllm_bench_serve_pending256.log). Each pending prompt holds its token
    ids (at most max_model_len) in the router."""
    request_timeout_s: float = 600.0
    """The longest the router waits for a node to take a request, or for its next reply (a token, the end of a
    prefill), before the request ends with a 504."""
    strict_fields: bool = False
    """Unknown request fields are a 400; by default they are ignored with a warning (logged, and named in the
    response's X-CoRun-Ignored-Fields header), as vLLM does. Fields the router knows keep their kind
    (router/api/field_policy.py): harmless ones are still ignored, output-changing unsupported ones still a 400."""
    trust_request_chat_template: bool = False
    """Requests may bring their own chat_template (as vLLM's --trust-request-chat-template); by default that is a
    400: a template is code the parser runs (in a sandbox, but with no bound on its time)."""
    api_key: str | None = field(default=None, repr=False, metadata=flag(environment=API_KEY_ENV))
    """Every request but /health, /version and /metrics needs `Authorization: Bearer <api_key>` (else 401);
    None: no key, as vLLM without --api-key. Out of repr, so that no log line shows it, and handed to a router
    process in VLLM_API_KEY, never on its command line (which `ps` shows)."""
    enable_node_pinning: bool = False
    """Honour the X-CoRun-Prefill-Node / X-CoRun-Decode-Node headers (tests, debugging). A test hook: it lets a
    client aim load at one node, so it is off unless asked for, and a request carrying the headers is a 400."""
    max_request_bytes: int = 32 * MIB
    """Larger request bodies get a 413. 32 MiB holds the longest prompt a served context can take in any form (1M
    tokens as a token-id list is ~8 MiB, as text ~4 MiB) several times over, and bounds what one request makes
    the router parse (measured: json.loads of 30 MiB of nested junk takes 2 s of CPU)."""
    header_timeout_s: float = 20.0
    """A connection is closed when a request's headers have not all arrived this long after it opened or after
    its previous response (slowloris). NOTE: aiohttp keeps one timer for this and for idle keep-alive
    connections, so those close after it too: 20 s outlasts the idle keep-alive of httpx (5 s: openai, guidellm)
    and aiohttp's client (15 s), so that the client closes first and never sends into a closing connection.
    Behind a proxy that keeps idle connections longer (often 60 s), raise it above the proxy's."""
    listen_backlog: int = 2048
    """Connections the kernel completes and queues for the router's HTTP port before the router accepts them
    (listen()'s backlog, capped by the host's net.core.somaxconn): past it a client's SYN is dropped and its connect
    retried only after 1 s, then 3 s. 2048, uvicorn's default (vLLM's and SGLang's servers): aiohttp's 128 dropped
    212 of 1,024 requests sent at t = 0 (multiple choice from 2 client processes, `benchmarks.router_burst`, this
    2-core host), which then waited a second for their retry: TTFT p99 1.13 s, against 0.69 s and no drop at 2048.
    NOTE: asyncio also accepts up to this many connections per loop turn."""
    body_timeout_s: float = 60.0
    """A request body must have arrived this long after its headers, else 408 and the connection closes
    (a trickled body). 60 s: max_request_bytes at ~0.5 MB/s."""
    client_api_keys_file: str | None = None
    """A file of client API keys, one a line (blank lines and lines starting with # are skipped): each is accepted
    as --api-key is, except by the admin API, and each is a client of its own for the per-client limits. Needs
    --api-key, the operator's key: the admin API's and the launcher's (its requests are one more client). None:
    only --api-key, if any."""
    max_client_requests: int | None = None
    """Requests of one client (an API key; all requests are one client when the router has no key) in the router at
    once, parsing, waiting or generating: one more gets 429 with Retry-After before its body is read. None: no
    per-client limit (max_pending_requests still holds). These limits are each router process' own: with
    `corun serve --routers K` a client may hold K times them (the launcher warns)."""
    max_client_decode_slots: int | None = None
    """Samples (each prompt's n) of one client generating at once: a request that would go over waits, in that
    client's own queue, for its earlier requests to end; one that needs more on its own gets 400. Set it below the
    decode slots of the pool (decode nodes x max_num_seqs), so that no client can hold them all. None: no limit."""
    max_client_queued_requests: int | None = None
    """Requests of one client waiting for its decode slots: one more gets 429 with Retry-After. None: as many as
    max_client_requests lets in."""
    routing_policy: Literal["least_outstanding_work", "prefix_aware"] = "least_outstanding_work"
    """How the router picks a prefill node (router/nodes/choice.py): least_outstanding_work, the least loaded;
    prefix_aware, the node the prompt's longest full-chunk prefix was last sent to (it likely holds that KV in its
    prefix cache), unless its queued prompt tokens exceed the least loaded node's by more than the prefix's tokens.
    Changes only where a prompt is prefilled, never its outputs."""
    enable_prompt_tokens_details: bool = False
    """usage.prompt_tokens_details.cached_tokens in responses (prompt tokens whose KV came from the nodes' prefix
    caches; sent only when some were), as vLLM's --enable-prompt-tokens-details."""
    enable_tokenizer_info_endpoint: bool = False
    """Serve GET /tokenizer_info (vLLM's flag of the same name): the tokenizer's configuration as
    tokenizer_config.json has it, chat template included. Off by default, as vLLM's: it shows the template and the
    tokenizer's settings to every client."""
    parse_timeout_s: float = 30.0
    """A request body parsed in one of the router's parser processes (JSON, chat template, tokenizing) that takes
    longer gets a 413, and its process is stopped. A prompt is refused unencoded once it has more characters than
    the context's tokens can hold, so this is a backstop: 30 s is ~30 MB of ordinary text on a slow core."""

    def __post_init__(self):
        if self.max_pending_requests < 1:
            raise ValueError("max_pending_requests must be >= 1")
        check_api_key(self.api_key)
        if self.client_api_keys_file is not None and self.api_key is None:
            raise ValueError("client API keys (client_api_keys_file) need the operator's key too (api_key, or "
                             f"{API_KEY_ENV}): the admin API and the launcher use it")
        for name in ("max_request_bytes", "listen_backlog"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name, lowest in CLIENT_LIMIT_LOWEST.items():
            if getattr(self, name) is not None and getattr(self, name) < lowest:
                raise ValueError(f"{name} must be >= {lowest} (or unset), got {getattr(self, name)}")
        for name in ("header_timeout_s", "body_timeout_s", "parse_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


CLIENT_LIMIT_LOWEST = {"max_client_requests": 1, "max_client_decode_slots": 1, "max_client_queued_requests": 0}
"""RouterSettings' per-client limits (router/api/clients.py) -> the least each may be set to."""


@dataclass(frozen=True)
class RouterConfig(RouterSettings, Supervised):
    """The HTTP front door: one router process."""

    model: str
    """Checkpoint directory: the router reads only its tokenizer files (the model's limits come from the nodes)."""
    prefill_addresses: tuple[str, ...] = field(metadata=flag("--prefill-address", repeat=True, metavar="ADDR"))
    """Prefill nodes' zmq addresses, e.g. tcp://10.0.0.1:7001 (the flag once per node)."""
    decode_addresses: tuple[str, ...] = field(metadata=flag("--decode-address", repeat=True, metavar="ADDR"))
    """Decode nodes' zmq addresses (the flag once per node)."""
    colocated_addresses: tuple[str, ...] = field(default=(), metadata=flag("--colocated-address", repeat=True,
                                                                           metavar="ADDR"))
    """Nodes that prefill and decode a request in one process (colocated_node/), beside or instead of the P/D pools
    (the flag once per node)."""
    base_seed: int = EngineConfig.seed
    """Seeds of requests that bring none are derived from it and the request id (`corun serve` gives the engine's
    --base-seed)."""
    cluster_key_file: str | None = None
    """The cluster's CURVE key pair (wire.node_auth), without which nodes that have one refuse the router."""
    reuse_port: bool = False
    """Listen with SO_REUSEPORT, so that several router processes serve one port (`corun serve --routers K`): the
    kernel spreads new connections over them."""
    control_port: int | None = field(default=None, metadata=flag(parse=parse_port))
    """One of several routers: a second listener, on this port of the same host, where this process alone answers
    /health, /metrics (its own series) and the /admin/nodes API. The public port then refuses /admin/nodes (a pool
    change must reach every router: `corun scale` does that), and its /metrics is every router's, summed
    (prometheus_client's multiprocess mode: PROMETHEUS_MULTIPROC_DIR, which the launcher sets). None: one router,
    every route on the public port."""
    # NOTE: no flag: prometheus_client reads the variable when it is imported, so the process must have it anyway
    metrics_dir: str | None = field(default=None, metadata=flag(is_flag=False, environment=METRICS_DIR_ENV))
    """One of several routers: prometheus_client's multiprocess directory, where every router writes its series
    and from which each one's /metrics sums them. The router's process must have it as PROMETHEUS_MULTIPROC_DIR in
    its environment (the library reads that when it is imported; `python -m router` takes it from there)."""
    instance_name: str = ""
    """Prefix of the ids this router gives its requests on the nodes, different for each router of a cluster, so
    that two routers never send a node the same id (a client's X-Request-Id is unique only per router). Changes
    no output: seeds come from the client's request id."""

    def __post_init__(self):
        if self.control_port is not None and self.control_port not in PORTS:
            raise ValueError(f"control_port must be a port number, got {self.control_port}")
        name = self.instance_name
        if name and not (name.isascii() and name.replace("-", "").isalnum()):
            raise ValueError(f"instance_name must be ASCII letters, digits and '-', got {self.instance_name!r}")
        if not (self.prefill_addresses and self.decode_addresses or self.colocated_addresses):
            raise ValueError("the router needs at least one prefill and one decode address, or a colocated one")
        if bool(self.prefill_addresses) != bool(self.decode_addresses):
            raise ValueError("prefill and decode nodes come in pairs: give both kinds of address, or neither")
        if self.served_model_name is None:
            object.__setattr__(self, "served_model_name", self.model)
        super().__post_init__()


def settings_of(config, settings_class: type) -> dict:
    """The fields of settings_class (a base of config's class: NodeSettings, RouterSettings) as config holds them:
    what a launcher hands on from its cluster's config to a node's or a router's."""
    return {settings.name: getattr(config, settings.name) for settings in dataclasses.fields(settings_class)}
