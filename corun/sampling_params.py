"""Per-request sampling parameters (torch-free: the router builds these too)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """0 means greedy (argmax); otherwise logits are divided by it before sampling."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 or -1 disables it."""
    max_tokens: int = 16
    """Number of tokens to generate at most (the first one comes from prefill)."""
    seed: int | None = None
    """Request seed: sampling noise is a pure function of (seed, token position, vocab index)."""
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    """Generation stops after any of these tokens (which is kept in the output)."""
    ignore_eos: bool = False
    """Keep generating past the model's EOS token."""
    logprobs: int | None = None
    """None: no logprobs; k >= 0: the sampled token's logprob plus the k most likely alternatives."""
    prompt_logprobs: int | None = None
    """None: none; k >= 0: each prompt token's logprob given the tokens before it (the first has none) plus the
    k most likely alternatives, from the prompt's own isolated prefill (a function of the prompt alone)."""

    def __post_init__(self):
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        self.validate()

    def validate(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (or -1 to disable), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise ValueError(f"prompt_logprobs must be >= 0, got {self.prompt_logprobs}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0
