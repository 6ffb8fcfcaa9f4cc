"""What request validation knows about the served model (the router learns it from the nodes' Pongs)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelInfo:
    """What validation needs to know about the served model."""

    served_model_name: str
    max_model_len: int
    vocab_size: int
    """The model's embedding rows: token ids must be below it."""
    max_logprobs: int
    max_num_prompts: int
    """Prompts one request may carry (RouterConfig.max_pending_requests): more are refused before any is encoded."""
    strict_fields: bool = False
    """Unknown fields are a 400 (RouterConfig.strict_fields), not ignored with a warning."""
    trust_request_chat_template: bool = False
    """A request's own chat_template is rendered (RouterConfig.trust_request_chat_template), not a 400."""
