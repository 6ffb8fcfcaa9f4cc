"""Request-keyed sampling inside a vLLM engine, as a logits processor.

vLLM samples with per-request torch.Generators (or one global one), whose state depends on how many draws a
request already made in this engine. Here every request reaches vLLM greedy (temperature 0, no controls) and
carries its real corun SamplingParams and seed in `extra_args`; this processor samples each row with
corun.sampler.sample_token_ids (bias, min_tokens, penalties, temperature, min_p, top-k, top-p, then Gumbel-max with
noise murmur3(seed, position, vocab index)) and leaves the row -inf except 0 at the token it chose, so vLLM's greedy
argmax takes that token. vLLM computes logprobs from the raw logits before any processor ("raw_logprobs"), as
corun's sampler does.

The processor also keeps each step's raw logits rows by request key: runner.VllmModelRunner samples them again with
corun's own Sampler (n first tokens, logprobs by stable sort), exactly as corun's ModelRunner does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.interface import MoveDirectionality

from corun.request import stop_ids_of
from corun.sampler import SamplingBatch, sample_token_ids
from corun.vllm_backend.engine_args import eos_token_ids
from wire.sampling_params import SamplingParams

EXTRA_ARGS_KEY = "corun"
"""vllm.SamplingParams.extra_args[EXTRA_ARGS_KEY] = to_extra_args(...)."""


def to_extra_args(params: SamplingParams, seed: int, num_prompt_tokens: int, key: str = "") -> dict:
    """What a vLLM request carries for this processor. num_prompt_tokens: the corun prompt's length, which is
    shorter than vLLM's prompt on a decode node (there vLLM's prompt ends with token 1, sampled by prefill).
    key: names the request's rows in RequestKeyedSampler.last_logits."""
    return {EXTRA_ARGS_KEY: {"params": dataclasses.asdict(params), "seed": seed,
                             "num_prompt_tokens": num_prompt_tokens, "key": key}}


@dataclass
class RowState:
    """A row of vLLM's persistent batch, as the sampler sees it (corun.sampler.TokenHistory)."""

    params: SamplingParams
    seed: int
    num_prompt_tokens: int
    vllm_prompt_ids: list[int]
    vllm_output_ids: list[int]
    """vLLM's live list of the request's outputs (the processor API hands a reference)."""
    key: str = ""
    stop_token_ids: frozenset[int] = frozenset()
    """What min_tokens masks: the request's stop tokens and the model's EOS (unless ignore_eos), as corun.Request."""

    @property
    def position(self) -> int:
        """Absolute position of the token being sampled: the tokens before it."""
        return len(self.vllm_prompt_ids) + len(self.vllm_output_ids)

    # NOTE: TokenHistory (corun.sampler), in corun's split: a decode node's vLLM prompt ends with output tokens.
    @property
    def prompt_token_ids(self) -> list[int]:
        return self.vllm_prompt_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return [*self.vllm_prompt_ids[self.num_prompt_tokens:], *self.vllm_output_ids]


def row_state(vllm_params, prompt_ids: list[int] | None, output_ids: list[int],
              eos_ids: frozenset[int]) -> RowState:
    extra = (vllm_params.extra_args or {}).get(EXTRA_ARGS_KEY)
    if extra is None:
        raise ValueError("a request reached the CoRun vLLM engine without its corun sampling parameters "
                         "(submit it through corun.vllm_backend)")
    params = SamplingParams(**extra["params"])
    return RowState(params, int(extra["seed"]), int(extra["num_prompt_tokens"]), prompt_ids or [], output_ids,
                    str(extra.get("key", "")), stop_ids_of(params, eos_ids))


class RequestKeyedSampler(LogitsProcessor):
    """Samples every row; its rows' states follow vLLM's persistent batch (added, removed, moved)."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.device = device
        self.rows: dict[int, RowState] = {}
        self.last_logits: dict[str, torch.Tensor] = {}
        """Request key -> its raw logits row [vocab] of the last step (keyed rows only: the nodes' runner)."""
        self.eos_token_ids = frozenset(eos_token_ids(vllm_config.model_config))

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        extra = (sampling_params.extra_args or {}).get(EXTRA_ARGS_KEY)
        if extra is not None:
            SamplingParams(**extra["params"])

    def is_argmax_invariant(self) -> bool:
        return False  # NOTE: it chooses the token: vLLM must run it for greedy batches too

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, prompt_ids, output_ids in batch_update.added:
            self.rows[index] = row_state(params, prompt_ids, output_ids, self.eos_token_ids)
        for a, b, direction in batch_update.moved:
            moved_a, moved_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if moved_a is not None:
                self.rows[b] = moved_a
            if direction == MoveDirectionality.SWAP and moved_b is not None:
                self.rows[a] = moved_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        num_rows = logits.shape[0]
        states = [self.rows[i] for i in range(num_rows)]
        batch = SamplingBatch.build([s.params for s in states], [s.seed for s in states],
                                    [s.position for s in states], num_rows, logits.device,
                                    histories=states)
        # NOTE: vLLM hands the raw logits (float32) and does not write to them after this processor
        self.last_logits = {s.key: logits[i] for i, s in enumerate(states) if s.key}
        token_ids = sample_token_ids(logits.float(), batch)  # [rows]
        chosen = torch.full_like(logits, float("-inf"))
        return chosen.scatter_(1, token_ids[:, None], 0.0)
