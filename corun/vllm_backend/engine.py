"""VllmEngine: a vLLM engine behind corun.engine.LLMEngine's interface (add_request, abort_request, step), so
corun.LLM(..., backend="vllm") and `corun generate --engine vllm` run it unchanged.

Lifecycle of a request: corun Request -> vLLM request (greedy, corun's params and seed in extra_args) -> vLLM's
queues under FixedShapeVllmScheduler (waiting -> running, prefilling chunk by chunk -> decoding) -> its outputs copied
back to the corun Request (tokens, logprobs, finish reason) each step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from corun.device_facts import resolved_on_device
from corun.request import Request
from corun.scheduler import RequestRejected, check_engine_request
from corun.vllm_backend.engine_args import eos_token_ids, vllm_engine_kwargs, vllm_environment
from wire.config import EngineConfig
from wire.outputs import TokenLogprobs
from wire.sampling_params import SamplingParams
from wire.seeding import seed_from_request_id

CPU_BLOCK_MULTIPLE = 32
"""vLLM 0.32's CPU attention kernel takes blocks of a multiple of 32 tokens."""


def start_vllm_engine(config: EngineConfig):
    """vLLM's LLMEngine, in this process, under the settings of engine_args."""
    if config.device == "cpu" and config.cache.block_size % CPU_BLOCK_MULTIPLE:
        raise ValueError(f"vLLM's CPU attention needs --block-size a multiple of {CPU_BLOCK_MULTIPLE}, got "
                         f"{config.cache.block_size}")
    os.environ.update(vllm_environment(config))
    try:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine as VllmLLMEngine
    except ImportError as error:
        raise ValueError(f"--engine vllm needs vLLM ({error}): run from .venv-vllm (bash scripts/setup_vllm.sh), "
                         "e.g. .venv-vllm/bin/corun serve --engine vllm ...") from None

    engine = VllmLLMEngine.from_engine_args(EngineArgs(**vllm_engine_kwargs(config)))
    engine.collective_rpc("corun_count_forward_rows")
    if config.scheduler.mode == "fixed_shape":
        engine.collective_rpc("corun_fix_decode_shape", args=(config.scheduler.max_num_seqs,))
    return engine


def vllm_params(params: SamplingParams, seed: int, num_prompt_tokens: int, key: str = "",
                with_prompt_logprobs: bool = True, stop_token_ids: frozenset[int] = frozenset()):
    """The vLLM request's params: greedy without controls (sampling.RequestKeyedSampler chooses each token),
    stopping on stop_token_ids (the corun request's: its own and, unless ignore_eos, the model's EOS, which vLLM
    without a tokenizer does not know); prompt logprobs from vLLM (each chunk's rows through lm_head and
    log_softmax together: a function of the prompt alone under isolated prefill)."""
    from vllm import SamplingParams as VllmSamplingParams

    from corun.vllm_backend.sampling import to_extra_args

    return VllmSamplingParams(
        temperature=0.0, max_tokens=params.max_tokens,
        stop_token_ids=sorted(stop_token_ids), ignore_eos=True, logprobs=params.logprobs,
        prompt_logprobs=params.prompt_logprobs if with_prompt_logprobs else None, detokenize=False,
        extra_args=to_extra_args(params, seed, num_prompt_tokens, key))


def token_logprobs(token_id: int, entries: dict, num_top: int) -> TokenLogprobs:
    """vLLM's {token id: Logprob(logprob, rank)} of one position -> corun's TokenLogprobs."""
    top = sorted(((lp.rank, tid, lp.logprob) for tid, lp in entries.items() if lp.rank <= num_top))
    return TokenLogprobs(token_id, entries[token_id].logprob, tuple((tid, lp) for _, tid, lp in top[:num_top]))


def prompt_token_logprobs(prompt_token_ids: list[int], entries: list, num_top: int) -> list[TokenLogprobs | None]:
    """vLLM's RequestOutput.prompt_logprobs (None, then {token id: Logprob} per prompt token) -> corun's."""
    return [None, *(token_logprobs(token_id, position, num_top)
                    for token_id, position in zip(prompt_token_ids[1:], entries[1:], strict=True))]


@dataclass
class EngineCounts:
    num_prefill_forwards: int = 0
    num_decode_steps: int = 0
    max_decode_batch: int = 0
    num_preempted: int = 0


class VllmEngine:
    def __init__(self, config: EngineConfig):
        self.config = config = resolved_on_device(config)
        self.vllm = start_vllm_engine(config)
        self.eos_token_ids = frozenset(eos_token_ids(self.vllm.model_config))
        self.vocab_size = self.vllm.model_config.get_vocab_size()
        self.requests: dict[str, Request] = {}

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> Request:
        # NOTE: the empty prompt and max_model_len included, which vLLM would only log
        check_engine_request(request_id, prompt_token_ids, params, self.config, self.vocab_size)
        if params.logprob_token_ids is not None:
            # NOTE: here vLLM computes the logprobs itself; vLLM's logprob_token_ids gave -inf entries in measured
            # runs (issue 24). The vLLM backend's nodes (runner.py) sample with corun's Sampler and support it.
            raise RequestRejected(f"request {request_id}: logprob_token_ids is not supported on the colocated vLLM "
                                  "engine")
        seed = params.seed if params.seed is not None else seed_from_request_id(request_id, self.config.seed)
        request = Request.create(request_id, prompt_token_ids, params, seed, self.eos_token_ids)
        self.vllm.add_request(request_id, {"prompt_token_ids": list(prompt_token_ids)},
                              vllm_params(params, seed, len(prompt_token_ids), stop_token_ids=request.stop_token_ids))
        self.requests[request_id] = request
        return request

    def abort_request(self, request: Request) -> None:
        if self.requests.pop(request.request_id, None) is not None:
            self.vllm.abort_request([request.request_id])
            request.finish_reason = request.finish_reason or "abort"

    def reset_prefix_cache(self) -> int:
        """No prefix cache here (EngineConfig.resolved turns it off for this backend)."""
        return 0

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def step(self) -> list:
        for output in self.vllm.step():
            request = self.requests.get(output.request_id)
            if request is not None:
                if output.prompt_logprobs and not request.prompt_logprobs:
                    request.prompt_logprobs = prompt_token_logprobs(request.prompt_token_ids, output.prompt_logprobs,
                                                                    request.params.prompt_logprobs)
                self.update(request, output.outputs[0], output.finished)
        return []

    def update(self, request: Request, completion, finished: bool) -> None:
        num_top = request.params.logprobs
        for i in range(len(request.output_token_ids), len(completion.token_ids)):
            token_id = completion.token_ids[i]
            logprobs = None if num_top is None else token_logprobs(token_id, completion.logprobs[i], num_top)
            request.append_token(token_id, logprobs)
        if finished:
            request.finish_reason = "stop" if completion.finish_reason == "stop" else completion.finish_reason
            del self.requests[request.request_id]

    def counts(self) -> EngineCounts:
        """Steps as FixedShapeVllmScheduler made them (in-process engine core)."""
        scheduler = self.vllm.engine_core.engine_core.scheduler
        return EngineCounts(*(getattr(scheduler, name, 0) for name in
                              ("num_prefill_steps", "num_decode_steps", "max_decode_rows", "num_preempted")))

    def forward_rows(self) -> dict[str, dict[int, int]]:
        """Token rows -> how many model forwards ("forward") and lm_head calls ("logits") had that many
        (worker.FixedDecodeShape)."""
        return self.vllm.collective_rpc("corun_forward_rows_seen")[0]
