"""Every vLLM setting of `--engine vllm`, made from corun's EngineConfig in one place (CPU and CUDA).

fixed_shape mode: FixedShapeVllmScheduler (Algorithms 1 and 2), request-keyed sampling, decode at exactly N rows, no
split-KV attention, no prefix caching (a cache hit changes a prompt's prefill shape, and with it its bits, by what
ran before), no async scheduling. mixed mode: vLLM's own scheduling and kernel choices (chunked prefill mixed with
decode, batch-sized shapes, split-KV), with the same request-keyed sampling: what the inverse check compares.

CUDA (written and reviewed against vLLM 0.32; not run here, since the CUDA vLLM wheel does not fit the H200 test
machine): the decode step is one full CUDA graph captured at N (cudagraph_mode FULL_DECODE_ONLY, capture sizes
[N]: vLLM pads every decode batch of <= N requests to N and replays it; prefills run eager at their own shape),
FlashAttention's decode splits are fixed at 1 (flash_attn_max_num_splits_for_cuda_graph), so a request's
attention reduces over its own KV in one order whatever else runs, and worker.FixedDecodeShape pads the eager
lm_head GEMM after the graph (vLLM runs it on the sampled rows only) to N rows.
"""

from __future__ import annotations

import hashlib
import json

from corun.device_facts import resolved_on_device
from corun.models.config import eos_token_ids_of
from wire.config import CPU_KV_CACHE_BYTES, EngineConfig

CORUN_CHUNK_SIZE_KEY = "corun_prefill_chunk_size"
"""vllm_config.additional_config key: the chunk size FixedShapeVllmScheduler cuts prompts at."""

SCHEDULER_CLS = "corun.vllm_backend.scheduler.FixedShapeVllmScheduler"
WORKER_EXTENSION_CLS = "corun.vllm_backend.worker.FixedDecodeShape"
SAMPLER_CLS = "corun.vllm_backend.sampling:RequestKeyedSampler"


def vllm_environment(config: EngineConfig) -> dict[str, str]:
    """Variables vLLM reads from the environment, set before the engine starts (engine.start_vllm_engine)."""
    env = {
        # NOTE: one process, one executor: the engine, its scheduler and its worker share this process, so the
        # node's NIXL agent registers the worker's KV tensors directly (and start-up takes seconds, not a minute)
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        # NOTE: CPU attention's KV split is planned from the whole batch (number of requests and their lengths)
        "VLLM_CPU_ATTN_SPLIT_KV": "0" if config.scheduler.mode == "fixed_shape" else "1",
    }
    if config.num_threads is not None and config.device == "cpu":
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0" if config.num_threads == 1 else f"0-{config.num_threads - 1}"
    return env


def vllm_kv_budget(config: EngineConfig) -> dict:
    """vLLM's KV settings: --kv-cache-mib as given; auto: CPU_KV_CACHE_BYTES on CPU, vLLM's own sizing from
    gpu_memory_utilization (its profile run) on CUDA."""
    budget = config.cache.memory_budget_bytes
    if budget is None and config.device.startswith("cuda"):
        return {"gpu_memory_utilization": config.cache.gpu_memory_utilization}
    return {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES if budget is None else budget}


def vllm_engine_kwargs(config: EngineConfig) -> dict:
    """vllm.EngineArgs keywords for this configuration."""
    config = resolved_on_device(config)  # NOTE: the chunk size's and the dtype's 'auto', as this backend resolves them
    sched = config.scheduler
    fixed_shape = sched.mode == "fixed_shape"
    kwargs = {
        "model": config.model, "tokenizer": config.model, "skip_tokenizer_init": True, "dtype": config.dtype,
        "seed": config.seed, "max_num_seqs": sched.max_num_seqs, "max_model_len": sched.max_model_len,
        "block_size": config.cache.block_size, **vllm_kv_budget(config),
        "max_logprobs": config.max_logprobs, "enable_prefix_caching": False, "async_scheduling": False,
        "distributed_executor_backend": "uni", "disable_log_stats": True,
        "logits_processors": [SAMPLER_CLS], "worker_extension_cls": WORKER_EXTENSION_CLS,
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": max(sched.prefill_chunk_size, sched.max_num_seqs) if fixed_shape
        else sched.max_num_batched_tokens,
    }
    if fixed_shape:
        kwargs["scheduler_cls"] = SCHEDULER_CLS
        kwargs["additional_config"] = {CORUN_CHUNK_SIZE_KEY: sched.prefill_chunk_size}
    if config.device == "cpu":
        kwargs["enforce_eager"] = True  # NOTE: no static graphs on CPU; the fixed shape comes from padding
    elif fixed_shape:
        kwargs["compilation_config"] = {"cudagraph_mode": "FULL_DECODE_ONLY",
                                        "cudagraph_capture_sizes": [sched.max_num_seqs]}
        kwargs["attention_config"] = {"flash_attn_max_num_splits_for_cuda_graph": 1}
    return kwargs


def vllm_kv_layout(config: EngineConfig) -> str:
    """transfer.compat's kv_layout for a vLLM node: the version, the per-layer layout, every vLLM setting."""
    import vllm

    # NOTE: but the KV pool's size, which places KV but does not change it (prefill and decode nodes may differ)
    kwargs = {k: v for k, v in vllm_engine_kwargs(config).items() if k not in vllm_kv_budget(config)}
    settings = json.dumps({**kwargs, "environment": vllm_environment(config)}, sort_keys=True, default=str)
    digest = hashlib.sha256(settings.encode()).hexdigest()[:16]
    return f"vllm {vllm.__version__}: per-layer segments [blocks,kv_heads,block,2*head_dim]; settings {digest}"


def eos_token_ids(model_config) -> tuple[int, ...]:
    """The model's EOS ids as corun's engine takes them (config.json's and generation_config.json's), from vLLM's
    ModelConfig."""
    return eos_token_ids_of(model_config.model, getattr(model_config.hf_config, "eos_token_id", None))
