"""Per-request sampling parameters (torch-free: the router builds these too)."""

from __future__ import annotations

from dataclasses import dataclass, field

from wire.structured import StructuredOutput

MAX_LOGIT_BIAS = 100.0
"""OpenAI's bound on a logit_bias value."""
MAX_REPETITION_PENALTY = 100.0
SEED_MIN, SEED_MAX = -2**63, 2**63 - 1
"""Seeds are int64 (vLLM's range); the sampler keys its noise on their 64 bits."""
MAX_BAD_WORDS = 128
"""Token sequences bad_words may ban (vLLM's VLLM_MAX_NUM_BAD_WORDS default)."""


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
    n: int = 1
    """Samples of the prompt; sample i uses seed sample_seed(seed, i) (sample 0 the seed itself)."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token already generated (OpenAI's, in [-2, 2])."""
    frequency_penalty: float = 0.0
    """Times how often a token was generated, subtracted from its logit (OpenAI's, in [-2, 2])."""
    repetition_penalty: float = 1.0
    """Tokens of the prompt or the output: positive logits divided by it, negative ones multiplied (> 0)."""
    min_p: float = 0.0
    """Keep tokens whose probability is at least min_p times the most likely one's (after temperature)."""
    min_tokens: int = 0
    """Until this many tokens are generated, stop tokens (EOS included) cannot be sampled and stop strings do
    not match."""
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    """(token id, bias) pairs added to the logits before sampling; a dict {token id: bias} is accepted too."""
    allowed_token_ids: tuple[int, ...] | None = None
    """vLLM's: only these tokens can be sampled (every other logit is -inf); None allows all."""
    logprob_token_ids: tuple[int, ...] | None = None
    """vLLM's: each generated token's logprobs list these tokens (in this order) instead of the most likely ones;
    logprobs must equal their count."""
    bad_words_token_ids: tuple[tuple[int, ...], ...] = field(default_factory=tuple)
    """vLLM's bad_words, tokenized: a sequence's last token cannot be sampled when the output so far ends with the
    rest of it (a one-token sequence is never sampled)."""
    structured: StructuredOutput | None = None
    """Structured output: each token is sampled among those the constraint allows after the output so far
    (corun/structured.py)."""

    def __post_init__(self):
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple(sorted((int(t), float(b)) for t, b in bias)))
        if self.allowed_token_ids is not None:
            object.__setattr__(self, "allowed_token_ids", tuple(sorted({int(t) for t in self.allowed_token_ids})))
        if self.logprob_token_ids is not None:
            object.__setattr__(self, "logprob_token_ids", tuple(int(t) for t in self.logprob_token_ids))
        object.__setattr__(self, "bad_words_token_ids",
                           tuple(tuple(int(t) for t in word) for word in self.bad_words_token_ids))
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
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be an int64, got {self.seed}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise ValueError(f"prompt_logprobs must be >= 0, got {self.prompt_logprobs}")
        self.validate_controls()

    def validate_controls(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise ValueError(f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY}], got "
                             f"{self.repetition_penalty}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        token_ids = [t for t, _ in self.logit_bias]
        if len(set(token_ids)) != len(token_ids) or any(t < 0 for t in token_ids):
            raise ValueError("logit_bias must name distinct token ids >= 0")
        if any(not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS for _, b in self.logit_bias):
            raise ValueError(f"logit_bias values must be in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}]")
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise ValueError("allowed_token_ids must not be empty")
        if any(t < 0 for t in self.allowed_token_ids or ()):
            raise ValueError("allowed_token_ids must be >= 0")
        if self.logprob_token_ids is not None and (
                not self.logprob_token_ids or min(self.logprob_token_ids) < 0
                or self.logprobs != len(self.logprob_token_ids)):
            raise ValueError("logprob_token_ids must be token ids >= 0, as many as logprobs")
        if len(self.bad_words_token_ids) > MAX_BAD_WORDS or any(
                not word or min(word) < 0 for word in self.bad_words_token_ids):
            raise ValueError(f"bad_words_token_ids must be at most {MAX_BAD_WORDS} non-empty token id sequences")

    def token_ids_named(self) -> list[int]:
        """Every token id these parameters name (nodes check them against the vocabulary)."""
        return [*self.stop_token_ids, *(t for t, _ in self.logit_bias), *(self.allowed_token_ids or ()),
                *(self.logprob_token_ids or ()),
                *(t for word in self.bad_words_token_ids for t in word)]

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def adjusts_logits(self) -> bool:
        """Bias, penalties, min_tokens, allowed_token_ids or bad_words change this request's logits before
        sampling (greedy included)."""
        return bool(self.logit_bias or self.min_tokens or self.uses_penalties or self.allowed_token_ids is not None
                    or self.bad_words_token_ids)

    @property
    def uses_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
