"""What the generation room hands up to its caller: each choice's output since its last delta (ChoiceDelta), and
the options that shape that output (OutputOptions).

NOTE: a module of its own, with nothing but plain structs: body parsing (router/api/openai_api.py) builds
OutputOptions in the parser's worker processes (router/api/offload.py), which so never import the pipeline (nor
zmq and prometheus_client under it).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from wire.outputs import TokenLogprobs


@dataclass(frozen=True)
class OutputOptions:
    """How the output is written back (vLLM's fields); none of it changes the tokens."""

    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    return_tokens_as_token_ids: bool = False
    """Logprob entries name tokens as "token_id:<id>" (text that cannot be mistaken for another token)."""
    echo: bool = False
    """Completions: the prompt before the completion, in the text and (with logprobs) in the logprobs."""
    prompt_logprobs: int | None = None
    """vLLM's prompt_logprobs field: each prompt token's logprob and this many alternatives, in the choice."""
    drop_generated: bool = False
    """max_tokens 0 with echo (lm-eval's loglikelihood request): the prompt alone comes back."""
    return_token_ids: bool = False
    """vLLM's: each choice's generated token ids in token_ids, and the prompt's in prompt_token_ids (per choice on
    completions, per response on chat); both null when false, as vLLM sends them."""
    chat_echo: str = ""
    """Chat echo (vLLM's): the last message's content, put before the reply when the last message is the
    assistant's."""


@dataclass(frozen=True)
class BeamSearch:
    """vLLM's use_beam_search (router/generation/beam_search.py): n is the beam width."""

    length_penalty: float = 1.0
    """A beam's score is its cumulative logprob / length ** length_penalty (vLLM's)."""

    @staticmethod
    def num_step_logprobs(beam_width: int, logprobs: int | None) -> int:
        """Logprobs each step asks for: vLLM's 2 * beam_width candidates, or more when the client wants more."""
        return max(2 * beam_width, logprobs or 0)


class ChoiceDelta(msgspec.Struct, frozen=True):
    """What one prompt produced since its last delta. NOTE: a msgspec Struct, built in C: one is made per streamed
    token (a frozen dataclass cost twice the token's JSON encoding)."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprobs, ...] | None
    finish_reason: str | None
    stop_reason: str | int | None = None
    """What stopped it (vLLM's): the stop string, or the stop token id that is not EOS; None otherwise."""
    prompt_logprobs: tuple[TokenLogprobs | None, ...] | None = None
    """On a prompt's first delta, when asked for (echo with logprobs, or prompt_logprobs)."""
    num_cached_tokens: int | None = None
    """On a sample's first delta: prompt tokens whose KV came from the prefilling node's prefix cache."""
