"""Tokenizer of an HF checkpoint: the `tokenizers` backend plus its jinja2 chat template.

Deliberately not transformers' AutoTokenizer: that imports torch, and the router process must never do so.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import jinja2
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Stop tokens of ChatML models (Qwen): ending a turn and ending a document both end generation.
CHATML_STOP_TOKENS = ("<|endoftext|>", "<|im_end|>")
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")
COMPOSITION_SHRINK = 4
"""Unicode composition (NFC, NFKC) joins at most 4 code points into one (U+1F8F is 4 in NFD): it shrinks a text at
most 4-fold. tests/wire/test_tokenizer_bound.py checks it against unicodedata."""
NORMALIZER_SHRINK = {"NFC": COMPOSITION_SHRINK, "NFKC": COMPOSITION_SHRINK, "NFD": 1, "NFKD": 1, "Lowercase": 1,
                     "Prepend": 1}
"""How many times shorter each normalizer can make a text; one not named here (Strip, Replace, StripAccents) may
delete any amount of it, so a tokenizer that has one gets no length bound."""


class Tokenizer:
    """Encode, decode and render chats the way transformers does for the same checkpoint."""

    def __init__(self, backend: tokenizers.Tokenizer, tokenizer_config: dict, chat_template: str | None,
                 generation_eos_ids: list[int]):
        self._backend = backend
        self._special_tokens = {key: token_text(tokenizer_config.get(key)) for key in SPECIAL_TOKEN_KEYS}
        self._chat_template = compile_chat_template(chat_template) if chat_template else None
        self._generation_eos_ids = generation_eos_ids
        self._max_chars_per_token = max_chars_per_token(backend)
        self._token_texts: dict[int, str] = {}
        """token_text's answers: at most one per vocabulary entry."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of text; special-token text such as <|im_start|> maps to its id. add_special_tokens: the
        tokenizer's post-processor adds its BOS/EOS (vLLM's completions default; Qwen's adds none)."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary's string for token_id (byte-level pieces such as "Ġthe"), as vLLM's token_strs."""
        return self._backend.id_to_token(token_id)

    def max_text_chars(self, num_tokens: int) -> int | None:
        """The most characters a text of at most num_tokens tokens can have (a longer text is certainly longer
        in tokens: it need not be encoded to know); None when this tokenizer admits no such bound."""
        return None if self._max_chars_per_token is None else num_tokens * self._max_chars_per_token

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token's text alone, special tokens shown (what a logprob entry names it by). NOTE: kept once
        decoded: every streamed token with logprobs names itself and its alternatives, a decode call each."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self._backend.decode([token_id], skip_special_tokens=False)
        return text

    def decode_stream(self, skip_special_tokens: bool = True) -> Callable[[int], str | None]:
        """step(token_id) -> the text this token adds to the output so far, or None while it ends in an incomplete
        character (tokenizers' DecodeStream, in Rust: one call per token, as vLLM's fast detokenizer does)."""
        stream = tokenizers.decoders.DecodeStream(skip_special_tokens=skip_special_tokens)
        return functools.partial(stream.step, self._backend)  # NOTE: a call per streamed token: no Python frame

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            chat_template: str | None = None, template_kwargs: dict | None = None) -> str:
        """The checkpoint's template (or chat_template, a request's own) rendered as transformers does;
        template_kwargs are extra variables (chat_template_kwargs: enable_thinking, ...; tools), never overriding
        the messages, add_generation_prompt or the special tokens."""
        template = compiled_template(chat_template) if chat_template is not None else self._chat_template
        if template is None:
            raise ValueError("this tokenizer has no chat template")
        special_tokens = {key: text for key, text in self._special_tokens.items() if text is not None}
        return template.render({**(template_kwargs or {}), **special_tokens, "messages": messages,
                                "add_generation_prompt": add_generation_prompt})

    def added_tokens_decoder(self) -> dict[str, dict]:
        """The added (special) tokens as tokenizer_config.json's added_tokens_decoder lists them: id (a string) ->
        {content, lstrip, normalized, rstrip, single_word, special}."""
        return {str(token_id): {"content": token.content, "lstrip": token.lstrip, "normalized": token.normalized,
                                "rstrip": token.rstrip, "single_word": token.single_word, "special": token.special}
                for token_id, token in sorted(self._backend.get_added_tokens_decoder().items())}

    @property
    def eos_token_id(self) -> int:
        eos_text = self._special_tokens["eos_token"]
        eos_id = self._backend.token_to_id(eos_text) if eos_text else None
        if eos_id is None and not self._generation_eos_ids:
            raise ValueError("tokenizer names no eos_token and generation_config.json no eos_token_id")
        return eos_id if eos_id is not None else self._generation_eos_ids[0]

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer knows, added ones included (the model's embedding may be padded beyond)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """EOS plus generation_config.json's eos ids, or, without those, ChatML's end tokens."""
        extra_ids = self._generation_eos_ids or [self._backend.token_to_id(t) for t in CHATML_STOP_TOKENS]
        ids = [self.eos_token_id, *(i for i in extra_ids if i is not None)]
        return tuple(dict.fromkeys(ids))


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    """Read tokenizer.json, tokenizer_config.json, chat_template.jinja and generation_config.json."""
    model_dir = Path(model_dir)
    tokenizer_file = model_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
    tokenizer_config = read_json(model_dir / "tokenizer_config.json")
    return Tokenizer(
        backend=tokenizers.Tokenizer.from_file(str(tokenizer_file)),
        tokenizer_config=tokenizer_config,
        chat_template=find_chat_template(model_dir, tokenizer_config),
        generation_eos_ids=as_id_list(read_json(model_dir / "generation_config.json").get("eos_token_id")),
    )


def max_chars_per_token(backend: tokenizers.Tokenizer) -> int | None:
    """The most characters of input text one token can stand for: its vocabulary string's length (byte-level BPE
    spells a byte as one character, and a character is at least one byte), times how much the normalizer can shrink
    the text. None where one token may stand for any length (an unknown-token model that fuses unknown runs, a
    WordPiece or WordLevel one whose unknown token covers a whole word, a normalizer that deletes text)."""
    spec = json.loads(backend.to_str())
    model = spec["model"]
    if model["type"] != "BPE" or (model.get("unk_token") is not None and model.get("fuse_unk")):
        return None
    shrink = normalizer_shrink(spec.get("normalizer"))
    if shrink is None:
        return None
    longest = max(len(text) for text in backend.get_vocab(with_added_tokens=True))
    return longest * shrink


def normalizer_shrink(normalizer: dict | None) -> int | None:
    if normalizer is None:
        return 1
    if normalizer["type"] == "Sequence":
        factors = [normalizer_shrink(step) for step in normalizer["normalizers"]]
        return None if None in factors else math.prod(factors)
    return NORMALIZER_SHRINK.get(normalizer["type"])


def find_chat_template(model_dir: Path, tokenizer_config: dict) -> str | None:
    """As transformers does: chat_template.jinja wins over the template in tokenizer_config.json."""
    template_file = model_dir / "chat_template.jinja"
    if template_file.is_file():
        return template_file.read_text()
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):
        # Older checkpoints store several named templates; the default one is for plain chat.
        named = {entry["name"]: entry["template"] for entry in template}
        return named.get("default")
    return template


@functools.lru_cache(maxsize=16)
def compiled_template(template: str) -> jinja2.Template:
    """A request's own chat_template, compiled once per parser process (clients resend the same one)."""
    return compile_chat_template(template)


def compile_chat_template(template: str) -> jinja2.Template:
    """Compile with the environment transformers uses, so templates from the Hub render identically."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = template_tojson
    env.globals["raise_exception"] = raise_template_error
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def template_tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson escapes HTML characters, which would change tool schemas inside prompts.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_template_error(message: str):
    raise jinja2.exceptions.TemplateError(message)


def token_text(entry) -> str | None:
    """A special token in tokenizer_config.json is a string or an AddedToken dict with its `content`."""
    return entry.get("content") if isinstance(entry, dict) else entry


def as_id_list(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
