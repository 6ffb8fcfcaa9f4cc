"""The API key check: with RouterConfig.api_key set, every request needs `Authorization: Bearer <key>` except the
probes that vLLM leaves open too (/health, /version, /metrics)."""

from __future__ import annotations

from aiohttp import web

from router.api.errors import RequestError
from wire.auth import is_authorized

OPEN_PATHS = frozenset({"/health", "/version", "/metrics"})
"""NOTE: a list of what is open rather than of what is protected: a route added later needs the key unless it
is named here."""


def api_key_middleware(api_key: str):
    @web.middleware
    async def require_api_key(request: web.Request, handler) -> web.StreamResponse:
        if request.path not in OPEN_PATHS and not is_authorized(request.headers.get("Authorization"), api_key):
            raise RequestError(401, "a valid API key is required: send `Authorization: Bearer <key>`",
                               headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return require_api_key
