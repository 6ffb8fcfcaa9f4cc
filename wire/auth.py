"""The cluster's API key: where it comes from, what a valid one is, and how a request's Authorization header is
checked. Shared by the router, `corun serve`'s control port and their clients (`corun scale`, the launchers).

As vLLM: `--api-key KEY`, else the environment's VLLM_API_KEY; clients send `Authorization: Bearer KEY`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

API_KEY_ENV = "VLLM_API_KEY"
"""vLLM's name, so that a deployment's existing secret works unchanged. The launchers hand the key to the router
process in this variable too: a command line is visible to every user in `ps`, a process' environment is not."""


def resolve_api_key(flag_value: str | None, environ: Mapping[str, str]) -> str | None:
    """The flag if given, else the environment's VLLM_API_KEY; None: no key (requests need none).

    NOTE: an empty VLLM_API_KEY counts as unset, as in vLLM; an empty --api-key is refused by check_api_key."""
    if flag_value is not None:
        return flag_value
    return environ.get(API_KEY_ENV) or None


def check_api_key(api_key: str | None) -> None:
    """ValueError unless None or a usable bearer token: printable ASCII without spaces (it travels in a header)."""
    if api_key is not None and not (api_key and all("!" <= char <= "~" for char in api_key)):
        raise ValueError("the API key must be non-empty printable ASCII without spaces (it is sent in an HTTP "
                         "Authorization header)")


def is_authorized(authorization: str | None, api_key: str) -> bool:
    """Whether an Authorization header value is `Bearer <api_key>`.

    NOTE: compares SHA-256 digests with hmac.compare_digest, as vLLM does: constant time, and of equal length
    whatever the client sent, so neither the key's content nor its length leaks through timing."""
    presented = bearer_digest(authorization)
    return presented is not None and hmac.compare_digest(presented, key_digest(api_key))


def bearer_digest(authorization: str | None) -> bytes | None:
    """The SHA-256 digest of the token in an Authorization header value `Bearer <token>`; None for another scheme."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return hashlib.sha256(token.strip().encode("utf-8", "surrogateescape")).digest()


def key_digest(api_key: str) -> bytes:
    return hashlib.sha256(api_key.encode()).digest()


def bearer_headers(api_key: str | None) -> dict[str, str]:
    """The header a client sends (none without a key)."""
    return {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
