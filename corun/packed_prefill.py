"""What one launch of the packed prefill kernel (corun/kernels/prefill_attention.py) reads: its sequences and
query tiles, built on the host by the step's inputs and read on the device by the kernel."""

from __future__ import annotations

from dataclasses import dataclass

import torch

PREFILL_QUERY_TILE = 64
"""Query positions per program of the packed prefill kernel, tiles aligned at each sequence's position 0."""


@dataclass
class PackedPrefillMeta:
    """The sequences of one packed prefill launch, as device tensors; shapes depend only on the forward's fixed
    (rows, sequences), so a CUDA graph can capture the launch and replay it with other contents."""

    query_starts: torch.Tensor  # [num_seqs] int32: step row of the sequence's first query token
    start_positions: torch.Tensor  # [num_seqs] int32: absolute position of that token
    num_tokens: torch.Tensor  # [num_seqs] int32: query tokens this step (0: an unused sequence slot)
    block_tables: torch.Tensor  # [num_seqs, blocks] int64
    tile_seqs: torch.Tensor  # [num_programs] int32: the sequence each program's query tile belongs to, -1: none
    tile_starts: torch.Tensor  # [num_programs] int32: absolute position of the tile's first query token

    def tensors(self) -> list[torch.Tensor]:
        return [self.query_starts, self.start_positions, self.num_tokens, self.block_tables, self.tile_seqs,
                self.tile_starts]

    def to(self, device) -> PackedPrefillMeta:
        return PackedPrefillMeta(*(t.to(device) for t in self.tensors()))


def max_prefill_tiles(num_rows: int, num_seqs: int) -> int:
    """Query tiles a forward of num_rows rows holding up to num_seqs sequences can need (each sequence's chunk
    starts anywhere in a tile, so it can straddle one more tile than its length fills)."""
    return -(-num_rows // PREFILL_QUERY_TILE) + 2 * num_seqs


PREFILL_TILE_BAND = 512
"""Positions per band of the packed prefill kernel's launch order (packed_prefill_tiles)."""


def packed_prefill_tiles(start_positions: list[int], num_tokens: list[int], num_programs: int):
    """-> (tile_seqs, tile_starts) lists padded with -1 / 0 to num_programs (0: exactly as many as needed): the query
    tiles in bands of PREFILL_TILE_BAND positions, the band with the most keys first, sequence by sequence within a
    band and each sequence's tiles latest first.

    NOTE: a query tile's work grows with its position (it reads every key up to it), and the GPU starts programs
    in launch order; launched sequence by sequence from position 0, one 4,096-token prompt's last, longest tiles start
    when most SMs are done. Within a band a sequence's tiles launch together, so its keys are still in L2 (every tile
    by its position alone put 32 x 256-token packs at +8%). Measured on an H100 (8B shape, one layer,
    benchmarks/results/h100_prefill_kernel_sweep_bands_stop55.json), ms before / after: 4,096 tokens 0.425 / 0.336,
    2 x 2,048 0.240 / 0.201, 8 x 1,024 0.256 / 0.239, 32 x 256 0.134 / 0.130. Which program runs a tile changes no
    bits: each reduces its own rows alone."""
    tiles = []
    for seq, (start, count) in enumerate(zip(start_positions, num_tokens, strict=True)):
        if count == 0:
            continue
        first, last = start // PREFILL_QUERY_TILE, (start + count - 1) // PREFILL_QUERY_TILE
        tiles += [(t * PREFILL_QUERY_TILE, seq) for t in range(first, last + 1)]
    tiles.sort(key=lambda tile: (-(tile[0] // PREFILL_TILE_BAND), tile[1], -tile[0]))
    padding = max(0, num_programs - len(tiles))
    return [seq for _, seq in tiles] + [-1] * padding, [start for start, _ in tiles] + [0] * padding
