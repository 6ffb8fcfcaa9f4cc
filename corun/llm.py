"""Offline API in the style of vLLM's `LLM.generate(prompts, SamplingParams)`."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from corun.engine import LLMEngine
from corun.models.presets import is_random_spec
from corun.request import Request
from wire.config import CacheConfig, EngineConfig, SchedulerConfig
from wire.outputs import CompletionOutput, RequestOutput
from wire.sampling_params import SamplingParams
from wire.seeding import sample_seed, seed_from_request_id
from wire.tokenizer import load_tokenizer

Prompt = str | Sequence[int]


class LLM:
    def __init__(self, model: str, *, mode: str = SchedulerConfig.mode,
                 max_num_seqs: int | None = SchedulerConfig.max_num_seqs,
                 max_model_len: int = SchedulerConfig.max_model_len,
                 prefill_chunk_size: int | None = SchedulerConfig.prefill_chunk_size,
                 max_num_batched_tokens: int | None = SchedulerConfig.max_num_batched_tokens,
                 block_size: int = CacheConfig.block_size, num_blocks: int | None = CacheConfig.num_blocks,
                 dtype: str = EngineConfig.dtype, device: str = EngineConfig.device, seed: int = EngineConfig.seed,
                 use_cuda_graph: bool = EngineConfig.use_cuda_graph,
                 num_threads: int | None = EngineConfig.num_threads, backend: str = EngineConfig.backend,
                 enable_prefix_caching: bool = CacheConfig.enable_prefix_caching,
                 async_scheduling: bool = SchedulerConfig.async_scheduling,
                 gpu_memory_utilization: float = CacheConfig.gpu_memory_utilization,
                 kv_cache_memory_bytes: int | None = CacheConfig.memory_budget_bytes):
        """The common engine settings as keywords (defaults: the config dataclasses'; the KV cache's by vLLM's
        names: gpu_memory_utilization, kv_cache_memory_bytes); LLM.from_config takes any EngineConfig."""
        self.config = EngineConfig(
            model=model, dtype=dtype, device=device, seed=seed, use_cuda_graph=use_cuda_graph, num_threads=num_threads,
            backend=backend,
            scheduler=SchedulerConfig(mode=mode, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                      prefill_chunk_size=prefill_chunk_size,
                                      max_num_batched_tokens=max_num_batched_tokens,
                                      async_scheduling=async_scheduling),
            cache=CacheConfig(block_size=block_size, num_blocks=num_blocks, memory_budget_bytes=kv_cache_memory_bytes,
                              gpu_memory_utilization=gpu_memory_utilization,
                              enable_prefix_caching=enable_prefix_caching))
        self._start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm.config = config
        llm._start()
        return llm

    def _start(self) -> None:
        self.engine = LLMEngine(self.config) if self.config.backend == "native" else _vllm_engine(self.config)
        # NOTE: random-weight presets (benchmarks) have no tokenizer: prompts are token ids, text is empty.
        self.tokenizer = None if is_random_spec(self.config.model) else load_tokenizer(self.config.model)
        self.request_counter = itertools.count()

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order."""
        prompts = [prompts] if _is_single_prompt(prompts) else list(prompts)
        params = _params_per_prompt(sampling_params, len(prompts))
        added: list[tuple[str, int, list[Request]]] = []
        try:
            for prompt, p in zip(prompts, params, strict=True):
                added.append(self.add(prompt, p))
        except ValueError:
            for _, _, samples in added:  # NOTE: all or nothing, so no orphan runs in the next call
                for request in samples:
                    self.engine.abort_request(request)
            raise
        while self.engine.has_unfinished():
            self.engine.step()
        return [self.to_output(request_id, seed, samples, p if isinstance(p, str) else None)
                for (request_id, seed, samples), p in zip(added, prompts, strict=True)]

    def add(self, prompt: Prompt, params: SamplingParams) -> tuple[str, int, list[Request]]:
        """-> (request id, request seed, one engine request per sample).

        NOTE: each of the n samples is its own engine request with seed sample_seed(seed, i), prefilled alone as
        any request is here (the cluster prefills the prompt once and copies its KV to the samples)."""
        if isinstance(prompt, str) and self.tokenizer is None:
            raise ValueError(f"{self.config.model} has no tokenizer: pass prompts as token ids")
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        request_id = str(next(self.request_counter))
        if params.n == 1:
            request = self.engine.add_request(request_id, token_ids, params)
            return request_id, request.seed, [request]
        seed = params.seed if params.seed is not None else seed_from_request_id(request_id, self.config.seed)
        samples = []
        try:
            for index in range(params.n):
                sample_params = dataclasses.replace(params, n=1, seed=sample_seed(seed, index))
                samples.append(self.engine.add_request(f"{request_id}-{index}", token_ids, sample_params))
        except ValueError:
            for request in samples:
                self.engine.abort_request(request)
            raise
        return request_id, seed, samples

    def to_output(self, request_id: str, seed: int, samples: list[Request], prompt: str | None) -> RequestOutput:
        completions = []
        for index, request in enumerate(samples):
            logprobs = request.output_logprobs if request.params.logprobs is not None else None
            text = self.tokenizer.decode(request.output_token_ids) if self.tokenizer else ""
            completions.append(CompletionOutput(index, text, list(request.output_token_ids), logprobs,
                                                request.finish_reason, request.seed))
        first = samples[0]
        prompt_logprobs = first.prompt_logprobs if first.params.prompt_logprobs is not None else None
        return RequestOutput(request_id, prompt, first.prompt_token_ids, completions, seed,
                             finished=all(r.finish_reason is not None for r in samples),
                             prompt_logprobs=prompt_logprobs, num_cached_tokens=first.num_cached_tokens)

    def reset_prefix_cache(self) -> int:
        """Forget every cached prompt chunk (vLLM's LLM.reset_prefix_cache); -> the KV blocks freed now."""
        return self.engine.reset_prefix_cache()


def _vllm_engine(config: EngineConfig):
    from corun.vllm_backend.engine import VllmEngine  # NOTE: vLLM is only installed in scripts/setup_vllm.sh's venv

    return VllmEngine(config)


def _is_single_prompt(prompts) -> bool:
    return isinstance(prompts, str) or (len(prompts) > 0 and isinstance(prompts[0], int))


def _params_per_prompt(params, num_prompts: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * num_prompts
    if isinstance(params, SamplingParams):
        return [params] * num_prompts
    if len(params) != num_prompts:
        raise ValueError(f"got {len(params)} sampling params for {num_prompts} prompts")
    return list(params)
