"""The API key check: with RouterConfig.api_key set, every request needs `Authorization: Bearer <key>` with it or
one of client_api_keys_file's, except the probes that vLLM leaves open too (/health, /version, /metrics); the
admin API needs api_key itself. The key names the request's client (router/api/clients.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from aiohttp import web

from router.api.errors import RequestError
from wire.auth import bearer_digest, check_api_key, key_digest
from wire.config import RouterConfig

OPEN_PATHS = frozenset({"/health", "/version", "/metrics"})
"""NOTE: a list of what is open rather than of what is protected: a route added later needs the key unless it
is named here."""
ADMIN_PATH_PREFIX = "/admin/"
"""The pool's admin API (router/api/admin.py): the operator's key only."""
CLIENT_KEY = web.RequestKey("corun_client", str)
"""The request's client: a name made from its API key (never the key itself)."""
OPERATOR = "operator"
"""The client of RouterConfig.api_key."""


def load_api_keys(config: RouterConfig) -> dict[bytes, str]:
    """Each accepted key's SHA-256 digest -> its client's name; {} when the router has no key. ValueError for a key
    that is not one (wire.auth.check_api_key) or given twice, FileNotFoundError for a missing file."""
    if config.api_key is None:
        return {}
    keys = [config.api_key]
    if config.client_api_keys_file is not None:
        lines = Path(config.client_api_keys_file).read_text().splitlines()
        keys += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if len(keys) == 1:
            raise ValueError(f"{config.client_api_keys_file} holds no API key")
    for key in keys:
        check_api_key(key)
    if len(set(keys)) != len(keys):
        raise ValueError("an API key is given twice (--api-key, --client-api-keys-file)")
    return {key_digest(key): OPERATOR if key == config.api_key else client_name(key) for key in keys}


def client_name(api_key: str) -> str:
    """What logs and limits call a key's client: a digest prefix, from which the key cannot be learnt."""
    return "key-" + hashlib.sha256(b"corun client " + api_key.encode()).hexdigest()[:12]


def api_key_middleware(keys: dict[bytes, str]):
    """NOTE: the presented token is looked up by its SHA-256 digest: what the lookup's time depends on is the
    digest, which tells nothing of any key (wire.auth.is_authorized compares digests for the same reason)."""

    @web.middleware
    async def require_api_key(request: web.Request, handler) -> web.StreamResponse:
        if request.path not in OPEN_PATHS:
            client = keys.get(bearer_digest(request.headers.get("Authorization")))
            if client is None:
                raise RequestError(401, "a valid API key is required: send `Authorization: Bearer <key>`",
                                   headers={"WWW-Authenticate": "Bearer"})
            if client != OPERATOR and request.path.startswith(ADMIN_PATH_PREFIX):
                raise RequestError(403, "the admin API needs the operator's key (the router's --api-key)")
            request[CLIENT_KEY] = client
        return await handler(request)

    return require_api_key
