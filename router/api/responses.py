"""Response bodies and stream chunks of /v1/completions and /v1/chat/completions (OpenAI format, vLLM extras).

Extras: `seed` (the request's bound seed) at the top level, and in every choice its own `seed` (sample i of n:
wire.seeding.sample_seed(seed, i); with n = 1 the request's seed). The keys vLLM always sends, null when not asked
for (`token_ids`, `prompt_token_ids`: return_token_ids; `prompt_logprobs`), are always present.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec

from router.api.openai_api import Kind
from router.api.tools import ToolRequest, chat_message
from router.generation.output import ChoiceDelta, OutputOptions
from wire.outputs import TokenLogprobs
from wire.seeding import sample_seed
from wire.tokenizer import Tokenizer

LOWEST_LOGPROB = -9999.0
"""JSON has no -inf: as vLLM, impossible tokens get this logprob."""
JSON_ENCODER = msgspec.json.Encoder()
"""Every body and chunk: msgspec's JSON, in C: the values json.dumps(ensure_ascii=False) writes (UTF-8, the same key
order and floats) without its spaces; logprobs are finite (LOWEST_LOGPROB is -inf's)."""


@dataclass
class ChoiceTotal:
    """A choice's deltas added up (non-streaming responses, usage)."""

    index: int
    text_parts: list[str] = field(default_factory=list)
    """NOTE: joined once (text): a string grown per token copies itself whole each time."""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    prompt_logprobs: tuple[TokenLogprobs | None, ...] | None = None
    num_cached_tokens: int | None = None

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def add(self, delta: ChoiceDelta) -> None:
        if delta.num_cached_tokens is not None:
            self.num_cached_tokens = delta.num_cached_tokens
        self.prompt_logprobs = delta.prompt_logprobs if delta.prompt_logprobs is not None else self.prompt_logprobs
        self.text_parts.append(delta.text)
        self.token_ids += delta.token_ids
        if delta.logprobs is not None:
            self.logprobs = self.logprobs if self.logprobs is not None else []
            self.logprobs.extend(delta.logprobs)
        self.finish_reason = delta.finish_reason or self.finish_reason
        self.stop_reason = delta.stop_reason if delta.stop_reason is not None else self.stop_reason


@dataclass(frozen=True)
class ResponseContext:
    """What every body and chunk of one response repeats."""

    kind: Kind
    request_id: str
    created: int
    model: str
    system_fingerprint: str
    seed: int
    num_top_logprobs: int | None
    tokenizer: Tokenizer
    output: OutputOptions = OutputOptions()
    prompts: tuple[tuple[int, ...], ...] = ()
    """Each choice's prompt token ids (echo, prompt_logprobs)."""
    n: int = 1
    """Samples per prompt: choice index = prompt index * n + sample index."""
    tools: ToolRequest | None = None
    """Chat with tools: the output becomes tool calls (router/api/tools.py)."""
    prompt_tokens_details: bool = False
    """usage.prompt_tokens_details.cached_tokens, when some prompt tokens were cached (RouterSettings'
    enable_prompt_tokens_details)."""

    def cached_tokens(self, choice_to_cached: dict[int, int | None]) -> int | None:
        """The prompt tokens served from prefix caches, each prompt's once (its first sample's), for usage; None
        unless asked for (as vLLM: --enable-prompt-tokens-details)."""
        if not self.prompt_tokens_details:
            return None
        return sum(cached or 0 for index, cached in choice_to_cached.items() if index % self.n == 0)

    def choice_seed(self, index: int) -> int:
        return sample_seed(self.seed, index % self.n)

    @property
    def tokens_as_ids(self) -> bool:
        """return_tokens_as_token_ids: logprob entries name tokens "token_id:<id>"."""
        return self.output.return_tokens_as_token_ids

    @property
    def shows_prompt(self) -> bool:
        return self.kind == "completion" and (self.output.echo or self.output.prompt_logprobs is not None)

    def envelope(self, streaming: bool) -> dict:
        if self.kind == "completion":
            response_id, object_name = f"cmpl-{self.request_id}", "text_completion"
        else:
            response_id = f"chatcmpl-{self.request_id}"
            object_name = "chat.completion.chunk" if streaming else "chat.completion"
        return {"id": response_id, "object": object_name, "created": self.created, "model": self.model,
                "system_fingerprint": self.system_fingerprint, "seed": self.seed}


def response_body(ctx: ResponseContext, totals: list[ChoiceTotal], num_prompt_tokens: int) -> bytes:
    """The whole response's JSON. NOTE: each choice is encoded as soon as it is built and its logprobs let go, so
    the router holds one choice's formatted logprobs at a time (a dict per token and alternative, ~6x their JSON)
    beside the encoded ones: n = 32 samples of 1,024 tokens with 20 logprobs and the echoed prompt's took ~300 MB
    at once for a 43 MB body."""
    num_completion_tokens = 0 if ctx.output.drop_generated else sum(len(total.token_ids) for total in totals)
    cached = ctx.cached_tokens({total.index: total.num_cached_tokens for total in totals})
    top_prompt_keys = prompt_keys(ctx, 0, totals[0].prompt_logprobs) if ctx.kind == "chat" and totals else {}
    choices = []
    for total in totals:
        choices.append(msgspec.Raw(JSON_ENCODER.encode(choice_body(
            ctx, total.index, total.text, total.token_ids, total.logprobs, total.finish_reason, total.stop_reason,
            total.prompt_logprobs))))
        total.logprobs = total.prompt_logprobs = None
    # NOTE: vLLM's chat has the prompt's keys once, beside the choices
    return JSON_ENCODER.encode({**ctx.envelope(streaming=False), "choices": choices,
                                "usage": usage(num_prompt_tokens, num_completion_tokens, cached), **top_prompt_keys})


def choice_body(ctx: ResponseContext, index: int, text: str, token_ids, logprobs, finish_reason,
                stop_reason=None, prompt_logprobs=None) -> dict:
    seed = ctx.choice_seed(index)
    if ctx.shows_prompt:
        return {"index": index, **completion_with_prompt(ctx, index, text, token_ids, logprobs, prompt_logprobs, 0),
                "finish_reason": finish_reason, "stop_reason": stop_reason, "seed": seed}
    formatted = None if logprobs is None else format_logprobs(ctx, logprobs, text_offset=0)[0]
    if ctx.kind == "completion":
        return {"index": index, "text": text, "logprobs": formatted, "finish_reason": finish_reason,
                "stop_reason": stop_reason, "token_ids": shown_token_ids(ctx, token_ids), **prompt_keys(ctx, index),
                "seed": seed}
    message, finish_reason = chat_message(ctx.tools, ctx.request_id, index, ctx.output.chat_echo + text,
                                          finish_reason)
    return {"index": index, "message": message, "logprobs": formatted, "finish_reason": finish_reason,
            "stop_reason": stop_reason, "token_ids": shown_token_ids(ctx, token_ids), "seed": seed}


def shown_token_ids(ctx: ResponseContext, token_ids) -> list[int] | None:
    """A choice's generated token ids, sent (as vLLM) only when the request asked for them (return_token_ids)."""
    return list(token_ids) if ctx.output.return_token_ids else None


def prompt_keys(ctx: ResponseContext, index: int, prompt_logprobs=None) -> dict:
    """Choice index's prompt_logprobs and prompt_token_ids (vLLM's: in each completion choice, beside a chat's
    choices), null unless asked for."""
    wanted = ctx.output.prompt_logprobs is not None and prompt_logprobs is not None
    return {"prompt_logprobs": vllm_prompt_logprobs(ctx, prompt_logprobs, ctx.output.prompt_logprobs) if wanted
            else None,
            "prompt_token_ids": list(ctx.prompts[index]) if ctx.output.return_token_ids else None}


def completion_with_prompt(ctx: ResponseContext, index: int, text: str, token_ids, logprobs, prompt_logprobs,
                           text_offset: int) -> dict:
    """A completion choice's text, logprobs and token ids with the prompt shown: echo puts the prompt's text
    (and, with logprobs, its tokens: the first without a logprob, as OpenAI's) before the completion;
    prompt_logprobs adds vLLM's field; max_tokens 0 drops the one generated token."""
    prompt_ids = ctx.prompts[index]
    if ctx.output.drop_generated:
        text, token_ids, logprobs = "", (), (() if logprobs is not None else None)
    body = {"text": text, "token_ids": shown_token_ids(ctx, token_ids), "logprobs": None}
    prompt_text = ctx.tokenizer.decode(list(prompt_ids)) if ctx.output.echo else ""
    if ctx.output.echo:
        body["text"] = prompt_text + text
    if logprobs is not None:
        prompt_part = echoed_logprobs(ctx, prompt_ids, prompt_logprobs) if ctx.output.echo else None
        start = text_offset + (len(prompt_text) if ctx.output.echo else 0)
        generated, _ = completion_logprobs(ctx, logprobs, start)
        body["logprobs"] = generated if prompt_part is None else {
            key: prompt_part[key] + generated[key] for key in generated}
    return {**body, **prompt_keys(ctx, index, prompt_logprobs)}


def echoed_logprobs(ctx: ResponseContext, prompt_ids, prompt_logprobs) -> dict:
    """The prompt's part of completion logprobs (echo); the first token has none (null), as OpenAI's."""
    body = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = 0
    for position, token_id in enumerate(prompt_ids):
        lp = prompt_logprobs[position] if prompt_logprobs is not None else None
        token, text = entry_token_and_text(ctx, token_id)
        body["tokens"].append(token)
        body["text_offset"].append(offset)
        offset += len(text)  # NOTE: offsets count text, not "token_id:<id>"
        if lp is None:
            body["token_logprobs"].append(None)
            body["top_logprobs"].append(None)
            continue
        body["token_logprobs"].append(json_logprob(lp.logprob))
        body["top_logprobs"].append(top_logprobs_of(ctx, token, lp))
    return body


def vllm_prompt_logprobs(ctx: ResponseContext, prompt_logprobs, num_top: int) -> list:
    """vLLM's prompt_logprobs: per prompt token None (the first) or {token id: {logprob, decoded_token}} with
    the token itself and its num_top most likely alternatives."""
    entries = []
    for lp in prompt_logprobs:
        if lp is None:
            entries.append(None)
            continue
        pairs = [(lp.token_id, lp.logprob), *lp.top[:num_top]]  # NOTE: the prompt's token first, as vLLM
        entries.append({str(t): {"logprob": json_logprob(v), "decoded_token": entry_token(ctx, t)} for t, v in pairs})
    return entries


def chunk_choice(ctx: ResponseContext, delta: ChoiceDelta, text_offset: int,
                 first: bool = False) -> tuple[dict, int]:
    """The choice of a stream chunk for one delta (the chunk's envelope: ResponseContext.envelope), and the text
    offset after it (completions logprobs count from it); a choice's first chunk shows the prompt when asked (echo,
    prompt_logprobs)."""
    if ctx.shows_prompt and first:
        shown = completion_with_prompt(ctx, delta.index, delta.text, delta.token_ids, delta.logprobs,
                                       delta.prompt_logprobs, 0)
        choice = {"index": delta.index, **shown, "finish_reason": delta.finish_reason,
                  "stop_reason": delta.stop_reason, "seed": ctx.choice_seed(delta.index)}
        return choice, len(shown["text"])
    formatted, end_offset = None, text_offset
    if delta.logprobs is not None:
        formatted, end_offset = format_logprobs(ctx, delta.logprobs, text_offset)
    choice = {"index": delta.index, "logprobs": formatted, "finish_reason": delta.finish_reason,
              "stop_reason": delta.stop_reason, "token_ids": shown_token_ids(ctx, delta.token_ids),
              "seed": ctx.choice_seed(delta.index)}
    if ctx.kind == "completion":
        choice["text"] = delta.text
        # NOTE: as vLLM's stream, every chunk has the key; the prompt's ids come once, in the first (when asked)
        choice["prompt_token_ids"] = list(ctx.prompts[delta.index]) if first and ctx.output.return_token_ids else None
    else:
        choice["delta"] = {"content": delta.text}
    return choice, end_offset


def role_choice(index: int) -> dict:
    """A chat stream opens each choice with the assistant role, as OpenAI's does."""
    return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}


def usage_chunk(ctx: ResponseContext, num_prompt_tokens: int, num_completion_tokens: int,
                num_cached_tokens: int | None = None) -> dict:
    return {**ctx.envelope(streaming=True), "choices": [],
            "usage": usage(num_prompt_tokens, num_completion_tokens, num_cached_tokens)}


def usage(num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int | None = None) -> dict:
    """OpenAI's usage; prompt_tokens_details only when some prompt tokens were cached, as vLLM's."""
    body = {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_completion_tokens,
            "total_tokens": num_prompt_tokens + num_completion_tokens}
    if num_cached_tokens:
        body["prompt_tokens_details"] = {"cached_tokens": num_cached_tokens}
    return body


def format_logprobs(ctx: ResponseContext, logprobs, text_offset: int) -> tuple[dict, int]:
    if ctx.kind == "chat":
        return {"content": [chat_token_logprob(ctx, lp) for lp in logprobs]}, text_offset
    return completion_logprobs(ctx, logprobs, text_offset)


def completion_logprobs(ctx: ResponseContext, logprobs, text_offset: int) -> tuple[dict, int]:
    """{tokens, token_logprobs, top_logprobs (token text -> logprob, chosen token included), text_offset}."""
    body = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for lp in logprobs:
        token, text = entry_token_and_text(ctx, lp.token_id)
        body["tokens"].append(token)
        body["token_logprobs"].append(json_logprob(lp.logprob))
        body["top_logprobs"].append(top_logprobs_of(ctx, token, lp))
        body["text_offset"].append(text_offset)
        text_offset += len(text)  # NOTE: text, not "token_id:<id>"
    return body, text_offset


def top_logprobs_of(ctx: ResponseContext, token: str, lp: TokenLogprobs) -> dict:
    """{token: logprob} with the sampled token first (vLLM's order: clients read next(iter(...))), then the most
    likely ones. NOTE: as vLLM's dict, a later token with the same text (two byte tokens both shown as "\ufffd")
    overwrites the value and keeps the first one's place."""
    return {token: json_logprob(lp.logprob),
            **{entry_token(ctx, t): json_logprob(v) for t, v in lp.top[:ctx.num_top_logprobs]}}


def chat_token_logprob(ctx: ResponseContext, lp: TokenLogprobs) -> dict:
    top = [token_entry(ctx, t, v) for t, v in lp.top[:ctx.num_top_logprobs]]
    return {**token_entry(ctx, lp.token_id, lp.logprob), "top_logprobs": top}


def token_entry(ctx: ResponseContext, token_id: int, logprob: float) -> dict:
    token = entry_token(ctx, token_id)
    return {"token": token, "logprob": json_logprob(logprob), "bytes": list(token.encode("utf-8"))}


def entry_token(ctx: ResponseContext, token_id: int) -> str:
    """How a logprob entry names its token: its text, or "token_id:<id>" (return_tokens_as_token_ids)."""
    return entry_token_and_text(ctx, token_id)[0]


def entry_token_and_text(ctx: ResponseContext, token_id: int) -> tuple[str, str]:
    """(entry_token, the token's text), the text looked up once (completions' offsets count text)."""
    text = token_text(ctx.tokenizer, token_id)
    return (f"token_id:{token_id}" if ctx.tokens_as_ids else text), text


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    # NOTE: special tokens are shown (a logprob entry must name its token even if the text hides it).
    return tokenizer.token_text(token_id)


def json_logprob(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else LOWEST_LOGPROB
