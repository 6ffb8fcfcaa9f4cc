"""Turn scheduled requests into one forward's tensors: token ids, positions, KV slots, attention metadata.

Row order: decode rows first (one token per request, then padding rows up to num_decode_rows), then prompt
chunks. Padding rows hold token 0 at position 0 and point at the null block.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, fields

import numpy as np
import torch

from corun.attention import AttentionMetadata, RequestSegment
from corun.block_manager import NULL_BLOCK
from corun.request import Request
from corun.scheduler import PrefillChunk


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata


@dataclass
class WindowDecodeInputs:
    """The fixed-window decode step's inputs, all [rows] or [rows, window_blocks]: graph-capturable."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_blocks: torch.Tensor
    slot_offsets: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor

    def metadata(self, num_kv_splits: int = 0) -> AttentionMetadata:
        return AttentionMetadata(self.slot_blocks, self.slot_offsets, len(self.input_ids),
                                 self.block_tables, self.context_lens, num_kv_splits=num_kv_splits)

    def copy_to(self, static: WindowDecodeInputs) -> None:
        for f in fields(self):
            getattr(static, f.name).copy_(getattr(self, f.name), non_blocking=True)

    def to(self, device) -> WindowDecodeInputs:
        return WindowDecodeInputs(*(getattr(self, f.name).to(device) for f in fields(self)))


def decode_slot(request: Request, block_size: int) -> tuple[int, int, int, int]:
    """(input token, position, KV block, offset) of a request's next decode token."""
    position = request.num_tokens - 1
    return request.last_token_id, position, request.block_ids[position // block_size], position % block_size


class BlockTableRows:
    """Each request's row of the decode block table, filled once: a request's blocks are reserved whole at
    admission and stay fixed until it finishes, so re-filling 256 rows x 256 blocks every step is waste."""

    def __init__(self, window_blocks: int):
        self.window_blocks = window_blocks
        self.padding = np.full(window_blocks, NULL_BLOCK, dtype=np.int64)
        self.rows: weakref.WeakKeyDictionary[Request, tuple[list[int], np.ndarray]] = weakref.WeakKeyDictionary()

    def row(self, request: Request) -> np.ndarray:
        cached = self.rows.get(request)
        if cached is None or cached[0] is not request.block_ids:  # NOTE: block_ids is replaced, never mutated
            table = self.padding.copy()
            num_blocks = min(len(request.block_ids), self.window_blocks)
            table[:num_blocks] = request.block_ids[:num_blocks]
            cached = self.rows[request] = (request.block_ids, table)
        return cached[1]

    def table(self, requests: list[Request], num_rows: int) -> np.ndarray:
        if num_rows == 0:
            return np.empty((0, self.window_blocks), dtype=np.int64)
        return np.stack([self.row(r) for r in requests] + [self.padding] * (num_rows - len(requests)))


def build_window_decode(requests: list[Request], num_rows: int, window_blocks: int, block_size: int,
                        table_rows: BlockTableRows | None = None) -> WindowDecodeInputs:
    """table_rows: the caller's cache of block-table rows (the engine keeps one); None builds them afresh."""
    rows = [decode_slot(r, block_size) for r in requests]
    rows += [(0, 0, NULL_BLOCK, 0)] * (num_rows - len(requests))
    tables = (table_rows or BlockTableRows(window_blocks)).table(requests, num_rows)
    context_lens = [r.num_tokens for r in requests] + [1] * (num_rows - len(requests))
    ids, positions, blocks, offsets = (torch.tensor(col, dtype=torch.int64) for col in _columns(rows, 4))
    return WindowDecodeInputs(ids, positions, blocks, offsets, torch.from_numpy(tables),
                              torch.tensor(context_lens, dtype=torch.int64))


def _columns(rows: list[tuple], width: int) -> list[list]:
    return [list(col) for col in zip(*rows)] if rows else [[] for _ in range(width)]


def build_windowed_step(decode_requests: list[Request], num_decode_rows: int, chunks: list[PrefillChunk],
                        block_size: int, device, window_blocks: int, num_kv_splits: int,
                        chunk_invariant_prefill: bool = False, table_rows: BlockTableRows | None = None) -> StepInputs:
    """Decode rows through the batched paged-decode kernel, prompt chunks as per-request segments (CUDA)."""
    window = build_window_decode(decode_requests, num_decode_rows, window_blocks, block_size, table_rows)
    chunk_step = build_step([], 0, chunks, block_size, "cpu") if chunks else None
    parts = [window] if chunk_step is None else [window, chunk_step]
    meta = AttentionMetadata(
        torch.cat([window.slot_blocks, *([chunk_step.meta.slot_blocks] if chunk_step else [])]).to(device),
        torch.cat([window.slot_offsets, *([chunk_step.meta.slot_offsets] if chunk_step else [])]).to(device),
        num_decode_rows, window.block_tables.to(device), window.context_lens.to(device),
        _shifted(chunk_step.meta.segments, num_decode_rows, device) if chunk_step else (), num_kv_splits,
        chunk_invariant_prefill)
    ids = torch.cat([p.input_ids for p in parts]).to(device)
    return StepInputs(ids, torch.cat([p.positions for p in parts]).to(device), meta)


def _shifted(segments, offset: int, device) -> tuple[RequestSegment, ...]:
    return tuple(RequestSegment(s.query_start + offset, s.num_query_tokens, s.context_len, s.block_table.to(device))
                 for s in segments)


def build_step(decode_requests: list[Request], num_decode_rows: int, chunks: list[PrefillChunk],
               block_size: int, device) -> StepInputs:
    """Per-request attention for every row: decode rows as one-token segments, chunks as segments."""
    rows = [decode_slot(r, block_size) for r in decode_requests]
    rows += [(0, 0, NULL_BLOCK, 0)] * (num_decode_rows - len(decode_requests))
    segments = [_segment(row, r.num_tokens, r, block_size, device) for row, r in enumerate(decode_requests)]
    start = num_decode_rows
    for chunk in chunks:
        request, end = chunk.request, chunk.start + chunk.num_tokens
        for position in range(chunk.start, end):
            token = request.prompt_token_ids[position]
            rows.append((token, position, request.block_ids[position // block_size], position % block_size))
        segments.append(_segment(start, end, request, block_size, device, chunk.num_tokens))
        start += chunk.num_tokens
    ids, positions, blocks, offsets = (torch.tensor(col, dtype=torch.int64, device=device)
                                       for col in _columns(rows, 4))
    return StepInputs(ids, positions, AttentionMetadata(blocks, offsets, segments=tuple(segments)))


def _segment(start: int, context_len: int, request: Request, block_size: int, device,
             num_query_tokens: int = 1) -> RequestSegment:
    table = torch.tensor(request.block_ids[: -(-context_len // block_size)], dtype=torch.int64, device=device)
    return RequestSegment(start, num_query_tokens, context_len, table)
