"""Prompts: text or token ids, encoded (add_special_tokens), truncated (truncate_prompt_tokens, truncation_side) and
checked against the context, before any node sees them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from router.api.errors import bad_request
from router.api.fields import TEXT, bool_field, int_field, is_int_list, is_str_list, is_text, read_field
from router.api.model_info import ModelInfo
from wire.tokenizer import Tokenizer


@dataclass(frozen=True)
class PromptOptions:
    """How a prompt becomes token ids (vLLM's fields)."""

    add_special_tokens: bool = False
    """The tokenizer's BOS/EOS around a text prompt: vLLM's default is true for completions, false for chat (the
    template has them)."""
    truncate_prompt_tokens: int | None = None
    """Keep this many of the prompt's tokens (vLLM's -1: max_model_len); None keeps all."""
    truncation_side: Literal["left", "right"] = "left"
    """left: keep the last tokens (vLLM's default); right: the first."""

    def truncate(self, prompt: tuple[int, ...]) -> tuple[int, ...]:
        keep = self.truncate_prompt_tokens
        if keep is None or len(prompt) <= keep:
            return prompt
        return prompt[len(prompt) - keep:] if self.truncation_side == "left" else prompt[:keep]


def read_prompt_options(body: dict, max_model_len: int, add_special_tokens: bool) -> PromptOptions:
    """add_special_tokens: the endpoint's default. NOTE: as vLLM, truncation past the context is a 400, not a cap."""
    keep = int_field(body, "truncate_prompt_tokens", None, -1, max_model_len)
    if keep == 0:
        raise bad_request("'truncate_prompt_tokens' must be -1 (the context length) or >= 1",
                          param="truncate_prompt_tokens")
    side = read_field(body, "truncation_side", "left", lambda v: v in ("left", "right"), '"left" or "right"')
    return PromptOptions(bool_field(body, "add_special_tokens", add_special_tokens),
                         max_model_len if keep == -1 else keep, side)


def read_prompts(body: dict, tokenizer: Tokenizer, model: ModelInfo, max_tokens: int,
                 options: PromptOptions = PromptOptions()) -> tuple[tuple[int, ...], ...]:
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
        return tuple(checked_prompt(options.truncate(encode_text(text, tokenizer, model.max_model_len, "prompt",
                                                                 options.add_special_tokens)), max_tokens, model)
                     for text in texts)
    if isinstance(prompt, list) and prompt:
        if is_int_list(prompt):
            return (checked_prompt(options.truncate(tuple(prompt)), max_tokens, model),)
        if all(is_int_list(item) for item in prompt):
            check_num_prompts(len(prompt), model)
            return tuple(checked_prompt(options.truncate(tuple(item)), max_tokens, model) for item in prompt)
    if prompt is None or prompt == []:
        raise bad_request("'prompt' must not be empty", param="prompt")
    raise bad_request("'prompt' must be a string, a list of strings, a list of token ids or a list of lists of "
                      "token ids", param="prompt")


def check_num_prompts(num_prompts: int, model: ModelInfo) -> None:
    if num_prompts > model.max_num_prompts:
        raise bad_request(f"at most {model.max_num_prompts} prompts per request", param="prompt")


def encode_text(text: str, tokenizer: Tokenizer, max_model_len: int, param: str,
                add_special_tokens: bool = False) -> tuple[int, ...]:
    """text's token ids; a 400 without encoding it when it is too long (check_text_length)."""
    check_text_length(text, tokenizer, max_model_len, param)
    return tuple(tokenizer.encode(text, add_special_tokens))


def check_text_length(text: str, tokenizer: Tokenizer, max_model_len: int, param: str) -> None:
    """A 400 when text has more characters than max_model_len tokens can hold (Tokenizer.max_text_chars).
    NOTE: encoding costs the parser ~200 bytes of memory and ~1 us per character of a long "word" (issue 23): this
    bounds that cost by the context length, not by the body size limit."""
    max_chars = tokenizer.max_text_chars(max_model_len)
    if max_chars is not None and len(text) > max_chars:
        # NOTE: "the text of" the field, so that the verb agrees with any field's name ('messages' is plural)
        raise bad_request(f"This model's maximum context length is {max_model_len} tokens. However, the text of "
                          f"'{param}' has {len(text)} characters, more than {max_model_len} tokens of this tokenizer "
                          f"can hold (at most {max_chars} characters).", param=param)


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
    # NOTE: min and max loop in C (a comprehension took ~50 us per 500 ids, twice per request): the offender is
    # looked for only once there is one
    if min(prompt) < 0 or max(prompt) >= model.vocab_size:
        first = next(t for t in prompt if not 0 <= t < model.vocab_size)
        raise bad_request(f"token id {first} in the prompt is outside the vocabulary [0, {model.vocab_size})",
                          param="prompt")
