"""Which (decode rows, pack rows) pairs may run as one forward: those whose joined forward gives every row exactly
the bits it gets apart, found by trying them (SchedulerConfig.decode_rides_prefill).

A decode step and a prefill pack each run at a fixed shape. Joined, each part keeps its own attention kernel (per
row, per token position), and the glue is row-wise; what can change a row's bits is a GEMM picking another reduction
order for the larger row count, as it may for any two row counts (corun/decode_sizes.py). So every pair of kept sizes
is run joined and apart on random KV, prompts and sampling parameters, every row filled: the decode rows' logits and
samples, each prompt's token-1 logits and the K and V it wrote, compared bit for bit. Only pairs that agree are
joined; the others run as two forwards, as before.
"""

from __future__ import annotations

import random

import torch

from corun import decode_sizes, pack_sizes
from corun.request import Request
from corun.scheduler import PrefillChunk

PROBE_SEED = 20261203
MIN_PACK_ROWS_OVER_A_GRAPH = 1024
"""From this many pack rows a joined forward runs eagerly, at its exact rows; below, it replays the piecewise graphs
(SchedulerConfig.piecewise_graphs; without them a captured pack that small is not joined). Measured on the H200 (8B
shape, N = 256, Poisson ShareGPT-like 32 req/s, one machine, benchmarks/results/h200_joined_poisson_32.json): with
every pair joined eagerly, most packs held 192-512 rows and TPOT p50 was 20.1 ms against 9.7 apart
(h200_defaults_poisson_32_stop38.json): an eager forward that small is bound by the host's kernel launches. From 1024
rows a pack's GEMMs take ~20 ms of GPU time, which hides the launches, while the pieces would pad the forward to the
next of their sizes (1536, 2048: up to a third more rows): on an H100 (stop 49,
h100_defaults_poisson_32_pieces*_stop49.json) joining every pair of up to 2048 rows through the pieces gave ITL p99
49.7 ms in two runs against 39.8-40.3 with no pieces."""


def most_rows_through_pieces(sched) -> int:
    """The most rows a joined forward through the pieces can hold (a resolved fixed_shape scheduler config): N
    decode rows and the largest pack below MIN_PACK_ROWS_OVER_A_GRAPH rows (0: no pack that small), so that no
    larger piece is captured for nothing."""
    packs = [size for size in (*sched.prefill_pack_sizes, sched.prefill_pack_tokens or 0)
             if 0 < size < MIN_PACK_ROWS_OVER_A_GRAPH]
    return sched.max_num_seqs + max(packs) if packs else 0


def verified_joined_shapes(runner) -> set[tuple[int, int]]:
    """runner: a fixed_shape ModelRunner with its decode and pack sizes kept (and its piecewise graphs captured, if
    any: a pair is tried the way it will run). -> the pairs that agree.

    Pack by pack: a pack's probe prompts and their forward apart serve every decode size tried with it (a joined
    forward rewrites every position of those prompts before reading it, so the comparison stays exact), which spares
    a pack forward per pair; each pair still runs its own decode step apart and its own joined forward."""
    kept = set()
    for pack_rows in runner.pack_sizes:
        sizes = [rows for rows in runner.decode_sizes if joinable(runner, rows, pack_rows)]
        pack = probe_pack(runner, pack_rows) if sizes else None
        if pack is not None:  # NOTE: None: no probe prompt fits the cache, so nothing is joined untried
            kept |= {(rows, pack_rows) for rows in sizes if joined_matches_apart(runner, rows, pack_rows, pack)}
    return kept


def runs_through_pieces(runner, decode_rows: int, pack_rows: int) -> bool:
    """Whether the pair's joined forward replays the piecewise graphs (else it runs eagerly)."""
    pieces = runner.piecewise_forward
    return (pack_rows < MIN_PACK_ROWS_OVER_A_GRAPH and pieces is not None
            and pieces.size_for(decode_rows + pack_rows) is not None)


def joinable(runner, decode_rows: int, pack_rows: int) -> bool:
    """Pairs whose joined forward replays the piecewise graphs, packs run eagerly anyway, and captured packs large
    enough that running them eagerly costs nothing."""
    if runs_through_pieces(runner, decode_rows, pack_rows):
        return True
    graphs = runner.prefill_graph.graphs if runner.prefill_graph is not None else {}
    return pack_rows not in graphs or pack_rows >= MIN_PACK_ROWS_OVER_A_GRAPH


def probe_pack(runner, pack_rows: int) -> tuple[list[PrefillChunk], list[torch.Tensor]] | None:
    """A pack's probe prompts (their own random draw, from block 1) and what its forward apart gives (pack_sizes'
    probe_outputs); None where no prompt fits the cache."""
    rng = random.Random(PROBE_SEED + 7919 * pack_rows)
    chunks = pack_sizes.probe_chunks(runner, pack_rows, runner.config.scheduler.prefill_pack_seqs, rng)
    return (chunks, pack_sizes.probe_outputs(runner, chunks, pack_rows)) if chunks else None


def joined_matches_apart(runner, decode_rows: int, pack_rows: int,
                         pack: tuple[list[PrefillChunk], list[torch.Tensor]] | None = None) -> bool:
    """pack: probe_pack(runner, pack_rows), made once for every decode size (None: made here)."""
    pack = pack if pack is not None else probe_pack(runner, pack_rows)
    if pack is None:
        return False
    chunks, pack_apart = pack
    first_free = 1 + max(b for chunk in chunks for b in chunk.request.block_ids)
    if runner.kv_cache.num_blocks - first_free < decode_rows:
        return False  # NOTE: a cache too small to hold the probe: nothing is joined untried
    rng = random.Random(PROBE_SEED + 7919 * pack_rows + decode_rows)
    decodes = decode_sizes.probe_requests(runner, decode_rows, rng, first_block=first_free)
    apart = decode_sizes.probe_outputs(runner, decodes, decode_rows) + pack_apart
    return all(torch.equal(a, b) for a, b in zip(apart, joined_outputs(runner, decodes, decode_rows, chunks,
                                                                          pack_rows), strict=True))


def joined_outputs(runner, decodes: list[Request], decode_rows: int, chunks: list[PrefillChunk],
                   pack_rows: int) -> list[torch.Tensor]:
    """What probe_outputs of decode_sizes and pack_sizes give, from one joined forward."""
    hidden, sample_rows = runner.joined_hidden(decodes, decode_rows, chunks, pack_rows)
    decoded = decode_sizes.sampled_outputs(runner, decodes, runner.model.compute_logits(hidden[:decode_rows]))
    logits = runner.sample_row_logits(hidden, sample_rows)[: len(chunks)]
    blocks = torch.tensor([b for chunk in chunks for b in chunk.request.block_ids], device=logits.device)
    return decoded + [logits] + [cache[blocks].clone() for layer in runner.kv_cache.layers for cache in layer]
