"""vLLM's /tokenize, /detokenize and /version: what clients (lm-eval, guidellm, aiperf) call besides generation."""

from __future__ import annotations

import importlib.metadata

from aiohttp import web

from router.chat import render_chat
from router.errors import RequestError, bad_request
from router.fields import bool_field, is_int_list, read_field
from router.handlers import STATE_KEY, read_json_body


def add_token_routes(app: web.Application) -> None:
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/version", version)


async def tokenize(request: web.Request) -> web.Response:
    """{"prompt": TEXT} or {"messages": [...]} -> {"count", "max_model_len", "tokens"} (as vLLM answers)."""
    state = request.app[STATE_KEY]
    body = await model_body(request)
    if "messages" in body:
        text = render_chat(body["messages"], state.tokenizer)
    else:
        text = read_field(body, "prompt", None, lambda v: isinstance(v, str), "a string")
        if text is None:
            raise bad_request("give 'prompt' (a string) or 'messages'", param="prompt")
    read_field(body, "add_special_tokens", True, lambda v: isinstance(v, bool), "a boolean")
    tokens = state.tokenizer.encode(text)
    info = await state.model_info()
    return web.json_response({"count": len(tokens), "max_model_len": info.max_model_len, "tokens": tokens})


async def detokenize(request: web.Request) -> web.Response:
    """{"tokens": [ids]} -> {"prompt": TEXT}."""
    state = request.app[STATE_KEY]
    body = await model_body(request)
    info = await state.model_info()
    tokens = read_field(body, "tokens", None, lambda v: is_int_list(v) and all(0 <= t < info.vocab_size for t in v),
                        f"a list of token ids in [0, {info.vocab_size})")
    if tokens is None:
        raise bad_request("'tokens' is required", param="tokens")
    skip = bool_field(body, "skip_special_tokens", True)
    return web.json_response({"prompt": state.tokenizer.decode(tokens, skip_special_tokens=skip)})


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": importlib.metadata.version("corun-cluster")})


async def model_body(request: web.Request) -> dict:
    body = await read_json_body(request)
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    served = request.app[STATE_KEY].config.served_model_name
    model = read_field(body, "model", served, lambda v: isinstance(v, str), "a string")
    if model != served:
        raise RequestError(404, f"The model `{model}` does not exist.", param="model")
    return body
