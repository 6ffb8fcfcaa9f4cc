"""What an engine returns per request (torch-free: shared with the wire protocol and the router)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Annotated

import msgspec

Logprob = Annotated[float, msgspec.Meta(le=sys.float_info.max)]
"""A float that is not NaN (nor +inf) when msgspec decodes it: NaN fails every bound; -inf passes."""


@dataclass(frozen=True)
class TokenLogprobs:
    token_id: int
    logprob: Logprob
    """Log-probability of the sampled token under the model's raw distribution."""
    top: tuple[tuple[int, Logprob], ...] = ()
    """The most likely (token id, logprob) pairs, most likely first."""


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None
    finish_reason: str | None
    seed: int | None = None
    """The seed this sample was drawn with (sample i of n: wire.seeding.sample_seed(request seed, i))."""

    @property
    def cumulative_logprob(self) -> float | None:
        return None if self.logprobs is None else sum(lp.logprob for lp in self.logprobs)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    seed: int
    finished: bool
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    """SamplingParams.prompt_logprobs set: one per prompt token, None for the first."""
    num_cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache (vLLM's RequestOutput.num_cached_tokens; the first
    sample's)."""
