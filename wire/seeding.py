"""Request seeds for requests that bring none (torch-free: the router imports it)."""

from __future__ import annotations

import hashlib

SEED_BOUND = 2**63
"""Seeds live in [0, 2**63) so that they fit a signed int64 tensor on the sampler side."""


def seed_from_request_id(request_id: str, base_seed: int = 0) -> int:
    """A stable seed in [0, 2**63) derived from the engine's base seed and the request id.

    NOTE: blake2b rather than `hash()`, which is salted per process (PYTHONHASHSEED): every router,
    node and restart must derive the same seed, so that a failover re-run samples the same tokens.
    """
    # NOTE: a fixed-width prefix keeps (base_seed, request_id) -> bytes unambiguous.
    prefix = base_seed.to_bytes(16, "little", signed=True)
    digest = hashlib.blake2b(prefix + request_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % SEED_BOUND


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample `index` of a request with n samples: the request's seed for sample 0, else a hash of
    (seed, index) in [0, 2**63). Sample i is bitwise a single request sent with this seed."""
    if index == 0:
        return seed
    # NOTE: signed: a negative (int64) seed has its own bytes; a seed >= 0 has the bytes it always had
    digest = hashlib.blake2b(seed.to_bytes(8, "little", signed=True) + index.to_bytes(8, "little"), digest_size=8,
                             person=b"corun-sample").digest()
    return int.from_bytes(digest, "little") % SEED_BOUND
