"""OpenAI request bodies (completions and chat) parsed and validated into a GenerationRequest.

Everything a client can get wrong is a RequestError (400/404) raised here, before any node sees the request.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from router.api.chat import CHAT_FIELDS, render_chat
from router.api.errors import RequestError, bad_request
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
    only_value_field,
    read_field,
    unknown_fields,
)
from router.api.structured import STRUCTURED_FIELDS, read_structured
from router.api.tools import ToolRequest, read_tools
from router.generation.output import OutputOptions
from wire.sampling_params import MAX_LOGIT_BIAS, MAX_REPETITION_PENALTY, SamplingParams
from wire.seeding import SEED_BOUND
from wire.tokenizer import Tokenizer

Kind = Literal["completion", "chat"]
MAX_STOP_STRINGS = 4
MAX_SAMPLES = 64
"""Most samples (n) per prompt; a decode node also needs n free slots of its max_num_seqs at once."""
SAMPLING_FIELDS = frozenset({
    "model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stream", "stream_options", "stop",
    "stop_token_ids", "ignore_eos", "logprobs", "n", "user", "presence_penalty", "frequency_penalty", "logit_bias",
    "include_stop_str_in_output", "skip_special_tokens", "return_tokens_as_token_ids", "repetition_penalty",
    "min_p", "min_tokens"}) | STRUCTURED_FIELDS
COMPLETION_FIELDS = SAMPLING_FIELDS | {"prompt", "echo", "best_of", "suffix", "max_completion_tokens",
                                       "prompt_logprobs"}
STREAM_OPTIONS = frozenset({"include_usage", "continuous_usage_stats"})


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
    """Fields the router does not know and ignored (named in X-CoRun-Ignored-Fields)."""
    output: OutputOptions = OutputOptions()
    tools: ToolRequest | None = None
    """Chat with tools (router/api/tools.py): how the output becomes tool calls."""


def parse_body(tokenizer: Tokenizer, body: bytes, kind: Kind, model: ModelInfo) -> GenerationRequest:
    """The request in a raw body; router/api/offload.py runs this off the event loop (the tokenizer comes first)."""
    parse = parse_completion_request if kind == "completion" else parse_chat_request
    return parse(decode_json(body), model, tokenizer)


def parse_completion_request(body, model: ModelInfo, tokenizer: Tokenizer) -> GenerationRequest:
    body, ignored = checked_body(body, COMPLETION_FIELDS, model)
    echo = bool_field(body, "echo", False)
    only_value_field(body, "suffix", "null", lambda v: False)
    # NOTE: as vLLM: max_completion_tokens (OpenAI's newer name) wins over max_tokens; 0 only to echo the prompt
    lowest = 0 if echo else 1
    max_tokens = int_field(body, "max_completion_tokens", int_field(body, "max_tokens", 16, lowest), lowest)
    prompts = read_prompts(body, tokenizer, model, max(1, max_tokens))
    logprobs = int_field(body, "logprobs", None, 0, model.max_logprobs)
    prompt_logprobs = int_field(body, "prompt_logprobs", None, 0, model.max_logprobs)
    echoed = logprobs if echo else None
    wanted = max((k for k in (echoed, prompt_logprobs) if k is not None), default=None)
    prompt_options = {"echo": echo, "prompt_logprobs": prompt_logprobs, "drop_generated": max_tokens == 0}
    # NOTE: max_tokens 0 runs the prefill (which makes token 1 and the prompt's logprobs) and drops the token
    return build_request("completion", body, prompts, max(1, max_tokens), logprobs, model, ignored, wanted,
                         prompt_options)


def parse_chat_request(body, model: ModelInfo, tokenizer: Tokenizer) -> GenerationRequest:
    body, ignored = checked_body(body, SAMPLING_FIELDS | CHAT_FIELDS, model)
    tools = read_tools(body)
    rendered = render_chat(body.get("messages"), tokenizer, tools.tools if tools else None)
    prompt = encode_text(rendered, tokenizer, model.max_model_len, "messages")
    wants_logprobs = bool_field(body, "logprobs", False)
    top_logprobs = int_field(body, "top_logprobs", 0, 0, model.max_logprobs)
    if top_logprobs and not wants_logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    # NOTE: as vLLM: max_completion_tokens (OpenAI's newer name) wins; without either, the chat may fill the context.
    max_tokens = int_field(body, "max_tokens", None, 1)
    max_tokens = int_field(body, "max_completion_tokens", max_tokens, 1) or max(1, model.max_model_len - len(prompt))
    return build_request("chat", body, (prompt,), max_tokens, top_logprobs if wants_logprobs else None, model,
                         ignored, tools=tools)


def checked_body(body, known_fields: frozenset[str], model: ModelInfo) -> tuple[dict, list[str]]:
    """-> (body, the unknown fields it ignores)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    ignored = unknown_fields(body, known_fields, model.strict_fields)
    requested = read_field(body, "model", model.served_model_name, lambda v: isinstance(v, str), "a string")
    if requested != model.served_model_name:
        raise RequestError(404, f"The model `{requested}` does not exist.", param="model")
    return body, ignored


def build_request(kind: Kind, body: dict, prompts: tuple[tuple[int, ...], ...], max_tokens: int,
                  logprobs: int | None, model: ModelInfo, ignored: list[str], prompt_logprobs: int | None = None,
                  prompt_options: dict | None = None, tools: ToolRequest | None = None) -> GenerationRequest:
    read_field(body, "user", None, lambda v: isinstance(v, str), "a string")
    for prompt in prompts:
        check_prompt(prompt, max_tokens, model)
    n = int_field(body, "n", 1, 1, MAX_SAMPLES)
    # NOTE: as vLLM's V1 engine: no best_of beyond n (it would rank samples by their logprobs and drop some)
    read_field(body, "best_of", None, lambda v: v == n and is_int(v), f"equal to n ({n}): best_of > n is not supported")
    requested = read_structured(body)
    params = SamplingParams(
        temperature=float(read_field(body, "temperature", 1.0, lambda v: is_number(v) and v >= 0, "a number >= 0")),
        top_p=float(read_field(body, "top_p", 1.0, lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]")),
        top_k=int_field(body, "top_k", 0, -1, model.vocab_size),
        max_tokens=max_tokens,
        stop_token_ids=tuple(read_token_ids(body, "stop_token_ids", model.vocab_size)),
        ignore_eos=bool_field(body, "ignore_eos", False),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        n=n,
        **read_controls(body, model, max_tokens),
        # NOTE: a named or required tool choice is a constraint of its own, as vLLM's (it replaces the others)
        structured=(tools.constraint() if tools else None) or requested,
    )
    stream = bool_field(body, "stream", False)
    include_usage, continuous_usage, ignored_options = read_stream_options(body, stream, model.strict_fields)
    output = OutputOptions(bool_field(body, "include_stop_str_in_output", False),
                           bool_field(body, "skip_special_tokens", True),
                           bool_field(body, "return_tokens_as_token_ids", False), **(prompt_options or {}))
    return GenerationRequest(kind, prompts, params, read_seed(body), read_stop_strings(body), stream,
                             include_usage, continuous_usage, tuple(ignored + ignored_options), output, tools)


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


def read_prompts(body: dict, tokenizer: Tokenizer, model: ModelInfo, max_tokens: int) -> tuple[tuple[int, ...], ...]:
    """Each prompt's token ids. NOTE: every check that can refuse a prompt runs before the next one is encoded, so
    that a refused request costs at most one prompt's encoding."""
    prompt = body.get("prompt")
    texts = [prompt] if isinstance(prompt, str) else prompt if is_str_list(prompt) else []
    if texts:
        check_num_prompts(len(texts), model)
        for text in texts:  # NOTE: before is_text, which copies each text (encodes it as UTF-8)
            check_text_length(text, tokenizer, model.max_model_len, "prompt")
        if not all(map(is_text, texts)):
            raise bad_request(f"'prompt' must be {TEXT}", param="prompt")
        return tuple(checked_prompt(encode_text(text, tokenizer, model.max_model_len, "prompt"), max_tokens, model)
                     for text in texts)
    if isinstance(prompt, list) and prompt:
        if is_int_list(prompt):
            return (checked_prompt(prompt, max_tokens, model),)
        if all(is_int_list(item) for item in prompt):
            check_num_prompts(len(prompt), model)
            return tuple(checked_prompt(item, max_tokens, model) for item in prompt)
    if prompt is None or prompt == []:
        raise bad_request("'prompt' must not be empty", param="prompt")
    raise bad_request("'prompt' must be a string, a list of strings, a list of token ids or a list of lists of "
                      "token ids", param="prompt")


def check_num_prompts(num_prompts: int, model: ModelInfo) -> None:
    if num_prompts > model.max_num_prompts:
        raise bad_request(f"at most {model.max_num_prompts} prompts per request", param="prompt")


def encode_text(text: str, tokenizer: Tokenizer, max_model_len: int, param: str) -> tuple[int, ...]:
    """text's token ids; a 400 without encoding it when it is too long (check_text_length)."""
    check_text_length(text, tokenizer, max_model_len, param)
    return tuple(tokenizer.encode(text))


def check_text_length(text: str, tokenizer: Tokenizer, max_model_len: int, param: str) -> None:
    """A 400 when text has more characters than max_model_len tokens can hold (Tokenizer.max_text_chars).
    NOTE: encoding costs the parser ~200 bytes of memory and ~1 us per character of a long "word" (issue 23): this
    bounds that cost by the context length, not by the body size limit."""
    max_chars = tokenizer.max_text_chars(max_model_len)
    if max_chars is not None and len(text) > max_chars:
        raise bad_request(f"This model's maximum context length is {max_model_len} tokens. However, the {param} "
                          f"has {len(text)} characters, more than {max_model_len} tokens of this tokenizer can hold "
                          f"(at most {max_chars} characters).", param=param)


def checked_prompt(prompt, max_tokens: int, model: ModelInfo) -> tuple[int, ...]:
    check_prompt(prompt, max_tokens, model)
    return tuple(prompt)


def check_prompt(prompt: tuple[int, ...], max_tokens: int, model: ModelInfo) -> None:
    if not prompt:
        raise bad_request("the prompt must not be empty", param="prompt")
    if len(prompt) + max_tokens > model.max_model_len:
        raise bad_request(
            f"This model's maximum context length is {model.max_model_len} tokens. However, you requested "
            f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the prompt, {max_tokens} for the completion).",
            param="max_tokens" if len(prompt) < model.max_model_len else "prompt")
    out_of_vocab = [t for t in prompt if not 0 <= t < model.vocab_size]
    if out_of_vocab:
        raise bad_request(f"token id {out_of_vocab[0]} in the prompt is outside the vocabulary "
                          f"[0, {model.vocab_size})", param="prompt")


def read_token_ids(body: dict, name: str, vocab_size: int) -> list[int]:
    expected = f"a list of token ids in [0, {vocab_size})"
    return read_field(body, name, [], lambda v: is_int_list(v) and all(0 <= t < vocab_size for t in v), expected)


def read_seed(body: dict) -> int | None:
    return read_field(body, "seed", None, lambda v: is_int(v) and 0 <= v < SEED_BOUND, "an integer in [0, 2**63)")


def read_stop_strings(body: dict) -> tuple[str, ...]:
    def is_valid(v) -> bool:
        strings = [v] if isinstance(v, str) else v
        return is_str_list(strings) and len(strings) <= MAX_STOP_STRINGS and all(s and is_text(s) for s in strings)
    expected = f"a non-empty string or a list of at most {MAX_STOP_STRINGS} non-empty strings, of {TEXT}"
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
