"""Turn scheduled requests into one forward's tensors: token ids, positions, KV slots, attention metadata.

Row order: decode rows first (one token per request, then padding rows up to num_decode_rows), then prompt
chunks. Padding rows hold token 0 at position 0 and point at the null block.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from corun.attention import AttentionMetadata, RequestSegment, VarlenPrompts
from corun.device_copies import DeviceBlock, copy_into
from corun.packed_prefill import PackedPrefillMeta, max_prefill_tiles, packed_prefill_tiles
from corun.request import Request
from corun.scheduler import PrefillChunk
from wire.config import NULL_BLOCK


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
    block: DeviceBlock | None = field(default=None, repr=False, compare=False)
    """Set on a graph's static inputs (to_static): the tensors are its views, loaded in one copy."""

    def metadata(self, num_kv_splits: int = 0, kv_split_tokens: int = 0) -> AttentionMetadata:
        return AttentionMetadata(self.slot_blocks, self.slot_offsets, len(self.input_ids),
                                 self.block_tables, self.context_lens, num_kv_splits=num_kv_splits,
                                 kv_split_tokens=kv_split_tokens)

    def tensors(self) -> list[torch.Tensor]:
        return [self.input_ids, self.positions, self.slot_blocks, self.slot_offsets, self.block_tables,
                self.context_lens]

    def copy_to(self, static: WindowDecodeInputs) -> None:
        copy_all(static.tensors(), self.tensors(), static.block)

    def to(self, device) -> WindowDecodeInputs:
        return WindowDecodeInputs(*(t.to(device) for t in self.tensors()))

    def to_static(self, device) -> WindowDecodeInputs:
        """A copy on device whose tensors live in one DeviceBlock (a captured graph's inputs)."""
        block = DeviceBlock(self.tensors(), device)
        return WindowDecodeInputs(*block.views, block=block)


def copy_all(targets: list[torch.Tensor], sources: list[torch.Tensor], block: DeviceBlock | None) -> None:
    """targets[i].copy_(sources[i]) for every i: through block in one copy when the targets are its views."""
    if block is not None:
        block.load(sources)
        return
    for target, source in zip(targets, sources, strict=True):
        copy_into(target, source)


def decode_slot(request: Request, block_size: int, ahead: int = 0) -> tuple[int, int, int, int]:
    """(input token, position, KV block, offset) of a request's next decode token; ahead: tokens sampled that the
    host has not read yet (the input token is then a placeholder, 0)."""
    position = request.num_tokens - 1 + ahead
    token = 0 if ahead else request.last_token_id
    return token, position, request.block_ids[position // block_size], position % block_size


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
        table = np.empty((num_rows, self.window_blocks), dtype=np.int64)
        table[len(requests):] = self.padding  # NOTE: one broadcast, not a stack of padding rows (~2x faster)
        for i, request in enumerate(requests):
            table[i] = self.row(request)
        return table


def build_window_decode(requests: list[Request], num_rows: int, window_blocks: int, block_size: int,
                        table_rows: BlockTableRows | None = None,
                        ahead: Sequence[int] | None = None) -> WindowDecodeInputs:
    """table_rows: the caller's cache of block-table rows (the engine keeps one); None builds them afresh. ahead: per
    request, tokens sampled on the device that the host has not read yet (0 or 1, async scheduling); such a row's
    input token is a placeholder the caller replaces on the device."""
    ahead = ahead or [0] * len(requests)
    rows = [decode_slot(r, block_size, a) for r, a in zip(requests, ahead, strict=True)]
    rows += [(0, 0, NULL_BLOCK, 0)] * (num_rows - len(requests))
    tables = (table_rows or BlockTableRows(window_blocks)).table(requests, num_rows)
    context_lens = [r.num_tokens + a for r, a in zip(requests, ahead, strict=True)] + [1] * (num_rows - len(requests))
    ids, positions, blocks, offsets = (torch.tensor(col, dtype=torch.int64) for col in _columns(rows, 4))
    return WindowDecodeInputs(ids, positions, blocks, offsets, torch.from_numpy(tables),
                              torch.tensor(context_lens, dtype=torch.int64))


def _columns(rows: list[tuple], width: int) -> list[list]:
    return [list(col) for col in zip(*rows)] if rows else [[] for _ in range(width)]


def build_windowed_step(decode_requests: list[Request], num_decode_rows: int, chunks: list[PrefillChunk],
                        block_size: int, device, window_blocks: int, num_kv_splits: int, kv_split_tokens: int = 0,
                        chunk_invariant_prefill: bool = False, table_rows: BlockTableRows | None = None,
                        varlen_prompts: bool = False, ahead: Sequence[int] | None = None) -> StepInputs:
    """Decode rows through the batched paged-decode kernel; prompt chunks as per-request segments, or with
    chunk_invariant_prefill through one packed prefill kernel launch, or with varlen_prompts through one varlen
    attention launch."""
    table_rows = table_rows or BlockTableRows(window_blocks)
    window = build_window_decode(decode_requests, num_decode_rows, window_blocks, block_size, table_rows, ahead)
    chunk_step = build_step([], 0, chunks, block_size, "cpu") if chunks else None
    parts = [window] if chunk_step is None else [window, chunk_step]
    packed = None
    if chunk_invariant_prefill and chunks:
        packed = packed_prefill_meta(chunks, num_decode_rows, len(chunks), 0, table_rows).to(device)
    varlen = varlen_prompt_meta(chunks, num_decode_rows, block_size).to(device) if varlen_prompts and chunks else None
    per_segment = chunk_step is not None and packed is None and varlen is None
    meta = AttentionMetadata(
        torch.cat([window.slot_blocks, *([chunk_step.meta.slot_blocks] if chunk_step else [])]).to(device),
        torch.cat([window.slot_offsets, *([chunk_step.meta.slot_offsets] if chunk_step else [])]).to(device),
        num_decode_rows, window.block_tables.to(device), window.context_lens.to(device),
        segments=_shifted(chunk_step.meta.segments, num_decode_rows, device) if per_segment else (),
        num_kv_splits=num_kv_splits, kv_split_tokens=kv_split_tokens, packed_prefill=packed, varlen_prompts=varlen)
    ids = torch.cat([p.input_ids for p in parts]).to(device)
    return StepInputs(ids, torch.cat([p.positions for p in parts]).to(device), meta)


def varlen_prompt_meta(chunks: list[PrefillChunk], first_row: int, block_size: int) -> VarlenPrompts:
    """Chunks laid out one after another from step row first_row, each reading its prompt's KV from position 0 to
    its chunk's end; host tensors."""
    query_lens = [c.num_tokens for c in chunks]
    context_lens = [c.start + c.num_tokens for c in chunks]
    key_blocks, key_offsets = [], []
    for chunk, context_len in zip(chunks, context_lens, strict=True):
        positions = np.arange(context_len, dtype=np.int64)
        key_blocks.append(np.asarray(chunk.request.block_ids, dtype=np.int64)[positions // block_size])
        key_offsets.append(positions % block_size)

    def starts(lengths):
        return torch.tensor(np.cumsum([0, *lengths]), dtype=torch.int32)

    return VarlenPrompts(first_row, sum(query_lens), starts(query_lens), starts(context_lens),
                         torch.from_numpy(np.concatenate(key_blocks)), torch.from_numpy(np.concatenate(key_offsets)),
                         max(query_lens), max(context_lens))


def _shifted(segments, offset: int, device) -> tuple[RequestSegment, ...]:
    return tuple(RequestSegment(s.query_start + offset, s.num_query_tokens, s.context_len, s.block_table.to(device))
                 for s in segments)


def build_step(decode_requests: list[Request], num_decode_rows: int, chunks: list[PrefillChunk],
               block_size: int, device, ahead: Sequence[int] | None = None) -> StepInputs:
    """Per-request attention for every row: decode rows as one-token segments, chunks as segments. ahead: as
    build_window_decode's."""
    ahead = ahead or [0] * len(decode_requests)
    rows = [decode_slot(r, block_size, a) for r, a in zip(decode_requests, ahead, strict=True)]
    rows += [(0, 0, NULL_BLOCK, 0)] * (num_decode_rows - len(decode_requests))
    columns = [np.asarray(col, dtype=np.int64) for col in _columns(rows, 4)]
    segments = [_segment(row, r.num_tokens + a, r, block_size, device)
                for row, (r, a) in enumerate(zip(decode_requests, ahead, strict=True))]
    start = num_decode_rows
    for chunk in chunks:
        columns = [np.concatenate(pair) for pair in zip(columns, _chunk_columns(chunk, block_size), strict=True)]
        segments.append(_segment(start, chunk.start + chunk.num_tokens, chunk.request, block_size, device,
                                 chunk.num_tokens))
        start += chunk.num_tokens
    ids, positions, blocks, offsets = (torch.from_numpy(col).to(device) for col in columns)
    return StepInputs(ids, positions, AttentionMetadata(blocks, offsets, segments=tuple(segments)))


def _chunk_columns(chunk: PrefillChunk, block_size: int) -> list[np.ndarray]:
    """(token ids, positions, KV blocks, offsets) of a prompt chunk's rows."""
    request = chunk.request
    positions = np.arange(chunk.start, chunk.start + chunk.num_tokens, dtype=np.int64)
    ids = np.asarray(request.prompt_token_ids[chunk.start:chunk.start + chunk.num_tokens], dtype=np.int64)
    blocks = np.asarray(request.block_ids, dtype=np.int64)[positions // block_size]
    return [ids, positions, blocks, positions % block_size]


def _segment(start: int, context_len: int, request: Request, block_size: int, device,
             num_query_tokens: int = 1) -> RequestSegment:
    table = torch.tensor(request.block_ids[: -(-context_len // block_size)], dtype=torch.int64, device=device)
    return RequestSegment(start, num_query_tokens, context_len, table)


def packed_prefill_meta(chunks: list[PrefillChunk], first_row: int, num_seqs: int, num_programs: int,
                        table_rows: BlockTableRows) -> PackedPrefillMeta:
    """The packed prefill kernel's launch facts for chunks laid out one after another from step row first_row,
    padded to num_seqs sequences and num_programs query tiles (0: as many as needed); host tensors."""
    starts = [c.start for c in chunks] + [0] * (num_seqs - len(chunks))
    counts = [c.num_tokens for c in chunks] + [0] * (num_seqs - len(chunks))
    query_starts = (first_row + np.cumsum([0] + counts[:-1])).tolist()
    tile_seqs, tile_starts = packed_prefill_tiles(starts, counts, num_programs)
    tables = table_rows.table([c.request for c in chunks], num_seqs)

    def ints(values):
        return torch.from_numpy(np.asarray(values, dtype=np.int32))  # NOTE: ~3x cheaper than torch.tensor(list)

    return PackedPrefillMeta(ints(query_starts), ints(starts), ints(counts), torch.from_numpy(tables),
                             ints(tile_seqs), ints(tile_starts))


@dataclass
class PrefillPackInputs:
    """A prefill forward of exactly num_rows token rows holding chunks of up to num_seqs prompts, laid out one
    after another from row 0, then padding (token 0 at position 0, writing only the null block). Every tensor's
    shape is fixed by (num_rows, num_seqs): graph-capturable. Isolated bucketed prefill is one chunk per pack."""

    input_ids: torch.Tensor  # [num_rows] int64
    positions: torch.Tensor  # [num_rows] int64
    slot_blocks: torch.Tensor  # [num_rows] int64
    slot_offsets: torch.Tensor  # [num_rows] int64
    sample_rows: torch.Tensor  # [num_seqs] int64: last rows of the chunks that end a prompt, first; then 0
    packed: PackedPrefillMeta | None
    """The packed kernel's launch facts; None for a whole prompt (its attention needs none of them)."""
    segments: tuple[RequestSegment, ...] = ()
    """The same chunks as per-request segments, for the SDPA path (CPU); not part of a captured graph."""
    whole_prompt: bool = False
    """Isolated bucketed prefill: at most one chunk, the first of its prompt (AttentionMetadata.whole_prompt)."""
    block: DeviceBlock | None = field(default=None, repr=False, compare=False)
    """Set on a graph's static inputs (to_static): the tensors are its views, loaded in one copy."""

    def metadata(self, use_kernel: bool) -> AttentionMetadata:
        if self.whole_prompt:
            return AttentionMetadata(self.slot_blocks, self.slot_offsets, whole_prompt=True)
        return AttentionMetadata(self.slot_blocks, self.slot_offsets, segments=() if use_kernel else self.segments,
                                 packed_prefill=self.packed if use_kernel else None)

    def tensors(self) -> list[torch.Tensor]:
        return [self.input_ids, self.positions, self.slot_blocks, self.slot_offsets, self.sample_rows,
                *(self.packed.tensors() if self.packed is not None else ())]

    def copy_to(self, static: PrefillPackInputs) -> None:
        copy_all(static.tensors(), self.tensors(), static.block)

    def to(self, device) -> PrefillPackInputs:
        return PrefillPackInputs(self.input_ids.to(device), self.positions.to(device), self.slot_blocks.to(device),
                                 self.slot_offsets.to(device), self.sample_rows.to(device),
                                 None if self.packed is None else self.packed.to(device),
                                 _shifted(self.segments, 0, device), self.whole_prompt)

    def to_static(self, device) -> PrefillPackInputs:
        """A copy on device whose tensors live in one DeviceBlock (a captured graph's inputs)."""
        block = DeviceBlock(self.tensors(), device)
        ids, positions, slot_blocks, slot_offsets, sample_rows, *packed = block.views
        return PrefillPackInputs(ids, positions, slot_blocks, slot_offsets, sample_rows,
                                 PackedPrefillMeta(*packed) if packed else None, _shifted(self.segments, 0, device),
                                 self.whole_prompt, block)


def build_prefill_pack(chunks: list[PrefillChunk], num_rows: int, num_seqs: int, block_size: int,
                       table_rows: BlockTableRows, whole_prompt: bool = False) -> PrefillPackInputs:
    """chunks: at most num_seqs, at most num_rows tokens together (a host-side PrefillPackInputs); whole_prompt:
    at most one chunk, its prompt's first."""
    assert len(chunks) <= num_seqs and sum(c.num_tokens for c in chunks) <= num_rows, "the pack overflows"
    assert not whole_prompt or (len(chunks) <= 1 and all(c.start == 0 for c in chunks)), "not a first chunk"
    step = build_step([], 0, chunks, block_size, "cpu")
    num_padding = num_rows - len(step.input_ids)
    pad = torch.zeros(num_padding, dtype=torch.int64)
    ends = np.cumsum([c.num_tokens for c in chunks]).tolist()
    finishing = [end - 1 for chunk, end in zip(chunks, ends, strict=True) if chunk.is_last]
    sample_rows = torch.tensor(finishing + [0] * (num_seqs - len(finishing)), dtype=torch.int64)
    # NOTE: a whole prompt's graph attends with SDPA: building (and copying in) kernel launch facts is waste
    packed = None if whole_prompt else packed_prefill_meta(chunks, 0, num_seqs, max_prefill_tiles(num_rows, num_seqs),
                                                           table_rows)
    return PrefillPackInputs(torch.cat([step.input_ids, pad]), torch.cat([step.positions, pad]),
                             torch.cat([step.meta.slot_blocks, pad + NULL_BLOCK]),
                             torch.cat([step.meta.slot_offsets, pad]), sample_rows, packed, step.meta.segments,
                             whole_prompt)


def join_decode_and_pack(decode: StepInputs, pack: PrefillPackInputs,
                         use_kernel: bool) -> tuple[StepInputs, torch.Tensor]:
    """A decode step's rows, then a prefill pack's rows after them, as one forward (decode_rides_prefill): each
    part keeps its own attention (the decode rows their window kernel or per-request segments, the pack its
    packed kernel or segments, moved down by the decode rows). -> the inputs, and the pack's sample_rows in them.
    Both parts on the same device."""
    shift = len(decode.input_ids)
    meta = decode.meta
    packed = None
    if use_kernel and pack.packed is not None:
        packed = PackedPrefillMeta(*pack.packed.tensors())
        packed.query_starts = packed.query_starts + shift
    segments = meta.segments + (() if use_kernel else _shifted(pack.segments, shift, pack.input_ids.device))
    joined = AttentionMetadata(torch.cat([meta.slot_blocks, pack.slot_blocks]),
                               torch.cat([meta.slot_offsets, pack.slot_offsets]), meta.num_window_rows,
                               meta.window_block_tables, meta.window_context_lens, segments=segments,
                               num_kv_splits=meta.num_kv_splits, kv_split_tokens=meta.kv_split_tokens,
                               packed_prefill=packed)
    inputs = StepInputs(torch.cat([decode.input_ids, pack.input_ids]), torch.cat([decode.positions, pack.positions]),
                        joined)
    return inputs, pack.sample_rows + shift
