"""What a node runs its forwards on: the runner interface the prefill, decode and colocated nodes use.

Two runners implement it: corun's ModelRunner (corun/model_runner.py) and the vLLM backend's VllmModelRunner
(corun/vllm_backend/runner.py). A node reads the model's facts from `arch` and moves KV through `kv_cache`; it never
reaches into a runner's model or its attributes beyond these.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from corun.decode_ahead import DecodeInFlight
from corun.model_runner import SampledToken
from corun.request import Request
from corun.scheduler import PrefillChunk
from wire.config import EngineConfig


class ArchFacts(Protocol):
    """The model facts a node needs (corun.models.config.ModelArchConfig has them, and more)."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]
    num_layers: int
    num_kv_heads: int
    head_dim: int


class NodeKVCache(Protocol):
    """The paged KV cache as a node sees it: the tensors the transfer agent registers, and block copies."""

    num_blocks: int
    data: torch.Tensor | Sequence[torch.Tensor]
    """One block-major tensor, or one per layer (transfer/reads.py, KVData)."""

    def copy_blocks(self, source_ids: list[int], target_ids: list[int]) -> None: ...


class DecodeGraphCounts(Protocol):
    num_replays: int


class NodeRunner(Protocol):
    config: EngineConfig
    """The engine config it runs: resolved on its device, the KV cache's budget included."""
    arch: ArchFacts
    kv_cache: NodeKVCache
    decode_graph: DecodeGraphCounts | None
    """The captured decode step, when there is one (its replays are counted in stats)."""

    def run_prefill(self, chunks: list[PrefillChunk]) -> list[SampledToken]: ...

    def run_decode(self, requests: list[Request]) -> list[SampledToken]: ...

    multi_chunk_prefill: bool
    """Whether a prompt may run several of its chunks in one prefill forward (SchedulerConfig.multi_chunk_prefill)."""

    decode_rides_prefill: bool
    """Whether a prefill forward may carry the decode step (SchedulerConfig.decode_rides_prefill, verified)."""

    def run_prefill_and_decode(self, chunks: list[PrefillChunk], decodes: list[Request]) -> list[SampledToken]:
        """A prefill pack and the decode step of decodes (joined where verified): -> both's tokens."""
        ...

    decode_in_flight: DecodeInFlight | None
    """The decode step launched ahead of the host (async scheduling, corun/decode_ahead.py), until it is read."""

    def overlaps(self, requests: list[Request]) -> bool:
        """Whether the decode step of requests may run ahead of the host (run_decode_ahead)."""
        ...

    def run_decode_ahead(self, requests: list[Request],
                         while_waiting: Callable[[], None] | None = None) -> list[SampledToken]:
        """Launch this decode step, then read the one launched before it: -> that step's tokens; while_waiting is
        called while the host waits for them."""
        ...

    def finish_decode_in_flight(self) -> list[SampledToken]: ...

    def forward_counts(self) -> dict[str, int]: ...
