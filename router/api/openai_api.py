"""OpenAI request bodies (completions and chat) parsed and validated into a GenerationRequest.

Everything a client can get wrong is a RequestError (400/404) raised here, before any node sees the request.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from router.api.beam_request import read_beam_search
from router.api.chat import echoed_content, read_template_options, render_chat
from router.api.errors import RequestError, bad_request
from router.api.field_policy import apply_field_policy
from router.api.fields import (
    TEXT,
    bool_field,
    decode_json,
    int_field,
    is_int,
    is_int_list,
    is_number,
    is_str_list,
    is_text,
    lax_bool_field,
    read_field,
    unknown_fields,
)
from router.api.model_info import ModelInfo
from router.api.prompts import check_prompt, encode_text, read_prompt_options, read_prompts
from router.api.structured import read_structured
from router.api.tools import ToolRequest, read_tools
from router.generation.output import BeamSearch, OutputOptions
from wire.sampling_params import (
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS,
    MAX_REPETITION_PENALTY,
    SEED_MAX,
    SEED_MIN,
    SamplingParams,
)
from wire.tokenizer import Tokenizer

Kind = Literal["completion", "chat"]
MAX_STOP_STRINGS = 128
"""vLLM has no limit on stop strings; this bounds what one request makes the router match per token (each stop
string is checked against the text held back, as long as the longest one): HumanEval sends 5."""
MAX_STOP_CHARS = 8192
"""The stop strings' total length, for the same reason."""
MAX_SAMPLES = 64
"""Most samples (n) per prompt; a decode node also needs n free slots of its max_num_seqs at once."""
STREAM_OPTIONS = frozenset({"include_usage", "continuous_usage_stats"})
NO_SEED = -1
"""vLLM's seed -1: no seed (the router derives one from the request id)."""


@dataclass(frozen=True)
class GenerationRequest:
    kind: Kind
    prompts: tuple[tuple[int, ...], ...]
    """Token ids of each prompt; a list of prompts gives one choice per prompt."""
    params: SamplingParams
    """Without a seed: the seed is bound per HTTP request (client's or derived from the request id)."""
    client_seed: int | None
    stop_strings: tuple[str, ...]
    stream: bool
    include_usage: bool
    continuous_usage: bool = False
    """stream_options.continuous_usage_stats (vLLM's): usage in every chunk too."""
    ignored_fields: tuple[str, ...] = ()
    """Fields ignored: harmless ones and ones the router does not know (named in X-CoRun-Ignored-Fields)."""
    output: OutputOptions = OutputOptions()
    tools: ToolRequest | None = None
    """Chat with tools (router/api/tools.py): how the output becomes tool calls."""
    beam_search: BeamSearch | None = None
    """vLLM's use_beam_search: params.n beams instead of n samples (router/generation/beam_search.py)."""
    constraint_field: str | None = None
    """The field params.structured came from (response_format, structured_outputs, a guided_* field, or tools for a
    forced tool call), named when a node refuses the constraint."""


def parse_body(tokenizer: Tokenizer, body: bytes, kind: Kind, model: ModelInfo) -> GenerationRequest:
    """The request in a raw body; router/api/offload.py runs this off the event loop (the tokenizer comes first)."""
    parse = parse_completion_request if kind == "completion" else parse_chat_request
    return parse(decode_json(body), model, tokenizer)


def parse_completion_request(body, model: ModelInfo, tokenizer: Tokenizer) -> GenerationRequest:
    body, ignored = checked_body(body, "completion", model)
    echo = bool_field(body, "echo", False)
    # NOTE: as vLLM: max_completion_tokens (OpenAI's newer name) wins over max_tokens; 0 only to echo the prompt
    lowest = 0 if echo else 1
    max_tokens = int_field(body, "max_completion_tokens", int_field(body, "max_tokens", 16, lowest), lowest)
    prompt_options = read_prompt_options(body, model.max_model_len, add_special_tokens=True)
    prompts = read_prompts(body, tokenizer, model, max(1, max_tokens), prompt_options)
    logprobs = int_field(body, "logprobs", None, 0, model.max_logprobs)
    chosen = read_logprob_token_ids(body, model, asked=logprobs is not None)
    if chosen is not None and echo:
        raise bad_request("'logprob_token_ids' with 'echo' is not supported (the echoed prompt's logprobs list "
                          "its most likely tokens)", param="logprob_token_ids")
    prompt_logprobs = int_field(body, "prompt_logprobs", None, 0, model.max_logprobs)
    echoed = logprobs if echo else None
    wanted = max((k for k in (echoed, prompt_logprobs) if k is not None), default=None)
    output = {"echo": echo, "prompt_logprobs": prompt_logprobs, "drop_generated": max_tokens == 0}
    # NOTE: max_tokens 0 runs the prefill (which makes token 1 and the prompt's logprobs) and drops the token
    return build_request("completion", body, prompts, max(1, max_tokens), logprobs, model, ignored, tokenizer,
                         wanted, output, chosen)


def parse_chat_request(body, model: ModelInfo, tokenizer: Tokenizer) -> GenerationRequest:
    body, ignored = checked_body(body, "chat", model)
    options = read_template_options(body, model.trust_request_chat_template)
    tools = read_tools(body)
    text = render_chat(body.get("messages"), tokenizer, options, tools.tools if tools else None)
    prompt_options = read_prompt_options(body, model.max_model_len, add_special_tokens=False)
    prompt = prompt_options.truncate(encode_text(text, tokenizer, model.max_model_len, "messages",
                                                 prompt_options.add_special_tokens))
    wants_logprobs = lax_bool_field(body, "logprobs", False)
    top_logprobs = int_field(body, "top_logprobs", 0, 0, model.max_logprobs)
    if top_logprobs and not wants_logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    # NOTE: as vLLM: max_completion_tokens (OpenAI's newer name) wins; without either, the chat may fill the context.
    max_tokens = int_field(body, "max_tokens", None, 1)
    max_tokens = int_field(body, "max_completion_tokens", max_tokens, 1) or max(1, model.max_model_len - len(prompt))
    prompt_logprobs = int_field(body, "prompt_logprobs", None, 0, model.max_logprobs)
    echo = echoed_content(body["messages"]) if bool_field(body, "echo", False) else ""
    chosen = read_logprob_token_ids(body, model, asked=wants_logprobs)
    return build_request("chat", body, (prompt,), max_tokens, top_logprobs if wants_logprobs else None, model,
                         ignored, tokenizer, prompt_logprobs, {"prompt_logprobs": prompt_logprobs,
                                                               "chat_echo": echo}, chosen, tools)


def read_logprob_token_ids(body: dict, model: ModelInfo, asked: bool) -> tuple[int, ...] | None:
    """vLLM's logprob_token_ids: needs logprobs (true on chat); at most max_logprobs tokens (vLLM allows 128:
    the nodes compute at most max_logprobs per token)."""
    chosen = read_field(body, "logprob_token_ids", None, lambda v: is_int_list(v) and 0 < len(v) <= model.max_logprobs
                        and all(0 <= t < model.vocab_size for t in v),
                        f"a list of 1 to {model.max_logprobs} token ids in [0, {model.vocab_size})")
    if chosen is not None and not asked:
        raise bad_request("when using 'logprob_token_ids', 'logprobs' must be set", param="logprob_token_ids")
    return None if chosen is None else tuple(chosen)


def checked_body(body, endpoint: Kind, model: ModelInfo) -> tuple[dict, list[str]]:
    """-> (body, the fields it ignores: harmless ones and unknown ones); refused fields are a 400
    (router/api/field_policy.py)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    ignored = apply_field_policy(body, endpoint, model.strict_fields)
    requested = read_field(body, "model", model.served_model_name, lambda v: isinstance(v, str), "a string")
    if requested != model.served_model_name:
        raise RequestError(404, f"The model `{requested}` does not exist.", param="model")
    return body, ignored


def build_request(kind: Kind, body: dict, prompts: tuple[tuple[int, ...], ...], max_tokens: int,
                  logprobs: int | None, model: ModelInfo, ignored: list[str], tokenizer: Tokenizer,
                  prompt_logprobs: int | None = None, output_options: dict | None = None,
                  logprob_token_ids: tuple[int, ...] | None = None,
                  tools: ToolRequest | None = None) -> GenerationRequest:
    for prompt in prompts:
        check_prompt(prompt, max_tokens, model)
    n = int_field(body, "n", 1, 1, MAX_SAMPLES)
    # NOTE: as vLLM's V1 engine: no best_of beyond n (it would rank samples by their logprobs and drop some)
    read_field(body, "best_of", None, lambda v: v == n and is_int(v), f"equal to n ({n}): best_of > n is not supported")
    requested, requested_field = read_structured(body)
    # NOTE: a named or required tool choice is a constraint of its own, as vLLM's (it replaces the others)
    tool_constraint = tools.constraint() if tools else None
    params = SamplingParams(
        temperature=float(read_field(body, "temperature", 1.0, lambda v: is_number(v) and v >= 0, "a number >= 0")),
        top_p=float(read_field(body, "top_p", 1.0, lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]")),
        top_k=int_field(body, "top_k", 0, -1, model.vocab_size),
        max_tokens=max_tokens,
        stop_token_ids=tuple(read_token_ids(body, "stop_token_ids", model.vocab_size)),
        ignore_eos=bool_field(body, "ignore_eos", False),
        # NOTE: as vLLM: named tokens replace the most likely ones, as many as they are
        logprobs=len(logprob_token_ids) if logprob_token_ids else logprobs,
        logprob_token_ids=logprob_token_ids,
        prompt_logprobs=prompt_logprobs,
        n=n,
        **read_controls(body, model, max_tokens),
        **read_token_controls(body, model, tokenizer),
        structured=tool_constraint or requested,
    )
    stream = bool_field(body, "stream", False)
    include_usage, continuous_usage, ignored_options = read_stream_options(body, stream, model.strict_fields)
    output = OutputOptions(bool_field(body, "include_stop_str_in_output", False),
                           bool_field(body, "skip_special_tokens", True),
                           bool_field(body, "return_tokens_as_token_ids", False),
                           return_token_ids=bool_field(body, "return_token_ids", False), **(output_options or {}))
    stop_strings = read_stop_strings(body)
    beam_search = read_beam_search(body, params, stop_strings, stream, output, model.max_logprobs)
    return GenerationRequest(kind, prompts, params, read_seed(body), stop_strings, stream, include_usage,
                             continuous_usage, tuple(ignored + ignored_options), output, tools, beam_search,
                             "tools" if tool_constraint else requested_field)


def read_controls(body: dict, model: ModelInfo, max_tokens: int) -> dict:
    """logit_bias, the penalties, min_p and min_tokens as SamplingParams keywords (ranges as OpenAI's and vLLM's)."""
    def number_in(low: float, high: float, low_open: bool = False):
        return lambda v: is_number(v) and (low < v if low_open else low <= v) and v <= high

    controls = {
        "presence_penalty": read_field(body, "presence_penalty", 0.0, number_in(-2, 2), "a number in [-2, 2]"),
        "frequency_penalty": read_field(body, "frequency_penalty", 0.0, number_in(-2, 2), "a number in [-2, 2]"),
        "repetition_penalty": read_field(body, "repetition_penalty", 1.0, number_in(0, MAX_REPETITION_PENALTY, True),
                                         f"a number in (0, {MAX_REPETITION_PENALTY:g}]"),
        "min_p": read_field(body, "min_p", 0.0, number_in(0, 1), "a number in [0, 1]"),
        "min_tokens": int_field(body, "min_tokens", 0, 0, max_tokens),
        "logit_bias": read_logit_bias(body, model.vocab_size),
    }
    return {name: float(v) if isinstance(v, int | float) and name != "min_tokens" else v
            for name, v in controls.items()}


def read_logit_bias(body: dict, vocab_size: int) -> dict[int, float]:
    """OpenAI's {"token id": bias}, bias in [-100, 100]."""
    def is_valid(v) -> bool:
        return isinstance(v, dict) and all(
            key.isascii() and key.isdigit() and int(key) < vocab_size and is_number(b) and abs(b) <= MAX_LOGIT_BIAS
            for key, b in v.items())
    expected = f"an object of token ids in [0, {vocab_size}) to numbers in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]"
    return {int(key): float(bias) for key, bias in read_field(body, "logit_bias", {}, is_valid, expected).items()}


def read_token_ids(body: dict, name: str, vocab_size: int) -> list[int]:
    expected = f"a list of token ids in [0, {vocab_size})"
    return read_field(body, name, [], lambda v: is_int_list(v) and all(0 <= t < vocab_size for t in v), expected)


def read_seed(body: dict) -> int | None:
    """vLLM's int64 seed; -1 means none (as vLLM's SamplingParams). NOTE: a negative seed keys the noise by its
    64 bits (two's complement), so it is a seed of its own, not a positive one's alias."""
    seed = read_field(body, "seed", None, lambda v: is_int(v) and SEED_MIN <= v <= SEED_MAX, "an int64 integer")
    return None if seed == NO_SEED else seed


def read_token_controls(body: dict, model: ModelInfo, tokenizer: Tokenizer) -> dict:
    """allowed_token_ids and bad_words (tokenized as vLLM does) as SamplingParams keywords."""
    allowed = read_field(body, "allowed_token_ids", None, lambda v: is_int_list(v) and v and all(
        0 <= t < model.vocab_size for t in v), f"a non-empty list of token ids in [0, {model.vocab_size})")
    words = read_field(body, "bad_words", [], lambda v: is_str_list(v) and len(v) <= MAX_BAD_WORDS and all(
        w.strip() and is_text(w) and len(w) <= MAX_STOP_CHARS for w in v),
        f"a list of at most {MAX_BAD_WORDS} non-blank strings of {TEXT}")
    return {"allowed_token_ids": None if allowed is None else tuple(allowed),
            "bad_words_token_ids": bad_words_token_ids(words, tokenizer)}


def bad_words_token_ids(words: list[str], tokenizer: Tokenizer) -> tuple[tuple[int, ...], ...]:
    """vLLM's SamplingParams.update_from_tokenizer: each word as it starts the text and, when that is another first
    token of as many tokens, as it follows a space."""
    sequences: list[tuple[int, ...]] = []
    for word in dict.fromkeys(words):
        bare = tuple(tokenizer.encode(word.lstrip()))
        spaced = tuple(tokenizer.encode(" " + word.lstrip()))
        sequences.append(bare)
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            sequences.append(spaced)
    if len(sequences) > MAX_BAD_WORDS:
        raise bad_request(f"'bad_words' tokenize to {len(sequences)} sequences, more than {MAX_BAD_WORDS}",
                          param="bad_words")
    return tuple(sequences)


def read_stop_strings(body: dict) -> tuple[str, ...]:
    def is_valid(v) -> bool:
        strings = [v] if isinstance(v, str) else v
        return is_str_list(strings) and len(strings) <= MAX_STOP_STRINGS and \
            sum(map(len, strings)) <= MAX_STOP_CHARS and all(s and is_text(s) for s in strings)
    expected = (f"a non-empty string or a list of at most {MAX_STOP_STRINGS} non-empty strings, "
                f"{MAX_STOP_CHARS} characters in all, of {TEXT}")
    stop = read_field(body, "stop", [], is_valid, expected)
    return (stop,) if isinstance(stop, str) else tuple(stop)


def read_stream_options(body: dict, stream: bool, strict: bool) -> tuple[bool, bool, list[str]]:
    """-> (include_usage, continuous usage: in every chunk too, as vLLM's continuous_usage_stats; ignored
    options)."""
    options = read_field(body, "stream_options", None, lambda v: isinstance(v, dict), "an object")
    if options is None:
        return False, False, []
    if not stream:
        raise bad_request("'stream_options' is only allowed with 'stream': true", param="stream_options")
    ignored = unknown_fields(options, STREAM_OPTIONS, strict, prefix="stream_options.")
    include_usage = bool_field(options, "include_usage", False)
    return include_usage, include_usage and bool_field(options, "continuous_usage_stats", False), ignored


def bind_seed(request: GenerationRequest, seed: int) -> SamplingParams:
    """The request's sampling parameters carrying its bound seed (the nodes get it there, and only there)."""
    return dataclasses.replace(request.params, seed=seed)
