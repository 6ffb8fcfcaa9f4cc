"""What two peers must agree on before one may read the other's KV blocks, and its hash.

The decode node sends its compat dict in HandshakeRequest; the prefill node answers with its own and the hash.
Every field changes the meaning of the bytes in a block (or the outputs built from them), so a single difference
refuses the peer: a KV block read under another layout or N is silently wrong, never an error.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from wire.protocol import PROTOCOL_VERSION

KV_LAYOUT = "block-major:[blocks,layers,kv,block,heads,dim]"
"""corun.kv_cache.PagedKVCache's layout: one block is one contiguous region of every layer's K and V."""

REQUIRED_FIELDS = (
    "model_digest", "dtype", "num_layers", "num_kv_heads", "head_dim", "block_size",
    "max_num_seqs", "prefill_chunk_size", "max_model_len",
)
"""Fields the caller must give: they come from the model and the engine config."""

DEFAULTED_FIELDS = ("kv_layout", "protocol_version")
"""Fields this code base fixes; a caller passes them only to describe another peer (tests)."""


class IncompatiblePeer(RuntimeError):
    """A peer whose KV blocks cannot be used here: the handshake or a registration check failed."""


def compat_info(*, kv_layout: str = KV_LAYOUT, protocol_version: int = PROTOCOL_VERSION, **fields: Any) -> dict:
    """Everything that must match between two peers, as a plain (msgpack- and JSON-able) dict."""
    missing = sorted(set(REQUIRED_FIELDS) - fields.keys())
    unknown = sorted(fields.keys() - set(REQUIRED_FIELDS))
    if missing or unknown:
        raise ValueError(f"compat_info: missing fields {missing}, unknown fields {unknown}")
    info = {name: _plain(fields[name]) for name in REQUIRED_FIELDS}
    return {**info, "kv_layout": kv_layout, "protocol_version": protocol_version}


def compat_hash(info: dict) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces): the same dict gives the same hash in any process."""
    canonical = json.dumps(info, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def check_compatible(local: dict, remote: dict, peer: str) -> None:
    """Raise IncompatiblePeer naming every field (with both values) that differs, or is missing on one side."""
    mismatches = [f"{name} {local.get(name, '<missing>')} != {remote.get(name, '<missing>')}"
                  for name in sorted(local.keys() | remote.keys()) if local.get(name) != remote.get(name)]
    if mismatches:
        raise IncompatiblePeer(f"peer {peer} is incompatible: " + "; ".join(mismatches))


def _plain(value: Any) -> Any:
    # NOTE: torch.dtype is accepted for convenience but stored as "float32" etc., so the dict stays torch-free
    # and hashes the same whether the caller passed torch.float32 or "float32".
    text = str(value)
    return text.removeprefix("torch.") if text.startswith("torch.") else value
