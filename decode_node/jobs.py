"""What a decode node holds per request: the DecodeRequest's job (its samples, the KV handle it reads) and each
sample once it runs (decode_node/server.py's lifecycle)."""

from __future__ import annotations

from dataclasses import dataclass, field

from corun.kv_swap import SwappedBlocks
from corun.request import Request
from transfer.reads import ReadHandle
from wire import protocol


@dataclass
class DecodeJob:
    """One DecodeRequest: its prompt's KV is read once into the first sample's blocks, then copied to the others."""

    router: bytes
    request_id: str
    samples: dict[int, Request]
    """Sample index -> its request (seed sample_seed(seed, index)); the first one receives the READ."""
    kv: protocol.KVHandle
    read: ReadHandle | None = None
    aborted: bool = False
    dropped: set[int] = field(default_factory=set)
    """Samples aborted alone before running (a stop string ended them): freed once the READ is done."""
    claimed_at: float = 0.0
    """When its claim (or the handshake it waits on) was sent."""
    grammar_ready: bool = True
    """False while its structured-output constraint compiles: its KV is claimed and read meanwhile, it runs once
    both are done."""

    @property
    def reader(self) -> Request:
        return next(iter(self.samples.values()))


@dataclass(eq=False)
class RunningSample:
    job: DecodeJob
    index: int
    request: Request
    order: int
    """When it started running: older samples keep their blocks, the newest are paused first."""
    swapped: SwappedBlocks | None = None
    """Paused: its last blocks, in host memory (request.block_ids holds those still in the cache)."""
