"""A request's state inside an engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING

from wire.outputs import TokenLogprobs

if TYPE_CHECKING:
    from corun.kv_swap import SwappedBlocks
    from corun.prefix_cache import CachedChunk
from wire.sampling_params import SamplingParams


class RequestStatus(IntEnum):
    WAITING = 0
    RUNNING = 1
    FINISHED = 2


def stop_ids_of(params: SamplingParams, eos_token_ids: frozenset[int]) -> frozenset[int]:
    """What a request stops on: its own stop ids plus the model's EOS ids unless ignore_eos."""
    return frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else eos_token_ids)


@dataclass(eq=False)
class Request:
    # NOTE: identity equality: a request is an entity, and queue membership tests (`in`, `remove`) must not
    # compare prompt lists field by field.
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    """The request's RNG key: noise for the token at position p is f(seed, p, vocab index)."""
    stop_token_ids: frozenset[int]
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    """params.prompt_logprobs set: per prompt token, as its prefill chunks run (the first token's is None)."""
    num_computed_tokens: int = 0
    """Tokens whose KV is in the cache."""
    block_ids: list[int] = field(default_factory=list)
    """Its KV blocks in order: its prompt's cached chunks' (shared) first, then its own."""
    cached_chunks: list[CachedChunk] = field(default_factory=list)
    """The prefix cache's chunks it holds: those it was served and those it computed first (block_manager.py)."""
    num_cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache (usage.prompt_tokens_details.cached_tokens)."""
    num_chunks_offered: int = 0
    """Full prompt chunks already served by or offered to the prefix cache."""
    chunk_keys: list[bytes] | None = None
    """The prompt's full chunks' hash chain (wire/prefix_hash.py), once the prefix cache asked for it."""
    first_chunk_key: bytes | None = None
    """Its first alone, while the chain is not needed (BlockManager.first_chunk_key)."""
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    first_seen_forward: int | None = None
    """The prefill forward count when its node first ordered it while waiting (corun/waiting_order.py)."""
    admission_order: int = -1
    """When it was admitted: with a swap space the newest are paused first, the oldest never (swap_preemption.py)."""
    swapped: SwappedBlocks | None = None
    """Paused: its last blocks, in host memory (block_ids holds those still in the cache)."""

    @classmethod
    def create(cls, request_id: str, prompt_token_ids: list[int], params: SamplingParams, seed: int,
               eos_token_ids: frozenset[int]) -> Request:
        """A new request; it stops on stop_ids_of(params, eos_token_ids)."""
        return cls(request_id, list(prompt_token_ids), params, seed, stop_ids_of(params, eos_token_ids))

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

    @property
    def max_num_tokens(self) -> int:
        """The whole configured sequence: what admission reserves KV for."""
        return self.num_prompt_tokens + self.params.max_tokens

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    def append_token(self, token_id: int, logprobs: TokenLogprobs | None) -> str | None:
        """Record a sampled token; returns the finish reason ("stop" or "length") if the request is done."""
        self.output_token_ids.append(token_id)
        if logprobs is not None:
            self.output_logprobs.append(logprobs)
        # NOTE: every token but the newest has its KV in the cache (the newest is the next step's input).
        self.num_computed_tokens = self.num_tokens - 1
        return self.finish_reason_for(token_id, len(self.output_token_ids))

    def finish_reason_for(self, token_id: int, num_output_tokens: int) -> str | None:
        """"stop" or "length" if an output of num_output_tokens tokens ending in token_id is done, else None."""
        if token_id in self.stop_token_ids:
            return "stop"
        if num_output_tokens >= self.params.max_tokens:
            return "length"
        return None
