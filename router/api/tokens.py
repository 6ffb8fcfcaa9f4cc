"""vLLM's /tokenize, /detokenize and /version: what clients (lm-eval, guidellm, aiperf) call besides generation;
and, when enabled (--enable-tokenizer-info-endpoint, as vLLM's), /tokenizer_info."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

from aiohttp import web

from router.api.auth import CLIENT_KEY
from router.api.chat import read_template_options, render_chat
from router.api.clients import DEFAULT_CLIENT
from router.api.errors import RequestError, bad_request
from router.api.fields import TEXT, bool_field, decode_json, is_int_list, is_text, read_field
from router.api.handlers import STATE_KEY, read_body
from router.api.prompts import encode_text
from wire.tokenizer import Tokenizer, find_chat_template, read_json

FILE_PATH_KEYS = ("vocab_file", "merges_file")
"""tokenizer_config.json keys that name files on the server's disk: /tokenizer_info leaves them out, as vLLM's."""
DEFAULT_TOKENIZER_CLASS = "PreTrainedTokenizerFast"
"""What transformers loads a tokenizer.json as when tokenizer_config.json names no class."""
TOKENIZER_INFO_KEY = web.AppKey("corun_tokenizer_info", bytes)


def add_token_routes(app: web.Application) -> None:
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/version", version)
    state = app[STATE_KEY]
    if state.config.enable_tokenizer_info_endpoint:
        # NOTE: the files do not change while the router runs: read once
        app[TOKENIZER_INFO_KEY] = tokenizer_info_body(state.config.model, state.tokenizer)
        app.router.add_get("/tokenizer_info", tokenizer_info)


async def tokenize(request: web.Request) -> web.Response:
    """{"prompt": TEXT} or {"messages": [...]} -> {"count", "max_model_len", "tokens", "token_strs"} (as vLLM
    answers; token_strs null unless return_token_strs)."""
    state = request.app[STATE_KEY]
    with state.clients.request(request.get(CLIENT_KEY, DEFAULT_CLIENT)):
        body = await read_body(request)
        info = await state.model_info()
        return json_bytes_response(await state.offload.run(tokenize_body, body, info.served_model_name,
                                                           info.max_model_len, info.trust_request_chat_template))


async def detokenize(request: web.Request) -> web.Response:
    """{"tokens": [ids]} -> {"prompt": TEXT}."""
    state = request.app[STATE_KEY]
    with state.clients.request(request.get(CLIENT_KEY, DEFAULT_CLIENT)):
        body = await read_body(request)
        info = await state.model_info()
        return json_bytes_response(await state.offload.run(detokenize_body, body, info.served_model_name,
                                                           info.vocab_size))


def tokenize_body(tokenizer: Tokenizer, body: bytes, served_model_name: str, max_model_len: int,
                  trust_request_chat_template: bool = False) -> bytes:
    """The answer's JSON, made off the event loop (router/api/offload.py): a long prompt's token list is large."""
    fields = model_fields(body, served_model_name)
    param = "messages" if "messages" in fields else "prompt"
    if "messages" in fields:
        # NOTE: as vLLM's chat tokenize request: the template's options, and no special tokens added by default
        text = render_chat(fields["messages"], tokenizer, read_template_options(fields, trust_request_chat_template))
    else:
        text = read_field(fields, "prompt", None, is_text, f"a string of {TEXT}")
        if text is None:
            raise bad_request("give 'prompt' (a string) or 'messages'", param="prompt")
    add_special_tokens = bool_field(fields, "add_special_tokens", param == "prompt")
    tokens = list(encode_text(text, tokenizer, max_model_len, param, add_special_tokens))
    token_strs = [tokenizer.id_to_token(t) for t in tokens] if bool_field(fields, "return_token_strs", False) \
        else None
    return json.dumps({"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens,
                       "token_strs": token_strs}).encode()


def detokenize_body(tokenizer: Tokenizer, body: bytes, served_model_name: str, vocab_size: int) -> bytes:
    fields = model_fields(body, served_model_name)
    tokens = read_field(fields, "tokens", None, lambda v: is_int_list(v) and all(0 <= t < vocab_size for t in v),
                        f"a list of token ids in [0, {vocab_size})")
    if tokens is None:
        raise bad_request("'tokens' is required", param="tokens")
    skip = bool_field(fields, "skip_special_tokens", True)
    return json.dumps({"prompt": tokenizer.decode(tokens, skip_special_tokens=skip)}).encode()


async def tokenizer_info(request: web.Request) -> web.Response:
    return json_bytes_response(request.app[TOKENIZER_INFO_KEY])


def tokenizer_info_body(model_dir: str | Path, tokenizer: Tokenizer) -> bytes:
    """vLLM's /tokenizer_info: tokenizer_config.json's settings without file paths, the tokens the tokenizer adds
    (added_tokens_decoder, from tokenizer.json when the config lists none) and the chat template the router renders.

    NOTE: vLLM shows its loaded transformers tokenizer (init_kwargs, and its Python class as tokenizer_class, e.g.
    CachedQwen2TokenizerFast); the router has no transformers (it never imports torch), so this is the file they
    come from, with the file's tokenizer_class. vLLM 0.32 (transformers 5) flattens each added token to its text;
    here each keeps its attributes, as tokenizer_config.json writes them and vLLM's own test reads them."""
    model_dir = Path(model_dir)
    config = read_json(model_dir / "tokenizer_config.json")
    info = {key: value for key, value in config.items() if key not in FILE_PATH_KEYS}
    info["added_tokens_decoder"] = config.get("added_tokens_decoder") or tokenizer.added_tokens_decoder()
    info["tokenizer_class"] = config.get("tokenizer_class") or DEFAULT_TOKENIZER_CLASS
    info.pop("chat_template", None)
    template = find_chat_template(model_dir, config)
    if template:
        info["chat_template"] = template
    return json.dumps(info).encode()


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": importlib.metadata.version("corun-cluster")})


def model_fields(body: bytes, served_model_name: str) -> dict:
    fields = decode_json(body)
    if not isinstance(fields, dict):
        raise bad_request("the request body must be a JSON object")
    model = read_field(fields, "model", served_model_name, lambda v: isinstance(v, str), "a string")
    if model != served_model_name:
        raise RequestError(404, f"The model `{model}` does not exist.", param="model")
    return fields


def json_bytes_response(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json")
