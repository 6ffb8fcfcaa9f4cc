"""The hash chain that names a prompt's full chunks: chunk k's hash covers its tokens and every token before it.

Torch-free: the prefill and colocated nodes key their prefix caches by it (corun/prefix_cache.py) and the router
its prefix-aware routing map (router/nodes/choice.py).
"""

from __future__ import annotations

import hashlib
import sys
from array import array


def chunk_hash_chain(token_ids: list[int], chunk_size: int, salt: bytes, max_chunks: int | None = None) -> list[bytes]:
    """One hash per full chunk of chunk_size tokens (a partial last chunk has none), at most max_chunks: hash k =
    sha256(hash k-1 + chunk k's tokens as little-endian int64), hash -1 = salt (what else shapes the chunk's KV:
    the engine's settings, so that two engines' chains never meet)."""
    num_chunks = len(token_ids) // chunk_size
    if max_chunks is not None:
        num_chunks = min(num_chunks, max_chunks)
    hashes, previous = [], salt
    for k in range(num_chunks):
        tokens = array("q", token_ids[k * chunk_size:(k + 1) * chunk_size])
        if sys.byteorder == "big":  # NOTE: one spelling on every host
            tokens.byteswap()
        previous = hashlib.sha256(previous + tokens.tobytes()).digest()
        hashes.append(previous)
    return hashes
