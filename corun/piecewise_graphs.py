"""Mixed-step modes' mixed prefill+decode steps as CUDA graphs by token count, split at attention (vLLM's piecewise
scheme): everything between two attention calls (the GEMMs, norms, RoPE and the KV write) is one captured graph
per token-count size; attention runs eagerly between them on the step's own metadata, which no fixed-size graph
could hold (each step has other chunks, contexts and block tables).

Why: eager mixed steps launch hundreds of small kernels, so the baseline's throughput followed the host CPU's
speed (ShareGPT-like at t = 0: 6,240 tok/s on one H200 machine, 2,749 on another the same day). A step of n tokens
runs at the smallest size >= n; padding rows hold token 0 at position 0, write only the null block, are covered
by no attention segment (their output is zero) and are never sampled.

The pieces of a model with L layers: piece 0 embeds and runs layer 0 up to attention; piece i (1..L-1) finishes
layer i-1 and runs layer i up to attention; piece L finishes the last layer and the final norm. Each piece reads
and writes fixed buffers (PiecewiseBuffers, made once at the largest size; a size uses their first rows), so
that one piece's graph hands its results to attention and to the next piece at fixed addresses, and every graph's
temporaries can share one memory pool: the pieces always replay one after another, in capture order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from corun.attention import AttentionMetadata
from wire.config import NULL_BLOCK

PIECEWISE_SIZES = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048)
"""Token counts a mixed step is padded to: fine where launches dominate, coarser where GEMMs do. Larger steps run
eagerly, as in vLLM (whose default largest capture size is 512): measured on the H200 (8B shape), an 8192-token
step is ~190 ms of GEMMs, against a few ms of launches, and a 4,112-token step padded to 8,192 rows cost 185 ms
against 101 eagerly (benchmarks/results/h200_piecewise_step.json)."""


def piecewise_sizes(max_num_batched_tokens: int) -> list[int]:
    """The sizes up to the token budget (and the budget itself where it is smaller than the largest size: a full
    step then pads to nothing)."""
    largest = min(max_num_batched_tokens, PIECEWISE_SIZES[-1])
    return sorted({s for s in PIECEWISE_SIZES if s < largest} | {largest})


@dataclass
class PiecewiseBuffers:
    """What crosses from one piece to the next, at the largest size; rows [0, T) serve size T."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_blocks: torch.Tensor
    slot_offsets: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    residual: torch.Tensor
    attn_out: torch.Tensor
    hidden: torch.Tensor

    @classmethod
    def allocate(cls, model, num_rows: int, dtype: torch.dtype, device) -> PiecewiseBuffers:
        cfg = model.cfg

        def rows(*shape, kind=dtype, fill=0):
            return torch.full((num_rows, *shape), fill, dtype=kind, device=device)

        ids = [rows(kind=torch.int64, fill=fill) for fill in (0, 0, NULL_BLOCK, 0)]
        return cls(*ids, rows(cfg.head_dim), rows(cfg.head_dim), rows(cfg.num_heads, cfg.head_dim),
                   rows(cfg.num_kv_heads, cfg.head_dim), rows(cfg.num_kv_heads, cfg.head_dim), rows(cfg.hidden_size),
                   rows(cfg.num_heads, cfg.head_dim), rows(cfg.hidden_size))

    def first(self, num_rows: int) -> PiecewiseBuffers:
        return PiecewiseBuffers(*(getattr(self, f.name)[:num_rows] for f in dataclasses.fields(self)))

    def load(self, input_ids, positions, slot_blocks, slot_offsets) -> None:
        """A step's rows, then padding to this view's size."""
        n = len(input_ids)
        for buffer, values, pad in ((self.input_ids, input_ids, 0), (self.positions, positions, 0),
                                    (self.slot_blocks, slot_blocks, NULL_BLOCK), (self.slot_offsets, slot_offsets, 0)):
            buffer[:n].copy_(values, non_blocking=True)
            buffer[n:].fill_(pad)


class PiecewiseForward:
    """The model's forward as L + 1 pieces around L eager attention calls, each piece a CUDA graph per size
    (capture=True), or run eagerly through the same buffers (capture=False: CPU tests of the bookkeeping)."""

    def __init__(self, model, kv_layers, sizes: list[int], dtype: torch.dtype, device, capture: bool):
        self.model, self.kv_layers, self.sizes = model, kv_layers, sorted(sizes)
        self.buffers = PiecewiseBuffers.allocate(model, self.sizes[-1], dtype, device)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.num_replays = 0
        if capture:
            pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
            for size in reversed(self.sizes):  # NOTE: largest first, so smaller sizes reuse its pool memory
                self.graphs[size] = [self.capture(size, piece, pool, stream) for piece in range(self.num_pieces)]
            # NOTE: one warm-up stream for all L + 1 pieces of every size, its cached blocks handed back after:
            # blocks cached for a stream serve only that stream, and the eager attention runs on another
            torch.cuda.empty_cache()

    @property
    def num_pieces(self) -> int:
        return len(self.model.layers) + 1

    def size_for(self, num_tokens: int) -> int | None:
        return next((s for s in self.sizes if s >= num_tokens), None)

    @torch.inference_mode()
    def run_piece(self, size: int, piece: int) -> None:
        """Piece `piece` at `size` rows, from the buffers to the buffers."""
        model, ops, b = self.model, self.model.ops, self.buffers.first(size)
        meta = AttentionMetadata(b.slot_blocks, b.slot_offsets)  # NOTE: only the fused KV write reads it here
        if piece == 0:
            x, residual, cos, sin = model.embed(b.input_ids, b.positions)
            b.cos.copy_(cos)
            b.sin.copy_(sin)
        else:
            x, residual = model.layers[piece - 1].attention_output(b.attn_out, b.residual, ops)
        if piece == len(model.layers):
            b.hidden.copy_(model.final_norm(x, residual))
            return
        q, k, v, residual = model.layers[piece].attention_inputs(x, residual, b.cos, b.sin, self.kv_layers[piece],
                                                                 meta, ops)
        for buffer, value in ((b.q, q), (b.k, k), (b.v, v), (b.residual, residual)):
            buffer.copy_(value)

    def capture(self, size: int, piece: int, pool, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # NOTE: warm up lazy kernel set-up outside the capture
                self.run_piece(size, piece)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self.run_piece(size, piece)
        return graph

    @torch.inference_mode()
    def forward(self, input_ids, positions, meta: AttentionMetadata) -> torch.Tensor:
        """One step's rows (n <= the largest size) -> their final hidden states [n, hidden]; meta: the step's own
        attention metadata for n rows."""
        num_tokens = len(input_ids)
        size = self.size_for(num_tokens)
        if size is None:
            raise ValueError(f"a step of {num_tokens} tokens is larger than every piecewise size ({self.sizes[-1]})")
        b = self.buffers.first(size)
        b.load(input_ids, positions, meta.slot_blocks, meta.slot_offsets)
        # NOTE: attention sees all `size` rows: the padding rows write the null block and attend to nothing
        attention_meta = dataclasses.replace(meta, slot_blocks=b.slot_blocks, slot_offsets=b.slot_offsets)
        graphs = self.graphs.get(size)
        for piece in range(self.num_pieces):
            if graphs is None:
                self.run_piece(size, piece)
            else:
                graphs[piece].replay()
            if piece < len(self.model.layers):
                b.attn_out.copy_(self.model.attend(piece, b.q, b.k, b.v, self.kv_layers[piece], attention_meta))
        self.num_replays += graphs is not None
        return b.hidden[:num_tokens]
