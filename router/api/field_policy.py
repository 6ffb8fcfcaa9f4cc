"""Every request field the router knows, in one table, with its kind (issue 24):

- supported: read and honoured (router/api/openai_api.py, router/api/chat.py);
- ignored: harmless (it changes no token, logprob or text): accepted, named in X-CoRun-Ignored-Fields, as unknown
  fields are; --strict-fields does not refuse these;
- refused: it would change the output and is not supported: a 400 naming the field, unless it holds the value that
  changes nothing (null always; `no_op` says which others). Never silently ignored.

Fields in no row are unknown: ignored with the warning header, a 400 under --strict-fields. To support a field,
change its row's kind here and read it where the endpoint is parsed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from router.api.errors import bad_request
from router.api.fields import shorten, unknown_fields

Kind = Literal["supported", "ignored", "refused"]
Endpoint = Literal["completion", "chat"]
BOTH: tuple[Endpoint, ...] = ("completion", "chat")


def never(value) -> bool:
    return False


@dataclass(frozen=True)
class FieldRule:
    kind: Kind
    endpoints: tuple[Endpoint, ...] = BOTH
    """Where the field is in vLLM's protocol; elsewhere it is unknown."""
    no_op: Callable[[Any], bool] = never
    """refused: the values that change nothing and are accepted (null is always accepted)."""
    why: str = ""
    """refused: what the 400 says after the field's name."""


def supported(*endpoints: Endpoint) -> FieldRule:
    return FieldRule("supported", endpoints or BOTH)


def ignored(*endpoints: Endpoint) -> FieldRule:
    return FieldRule("ignored", endpoints or BOTH)


def refused(why: str, no_op: Callable[[Any], bool] = never, *endpoints: Endpoint) -> FieldRule:
    return FieldRule("refused", endpoints or BOTH, no_op, why)


FIELD_POLICY: dict[str, FieldRule] = {
    # --- supported ---------------------------------------------------------------------------------------------
    **{name: supported() for name in (
        "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stream",
        "stream_options", "stop", "stop_token_ids", "ignore_eos", "logprobs", "n", "presence_penalty",
        "frequency_penalty", "logit_bias", "include_stop_str_in_output", "skip_special_tokens",
        "return_tokens_as_token_ids", "repetition_penalty", "min_p", "min_tokens", "best_of", "prompt_logprobs",
        "allowed_token_ids", "bad_words", "truncate_prompt_tokens", "truncation_side", "add_special_tokens",
        "return_token_ids", "echo", "logprob_token_ids", "use_beam_search", "length_penalty",
        # NOTE: structured outputs (router/api/structured.py); the guided_* fields are vLLM's older spelling
        "structured_outputs", "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
        "guided_decoding_backend", "guided_whitespace_pattern")},
    "prompt": supported("completion"),
    "suffix": refused("suffix (fill-in-the-middle) is not supported", never, "completion"),
    **{name: supported("chat") for name in (
        "messages", "top_logprobs", "chat_template", "chat_template_kwargs", "add_generation_prompt",
        "continue_final_message", "reasoning_effort", "tools", "tool_choice", "parallel_tool_calls")},
    # --- harmless: ignored, named in X-CoRun-Ignored-Fields ------------------------------------------------------
    # NOTE: none of these changes a token: scheduling hints (priority), ids (request_id: X-Request-Id is the
    # router's), prefix-cache and KV-connector hints (cache_salt, kv_transfer_params, ec_transfer_params), the
    # OpenAI user and metadata tags, stream pacing (stream_interval) and extra response parts vLLM may add.
    **{name: ignored() for name in (
        "priority", "request_id", "cache_salt", "session_id", "kv_transfer_params", "ec_transfer_params", "user",
        "metadata", "store", "service_tier", "stream_interval", "return_token_offsets", "return_mm_kwargs",
        "routed_experts_prompt_start")},
    # NOTE: include_reasoning only splits a reasoning parser's output, and the router has none (as vLLM without one)
    **{name: ignored("chat") for name in ("return_prompt_text", "include_reasoning")},
    # --- output-changing, not supported: a 400 naming the field -------------------------------------------------
    "structural_tag": refused("structural tags are not supported"),
    "spaces_between_special_tokens": refused(
        "spaces_between_special_tokens: false is not supported", lambda v: v is True),
    "repetition_detection": refused("repetition detection is not supported"),
    "thinking_token_budget": refused("a thinking token budget is not supported"),
    "watermarking": refused("watermarking is not supported", lambda v: v is False),
    "vllm_xargs": refused("vllm_xargs (custom logits processors) are not supported"),
    "prompt_embeds": refused("prompt embeddings are not supported"),
    "mm_payload": refused("multimodal inputs are not supported"),
    "documents": refused("documents (retrieval-augmented chat templates) are not supported", never, "chat"),
    "media_io_kwargs": refused("multimodal inputs are not supported", never, "chat"),
    "mm_processor_kwargs": refused("multimodal inputs are not supported", never, "chat"),
}
"""The one table of every field the router knows (see the module docstring); the README lists the same."""


@functools.cache
def fields_of(endpoint: Endpoint, kind: Kind | None = None) -> frozenset[str]:
    """The fields of this endpoint (of this kind; None: every kind)."""
    return frozenset(name for name, rule in FIELD_POLICY.items()
                     if endpoint in rule.endpoints and kind in (None, rule.kind))


def apply_field_policy(body: dict, endpoint: Endpoint, strict: bool) -> list[str]:
    """A 400 naming the first refused field that holds a value changing the output; -> the fields ignored (the
    listed harmless ones, then unknown ones; unknown ones are a 400 under strict)."""
    for name in sorted(body):
        rule = FIELD_POLICY.get(name)
        if rule is None or rule.kind != "refused" or endpoint not in rule.endpoints:
            continue
        value = body[name]
        if value is not None and not rule.no_op(value):
            raise bad_request(f"'{name}' = {shorten(value)}: {rule.why}", param=name)
    harmless = sorted(name for name in body if name in fields_of(endpoint, "ignored"))
    return harmless + unknown_fields(body, fields_of(endpoint), strict)
