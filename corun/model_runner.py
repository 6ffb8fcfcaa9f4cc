"""Runs scheduled batches on the model: isolated prefill, the fixed N-row decode step, mixed steps.

The fixed_shape decode step always computes exactly N rows: running requests fill rows 0..k-1 in running order
(so a request moves up when an earlier one finishes) and the rest are padding that reads and writes only the
null block and whose sampled values are dropped. On CUDA the step (model + lm head) is captured once as one
CUDA graph and replayed; the sampler runs outside it on the same N rows.

fixed_shape prefill runs one prompt's chunk per forward at its natural length (the paper), or, as configured, padded
to a bucket of fixed sizes (isolated, bucketed) or packed with other prompts' chunks into exactly T rows
(packed); both pad with rows that write only the null block, and on CUDA each such shape is one captured graph,
so a short prefill pays its kernels, not hundreds of eager launches.

mixed and batch_invariant modes on CUDA do what vLLM does by default: decode-only steps are padded to the
next of several captured sizes, and mixed prefill+decode steps of up to 2048 tokens run as piecewise CUDA graphs by
token count, attention eager between them (corun/piecewise_graphs.py; SchedulerConfig.piecewise_graphs off: eager).
fixed_shape's joined forwards (a decode step riding a prefill pack) run through the same piecewise graphs where a
size holds them, on a runner that both prefills and decodes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from corun.attention import num_sms
from corun.chunk_invariance import several_chunks_match
from corun.cuda_graphs import CapturedGraphs
from corun.decode_ahead import (
    DecodeInFlight,
    continues,
    copy_to_host,
    fill_penalty_tokens,
    histories_ahead,
    input_ids_with_tokens_ahead,
    tokens_ahead,
)
from corun.decode_sizes import equivalent_decode_sizes
from corun.device_copies import read_back
from corun.device_facts import resolved_on_device
from corun.joined_steps import most_rows_through_pieces, runs_through_pieces, verified_joined_shapes
from corun.kv_cache import PagedKVCache
from corun.kv_sizing import with_kv_budget
from corun.models.config import ModelArchConfig
from corun.models.loader import DTYPES, empty_model, load_model
from corun.pack_sizes import equivalent_pack_sizes
from corun.piecewise_graphs import PiecewiseForward, piecewise_sizes
from corun.request import Request
from corun.sampler import Sampler, SamplerOutput, SamplingBatch
from corun.scheduler import PrefillChunk, ScheduledBatch
from corun.shared_weights import WeightsWatch, export_weights, import_weights
from corun.step_inputs import (
    BlockTableRows,
    PrefillPackInputs,
    StepInputs,
    WindowDecodeInputs,
    build_prefill_pack,
    build_step,
    build_window_decode,
    build_windowed_step,
    join_decode_and_pack,
)
from corun.structured import grammars_for
from wire.config import DEFAULT_PREFILL_CHUNK, EngineConfig, SharedWeightsConfig
from wire.outputs import TokenLogprobs
from wire.seeding import sample_seed

logger = logging.getLogger(__name__)


@dataclass
class SampledToken:
    request: Request
    token_id: int
    logprobs: TokenLogprobs | None
    index: int = 0
    """The sample of request.params.n (a prefill node samples every sample's first token)."""


def capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM-style graph sizes for mixed-step modes: 1, 2, 4, 8, then every 16 up to N (and N itself)."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_num_seqs] + list(range(16, max_num_seqs, 16))
    return sorted(set(sizes + [max_num_seqs]))


class ModelRunner:
    def __init__(self, config: EngineConfig, runs_prefill: bool = True, runs_decode: bool = True,
                 weights: SharedWeightsConfig = SharedWeightsConfig()):
        """runs_prefill False: a decode node, which reads its prompts' KV and never prefills (no prefill graphs or pack
        probes; it keeps the engine's forward reserve, kv_sizing.forward_reserve_bytes says why); runs_decode False:
        a prefill node, which never runs the decode step. Only a runner that does both (the engine, a colocated node)
        runs mixed steps (run_mixed) or joins a decode step to a prefill forward (run_prefill_and_decode).
        weights: its own copy of the weights, or one shared by the nodes on its GPU (corun/shared_weights.py)."""
        self.config = config = resolved_on_device(config)  # NOTE: applies cublas_split_k before CUDA starts
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.mode = config.scheduler.mode
        self.device = torch.device(config.device)
        self.block_size = config.cache.block_size
        self.max_num_seqs = config.scheduler.max_num_seqs
        self.window_blocks = config.max_blocks_per_seq
        self.table_rows = BlockTableRows(self.window_blocks)
        self.weights_watch: WeightsWatch | None = None
        """An importing node's check that the node holding its weights' memory still runs (None: nothing to watch)."""
        self.model, self.sampler = self.load_model_and_sampler(weights)
        self.runs_prefill, self.runs_decode = runs_prefill, runs_decode
        sched = config.scheduler
        self.joins_steps = (runs_prefill and runs_decode and self.mode == "fixed_shape"
                            and bool(sched.prefill_pack_tokens) and sched.decode_rides_prefill)
        """fixed_shape: whether a decode step may ride a prefill forward here (the pairs verified decide which)."""
        most_rows = sched.max_num_batched_tokens if self.mode != "fixed_shape" else most_rows_through_pieces(sched)
        pieces = (self.on_cuda and config.use_cuda_graph and sched.piecewise_graphs and most_rows > 0
                  and ((runs_prefill and runs_decode and self.mode != "fixed_shape") or self.joins_steps))
        self.piecewise_sizes = piecewise_sizes(most_rows) if pieces else []
        """Row counts of the piecewise graphs (mixed steps, joined forwards) this runner captures; [] for none."""
        # NOTE: after the weights, which the GPU's KV budget is what is left beside
        shared_bytes = 0 if weights.holding == "own" else sum(
            p.numel() * p.element_size() for p in self.model.parameters())
        self.config = config = with_kv_budget(config, self.model.cfg, DTYPES[config.dtype],
                                              piecewise_rows=max(self.piecewise_sizes, default=0),
                                              shared_weight_bytes=shared_bytes,
                                              holds_shared_weights=weights.holding == "export")
        self.kv_cache = PagedKVCache(self.model.cfg, config.cache, DTYPES[config.dtype], config.device)
        self.num_prefill_forwards = self.num_decode_forwards = self.num_mixed_forwards = 0
        self.num_padded_prefill_forwards = 0
        """fixed_shape prefill forwards at a bucket's or the pack's row count (the rest ran at natural length)."""
        self.num_piecewise_forwards = 0
        """Mixed steps and joined forwards that ran through the piecewise graphs (the rest ran eagerly)."""
        self.num_forwards_ahead = 0
        """Decode steps launched before the host had read the tokens of the step before (async scheduling)."""
        self.decode_rows_histogram: dict[int, int] = {}
        """fixed_shape decode steps per row count they ran at."""
        self.prefill_rows_histogram: dict[int, int] = {}
        """fixed_shape padded prefill forwards (bucketed or packed) per row count they ran at."""
        self.num_sms = num_sms(self.device) if self.on_cuda else 0
        self.batched_decode_rows = self.on_cuda or self.mode == "batch_invariant"
        """Decode rows through the batched paged kernel (CUDA) instead of per-request attention (CPU); tests
        turn it on for CPU to run the CUDA path's bookkeeping with the torch fixed-window kernel."""
        self.packed_prefill_kernel = self.on_cuda
        """Padded prefill attention through the packed Triton kernel (CUDA: graph-capturable) rather than one SDPA
        call per chunk (CPU); tests turn it on for CPU to run it in Triton's interpreter."""
        self.varlen_prompt_kernel = self.on_cuda and self.mode == "mixed"
        """mixed mode's steps: every prompt chunk in one varlen attention launch per layer (CUDA), as vLLM's
        FlashAttention backend does, rather than one call per chunk; tests turn it on for CPU (its reference)."""
        self.decode_graph = self.prefill_graph = self.piecewise_forward = None
        self.decode_sizes = [self.max_num_seqs]
        """Row counts a fixed_shape decode step may run at (ascending, N last): N and the verified smaller ones."""
        self.pack_sizes = [config.scheduler.prefill_pack_tokens] if config.scheduler.prefill_pack_tokens else []
        """Row counts a packed prefill forward may run at (ascending, T last): T and the verified smaller ones."""
        self.joined_shapes: set[tuple[int, int]] = set()
        """(decode rows, pack rows) pairs a decode step and a prefill pack run joined in one forward at
        (SchedulerConfig.decode_rides_prefill): those verified at start-up to change no bits."""
        self.multi_chunk_prefill = False
        """Whether a prompt may run several of its chunks in one prefill forward: only through the packed kernel,
        whose reduction order for a token is set by its position (per-chunk SDPA on CPU is not: measured, 1 of 10
        prompts' token 1 moved), and where the start-up probe agrees (corun/chunk_invariance.py)."""
        self.num_joined_forwards = 0
        """Prefill forwards that carried a decode step (counted as a prefill forward and a decode forward too)."""
        self.set_up_fixed_shapes()
        self.decode_in_flight: DecodeInFlight | None = None
        """The decode step launched ahead of the host (async scheduling, corun/decode_ahead.py), until read."""

    def load_model_and_sampler(self, weights: SharedWeightsConfig):
        """The checkpoint (or the weights another node on this GPU published), with the kernels this mode and device
        run."""
        config = self.config
        model = self.load_weights(weights)
        sampler = Sampler()
        sampler.grammars = grammars_for(config.model)
        if self.mode == "batch_invariant":
            from corun.kernels.batch_invariant import (
                batch_invariant_linear,
                batch_invariant_log_softmax,
                batch_invariant_rms_norm,
            )

            model.use_batch_invariant_kernels(batch_invariant_linear, batch_invariant_rms_norm)
            sampler.log_softmax = batch_invariant_log_softmax
        if self.on_cuda:  # NOTE: row-wise fixed-order kernels, so batch-invariant: every mode may use them
            model.use_fused_kernels()
        return model, sampler

    def load_weights(self, weights: SharedWeightsConfig):
        config, max_positions = self.config, self.config.scheduler.max_model_len
        if weights.holding == "import":
            model = empty_model(config.model, config.dtype, config.device, max_positions)
            self.weights_watch = import_weights(model, weights, config.model, config.dtype, config.device)
            return model
        model = load_model(config.model, config.dtype, config.device, max_positions)
        if weights.holding == "export":
            export_weights(model, weights, config.model, config.dtype)
        return model

    def set_up_fixed_shapes(self) -> None:
        """CUDA graphs of the decode and padded prefill shapes (and the piecewise graphs of mixed steps and joined
        forwards); the decode and pack sizes that keep the N-row and T-row bits; the (decode, pack) pairs that may
        run joined. Each only where this runner runs it."""
        sched = self.config.scheduler
        prefills = self.runs_prefill and self.mode == "fixed_shape"
        if self.on_cuda and self.config.use_cuda_graph:
            if self.runs_decode:
                self.decode_graph = self.capture_decode_graphs()
            if self.piecewise_sizes:
                self.piecewise_forward = PiecewiseForward(self.model, self.kv_cache.layers, self.piecewise_sizes,
                                                          DTYPES[self.config.dtype], self.device, capture=True)
            if prefills and self.padded_prefill_sizes():
                self.prefill_graph = self.capture_prefill_graphs()
        if self.runs_decode and self.mode == "fixed_shape" and sched.decode_step_sizes:
            self.decode_sizes = equivalent_decode_sizes(self, sched.decode_step_sizes)
            if self.decode_graph is not None:  # NOTE: a size that failed must never be replayed
                self.decode_graph.keep(self.decode_sizes)
        if prefills and sched.prefill_pack_tokens and sched.prefill_pack_sizes:
            self.pack_sizes = equivalent_pack_sizes(self, sched.prefill_pack_sizes)
            if self.prefill_graph is not None:
                self.prefill_graph.keep(self.pack_sizes)
        if prefills and sched.prefill_pack_tokens and sched.multi_chunk_prefill:
            self.multi_chunk_prefill = self.packed_prefill_kernel and several_chunks_match(self)
            if not self.multi_chunk_prefill and self.on_cuda and sched.prefill_chunk_size < DEFAULT_PREFILL_CHUNK:
                logger.warning("a prompt's chunks gave other bits in one forward on this device: each forward runs "
                               "one chunk of %d tokens per prompt, which slows long prompts; consider "
                               "--prefill-chunk-size %d", sched.prefill_chunk_size, DEFAULT_PREFILL_CHUNK)
        if self.joins_steps:
            self.joined_shapes = verified_joined_shapes(self)

    @property
    def decode_rides_prefill(self) -> bool:
        """Whether a prefill forward may carry the decode step (some pair of sizes was verified)."""
        return bool(self.joined_shapes)

    @property
    def prefill_path(self) -> str:
        """Which prefill path runs prompts on this runner, for benchmark reports."""
        sched = self.config.scheduler
        if not self.runs_prefill:
            return "none (decode only)"
        if self.mode != "fixed_shape":
            return "mixed-batch-piecewise-graphs" if self.piecewise_forward is not None else "mixed-batch-eager"
        how = "graph" if self.prefill_graph is not None else "eager"
        if sched.prefill_pack_tokens:
            sizes = "" if len(self.pack_sizes) < 2 else f"-sizes-{'.'.join(map(str, self.pack_sizes[:-1]))}"
            return f"packed-T{sched.prefill_pack_tokens}-S{sched.prefill_pack_seqs}{sizes}-{how}"
        if sched.prefill_buckets:
            return f"isolated-buckets-{'.'.join(map(str, sched.prefill_buckets))}-{how}"
        return "isolated-natural-eager"

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    def kv_splits(self, num_rows: int) -> int:
        """Decode attention kernel choice on CUDA: no split-KV except in mixed mode (batch-dependent)."""
        if self.mode == "batch_invariant":
            return 1
        if not self.on_cuda:
            return 0
        if self.mode != "mixed":
            return 1
        from corun.kernels.decode_attention import split_kv_heuristic

        return split_kv_heuristic(num_rows, self.model.cfg.num_kv_heads, self.num_sms)

    @property
    def kv_split_tokens(self) -> int:
        """fixed_shape on CUDA: the decode kernel's fixed-size context ranges (0: one range per context)."""
        on = self.on_cuda and self.mode == "fixed_shape"
        return self.config.scheduler.decode_kv_split_tokens if on else 0

    def run_prefill(self, chunks: list[PrefillChunk]) -> list[SampledToken]:
        """fixed_shape prefill of one chunk (isolated) or several prompts' chunks (packed) in one forward; samples
        token 1 of every prompt whose last chunk this is."""
        sched = self.config.scheduler
        assert self.decode_in_flight is None, "read the decode step in flight first (finish_decode_in_flight)"
        self.num_prefill_forwards += 1
        num_rows = self.pack_rows(chunks) if sched.prefill_pack_tokens else sched.prefill_rows(chunks[0].num_tokens)
        assert len(chunks) <= sched.prefill_seqs_per_forward, "isolated prefill runs one chunk per forward"
        # NOTE: bucketed graphs take a prompt's first chunk (causal attention over the forward's own K and V);
        # later chunks of long prompts, and chunks longer than every bucket, run at natural length
        bucketed = chunks[0].start == 0 and chunks[0].num_tokens <= max(sched.prefill_buckets, default=0)
        wants_prompt_logprobs = any(c.request.params.prompt_logprobs is not None for c in chunks)
        if not (sched.prefill_pack_tokens or bucketed):
            logits = self.natural_prefill_logits(chunks[0], wants_prompt_logprobs)
        else:
            self.num_padded_prefill_forwards += 1
            self.prefill_rows_histogram[num_rows] = self.prefill_rows_histogram.get(num_rows, 0) + 1
            pack = build_prefill_pack(chunks, num_rows, sched.prefill_seqs_per_forward, self.block_size,
                                      self.table_rows, whole_prompt=bucketed)
            if wants_prompt_logprobs:
                # NOTE: eager, for the hidden states of every row; the same kernels as the shape's graph
                hidden = self.prefill_pack_hidden(pack.to(self.device))
                logits = self.sample_row_logits(hidden, pack.sample_rows.to(self.device))
                self.add_prompt_logprobs(hidden, chunks)
            else:
                logits = self.padded_prefill_logits(pack)
        for chunk in chunks:
            chunk.request.num_computed_tokens = chunk.start + chunk.num_tokens
        finishing = [chunk.request for chunk in chunks if chunk.is_last]
        return self.sample(logits, finishing) if finishing else []

    @torch.inference_mode()
    def run_prefill_and_decode(self, chunks: list[PrefillChunk], decodes: list[Request]) -> list[SampledToken]:
        """A prefill pack and the decode step of the requests decoding, in one forward where their pair of sizes was
        verified (joined_shapes), else one after the other: -> the decode rows' tokens, then token 1 of the
        prompts finishing."""
        assert self.decode_in_flight is None, "read the decode step in flight first (finish_decode_in_flight)"
        decode_rows = next(size for size in self.decode_sizes if size >= len(decodes))
        pack_rows = self.pack_rows(chunks)
        wants_prompt_logprobs = any(c.request.params.prompt_logprobs is not None for c in chunks)
        if wants_prompt_logprobs or (decode_rows, pack_rows) not in self.joined_shapes:
            return self.run_decode(decodes) + self.run_prefill(chunks)
        self.count_joined(decode_rows, pack_rows)
        hidden, sample_rows = self.joined_hidden(decodes, decode_rows, chunks, pack_rows)
        sampled = self.sample(self.model.compute_logits(hidden[:decode_rows]), decodes)
        for chunk in chunks:
            chunk.request.num_computed_tokens = chunk.start + chunk.num_tokens
        finishing = [chunk.request for chunk in chunks if chunk.is_last]
        if finishing:
            sampled += self.sample(self.sample_row_logits(hidden, sample_rows), finishing)
        return sampled

    def count_joined(self, decode_rows: int, pack_rows: int) -> None:
        self.num_joined_forwards += 1
        self.num_prefill_forwards += 1
        self.num_padded_prefill_forwards += 1
        self.num_decode_forwards += 1
        self.prefill_rows_histogram[pack_rows] = self.prefill_rows_histogram.get(pack_rows, 0) + 1
        self.decode_rows_histogram[decode_rows] = self.decode_rows_histogram.get(decode_rows, 0) + 1

    @torch.inference_mode()
    def joined_hidden(self, decodes: list[Request], decode_rows: int, chunks: list[PrefillChunk],
                      pack_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The joined forward, through the piecewise graphs for a small pack (joined_steps.runs_through_pieces), else
        eager: -> hidden states of every row, and the pack's sample rows among them."""
        sched = self.config.scheduler
        pack = build_prefill_pack(chunks, pack_rows, sched.prefill_seqs_per_forward, self.block_size,
                                  self.table_rows).to(self.device)
        inputs, sample_rows = join_decode_and_pack(self.mixed_inputs(decodes, decode_rows, []), pack,
                                                   use_kernel=self.packed_prefill_kernel)
        if runs_through_pieces(self, decode_rows, pack_rows):
            return self.piecewise_or_eager(inputs), sample_rows
        return self.forward(inputs), sample_rows

    def pack_rows(self, chunks: list[PrefillChunk]) -> int:
        """The smallest verified pack size that holds the chunks (T when no smaller one was kept)."""
        num_tokens = sum(chunk.num_tokens for chunk in chunks)
        return next(size for size in self.pack_sizes if size >= num_tokens)

    def natural_prefill_logits(self, chunk: PrefillChunk, with_prompt_logprobs: bool = False) -> torch.Tensor:
        """The paper's isolated prefill: the chunk alone at its natural length, eager. -> [1, vocab]"""
        hidden = self.forward(build_step([], 0, [chunk], self.block_size, self.device))
        if with_prompt_logprobs:
            self.add_prompt_logprobs(hidden, [chunk])
        return self.model.compute_logits(hidden[-1:])

    @torch.inference_mode()
    def add_prompt_logprobs(self, hidden: torch.Tensor, chunks: list[PrefillChunk]) -> None:
        """For each chunk wanting them (rows in chunk order from row 0): the logprobs of the prompt tokens its
        rows predict, with params.prompt_logprobs alternatives, appended to its request's prompt_logprobs.

        NOTE: each prefill chunk's rows go through lm_head and log_softmax together, at the chunk's length, also
        where a prompt ran several chunks in this forward (multi_chunk_prefill): a function of the prompt alone, as
        the forward is."""
        row, chunk_size = 0, self.config.scheduler.prefill_chunk_size
        for piece in chunks:
            if piece.request.params.prompt_logprobs is not None:
                for start in range(piece.start, piece.start + piece.num_tokens, chunk_size):
                    count = min(chunk_size, piece.start + piece.num_tokens - start)
                    offset = row + start - piece.start
                    self.add_chunk_prompt_logprobs(piece.request, start, hidden[offset:offset + count])
            row += piece.num_tokens

    def add_chunk_prompt_logprobs(self, request: Request, start: int, hidden: torch.Tensor) -> None:
        k = request.params.prompt_logprobs
        targets = request.prompt_token_ids[start + 1:start + len(hidden) + 1]  # NOTE: the last row predicts output
        if targets:
            logprobs = self.sampler.log_softmax(self.model.compute_logits(hidden).float())[:len(targets)]
            target_ids = torch.tensor(targets, device=logprobs.device).unsqueeze(1)
            chosen = logprobs.gather(1, target_ids).squeeze(1).tolist()
            top_values, top_ids = logprobs.topk(k, dim=1) if k else (logprobs[:, :0], logprobs[:, :0])
            request.prompt_logprobs += [
                TokenLogprobs(t, lp, tuple(zip(ids, values, strict=True)))
                for t, lp, ids, values in zip(targets, chosen, top_ids.tolist(), top_values.tolist(), strict=True)]
        if start == 0:
            request.prompt_logprobs.insert(0, None)

    @torch.inference_mode()
    def prefill_pack_hidden(self, inputs: PrefillPackInputs) -> torch.Tensor:
        meta = inputs.metadata(use_kernel=self.packed_prefill_kernel)
        return self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers, meta)

    def padded_prefill_logits(self, inputs: PrefillPackInputs) -> torch.Tensor:
        """-> [num_seqs, vocab]: row i is the logits of the i-th prompt finishing in this pack."""
        num_rows = len(inputs.input_ids)
        if self.prefill_graph is not None and num_rows in self.prefill_graph.graphs:
            return self.prefill_graph.replay(num_rows, inputs)
        return self.prefill_pack_logits(inputs.to(self.device))

    @torch.inference_mode()
    def prefill_pack_logits(self, inputs: PrefillPackInputs) -> torch.Tensor:
        meta = inputs.metadata(use_kernel=self.packed_prefill_kernel)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers, meta)
        return self.sample_row_logits(hidden, inputs.sample_rows)

    def sample_row_logits(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """-> [num_seqs, vocab]: the logits of a pack's sampled rows, whichever position a prompt's row has.
        NOTE: on CPU one row at a time: MKL's SSE4.2 sgemm gives row 1 of a 3-7 row GEMM other bits than row 0
        (strict mode too), so S rows at once would make a prompt's token 1 depend on its place in the pack."""
        if self.on_cuda:
            return self.model.compute_logits(hidden[rows])
        return torch.cat([self.model.compute_logits(hidden[row:row + 1]) for row in rows.tolist()])

    def padded_prefill_sizes(self) -> list[int]:
        """Row counts of fixed_shape's padded prefill forwards (each one CUDA graph on CUDA)."""
        sched = self.config.scheduler
        if sched.prefill_pack_tokens:  # NOTE: every candidate, before the probe keeps those that pass
            return [*sched.prefill_pack_sizes, sched.prefill_pack_tokens]
        return list(sched.prefill_buckets)

    def capture_prefill_graphs(self) -> CapturedGraphs[PrefillPackInputs]:
        num_seqs = self.config.scheduler.prefill_seqs_per_forward

        def make_static(num_rows: int) -> PrefillPackInputs:
            return build_prefill_pack([], num_rows, num_seqs, self.block_size, self.table_rows,
                                      whole_prompt=num_seqs == 1).to_static(self.device)

        return CapturedGraphs(self.padded_prefill_sizes(), make_static, self.prefill_pack_logits)

    def capture_decode_graphs(self) -> CapturedGraphs[WindowDecodeInputs]:
        """fixed_shape captures N (and the candidate smaller sizes, kept if verified); mixed-step modes capture several
        and pad a step to the next size."""
        if self.mode == "fixed_shape":
            sizes = [*self.config.scheduler.decode_step_sizes, self.max_num_seqs]
        else:
            sizes = capture_sizes(self.max_num_seqs)

        def make_static(size: int) -> WindowDecodeInputs:
            return build_window_decode([], size, self.window_blocks, self.block_size).to_static(self.device)

        return CapturedGraphs(sizes, make_static, lambda static: self.window_decode_logits(
            static, self.kv_splits(len(static.input_ids)), self.kv_split_tokens))

    def run_decode(self, requests: list[Request]) -> list[SampledToken]:
        """The fixed-shape step: N rows whatever len(requests) is, or the smallest verified size that holds
        them (decode_step_sizes), which gives each row the same bits."""
        assert self.decode_in_flight is None, "read the decode step in flight first (finish_decode_in_flight)"
        return self.sample(self.fixed_decode_logits(requests), requests)

    def fixed_decode_logits(self, requests: list[Request], previous: DecodeInFlight | None = None,
                            ahead: list[int] | None = None) -> torch.Tensor:
        self.num_decode_forwards += 1
        num_rows = next(size for size in self.decode_sizes if size >= len(requests))
        self.decode_rows_histogram[num_rows] = self.decode_rows_histogram.get(num_rows, 0) + 1
        return self.decode_logits(requests, num_rows, previous, ahead)

    def decode_logits(self, requests: list[Request], num_rows: int, previous: DecodeInFlight | None = None,
                      ahead: list[int] | None = None) -> torch.Tensor:
        """previous: the step in flight, whose sampled tokens are the inputs of the requests that ran in it; ahead:
        tokens_ahead(requests, previous)."""
        if self.decode_graph is not None:
            inputs = build_window_decode(requests, num_rows, self.window_blocks, self.block_size, self.table_rows,
                                         ahead)
            inputs.input_ids = input_ids_with_tokens_ahead(inputs.input_ids, requests, previous, self.device)
            return self.decode_graph.replay(num_rows, inputs)
        inputs = self.mixed_inputs(requests, num_rows, [], ahead)
        inputs.input_ids = input_ids_with_tokens_ahead(inputs.input_ids, requests, previous, self.device)
        return self.model.compute_logits(self.forward(inputs))

    # --- async scheduling (corun/decode_ahead.py) ---------------------------------------------------------------
    def overlaps(self, requests: list[Request]) -> bool:
        """Whether a decode step of these requests may run ahead of the host: async scheduling on, a decode step
        this runner launches without a host round trip, and no row whose logits depend on the values of its last
        tokens on the host (bad words, structured outputs)."""
        if not (self.config.scheduler.async_scheduling and requests):
            return False
        if self.mode != "fixed_shape" and self.decode_graph is None:
            return False
        return not any(r.params.bad_words_token_ids or r.params.structured is not None or r.params.n != 1
                       for r in requests)

    def run_decode_ahead(self, requests: list[Request],
                         while_waiting: Callable[[], None] | None = None) -> list[SampledToken]:
        """Launch the decode step of requests (those whose token in flight ends them by length left out), then read
        the step launched before it: -> that step's tokens (the caller drops those of requests that ended since).
        while_waiting: called while the host waits for that step (DecodeInFlight.wait)."""
        previous, self.decode_in_flight = self.decode_in_flight, None
        running = [r for r in requests if continues(r, previous)]
        if running:
            ahead = tokens_ahead(running, previous)
            if self.mode == "fixed_shape":
                logits = self.fixed_decode_logits(running, previous, ahead)
            else:
                self.num_mixed_forwards += 1
                logits = self.decode_logits(running, self.decode_graph.size_for(len(running)), previous, ahead)
                logits = logits[:len(running)]
            self.num_forwards_ahead += any(ahead)
            self.decode_in_flight = self.launch_sample(logits, running, ahead, previous)
        return [] if previous is None else self.read_sampled(previous, while_waiting)

    def finish_decode_in_flight(self) -> list[SampledToken]:
        """Read the decode step in flight, if any: -> its tokens."""
        previous, self.decode_in_flight = self.decode_in_flight, None
        return [] if previous is None else self.read_sampled(previous)

    @torch.inference_mode()
    def launch_sample(self, logits: torch.Tensor, requests: list[Request], ahead: list[int],
                      previous: DecodeInFlight | None) -> DecodeInFlight:
        positions = [r.num_tokens + a for r, a in zip(requests, ahead, strict=True)]
        wanted = any(r.params.logprobs is not None for r in requests)
        # NOTE: histories only for a step that adjusts logits: copying every row's output each step costs the host
        histories = histories_ahead(requests, ahead) if any(r.params.adjusts_logits for r in requests) else None
        batch = SamplingBatch.build([r.params for r in requests], [r.seed for r in requests], positions,
                                    logits.shape[0], logits.device, histories)
        fill_penalty_tokens(batch, requests, previous, logits.device)
        out = self.sampler(logits, batch, self.config.max_logprobs if wanted else None)
        host, ready = copy_to_host(out, len(requests))
        return DecodeInFlight(requests, out.token_ids, host, ready)

    def read_sampled(self, step: DecodeInFlight,
                     while_waiting: Callable[[], None] | None = None) -> list[SampledToken]:
        token_ids, logprobs = to_host(step.wait(while_waiting), step.requests)
        return [SampledToken(r, tok, lp) for r, tok, lp in zip(step.requests, token_ids, logprobs, strict=True)]

    def run_mixed(self, batch: ScheduledBatch) -> list[SampledToken]:
        """mixed-step modes: decodes and prompt chunks of several requests in one forward, no padding."""
        assert self.decode_in_flight is None, "read the decode step in flight first (finish_decode_in_flight)"
        decodes, chunks = batch.decode_requests, batch.prefill_chunks
        self.num_mixed_forwards += 1
        if not chunks and self.decode_graph is not None:
            size = self.decode_graph.size_for(len(decodes))
            return self.sample(self.decode_logits(decodes, size)[: len(decodes)], decodes)
        hidden = self.piecewise_or_eager(self.mixed_inputs(decodes, len(decodes), chunks))
        rows, requests, end = list(range(len(decodes))), list(decodes), len(decodes)
        for chunk in chunks:
            end += chunk.num_tokens
            chunk.request.num_computed_tokens = chunk.start + chunk.num_tokens
            if chunk.is_last:
                rows.append(end - 1)
                requests.append(chunk.request)
        if not requests:
            return []
        return self.sample(self.model.compute_logits(hidden[rows]), requests)

    def piecewise_or_eager(self, inputs: StepInputs) -> torch.Tensor:
        """A mixed step's or joined forward's hidden states: through the piecewise graphs where a size holds it,
        else eager."""
        pieces = self.piecewise_forward
        if pieces is None or pieces.size_for(len(inputs.input_ids)) is None:
            return self.forward(inputs)
        self.num_piecewise_forwards += 1
        return pieces.forward(inputs.input_ids, inputs.positions, inputs.meta)

    def mixed_inputs(self, decodes: list[Request], num_decode_rows: int, chunks,
                     ahead: list[int] | None = None) -> StepInputs:
        if not self.batched_decode_rows:  # NOTE: CPU: per-request attention for every row
            return build_step(decodes, num_decode_rows, chunks, self.block_size, self.device, ahead)
        return build_windowed_step(decodes, num_decode_rows, chunks, self.block_size, self.device,
                                   self.window_blocks, self.kv_splits(num_decode_rows), self.kv_split_tokens,
                                   chunk_invariant_prefill=self.mode == "batch_invariant", table_rows=self.table_rows,
                                   varlen_prompts=self.varlen_prompt_kernel, ahead=ahead)

    @property
    def arch(self) -> ModelArchConfig:
        """The model's facts (corun.runner_interface.NodeRunner: what a node reads of its model)."""
        return self.model.cfg

    def forward_counts(self) -> dict[str, int]:
        return {"num_prefill_forwards": self.num_prefill_forwards, "num_decode_forwards": self.num_decode_forwards,
                "num_mixed_forwards": self.num_mixed_forwards,
                "num_padded_prefill_forwards": self.num_padded_prefill_forwards,
                "num_piecewise_forwards": self.num_piecewise_forwards,
                "num_forwards_ahead": self.num_forwards_ahead, "num_joined_forwards": self.num_joined_forwards}

    @torch.inference_mode()
    def forward(self, inputs: StepInputs) -> torch.Tensor:
        return self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers, inputs.meta)

    @torch.inference_mode()
    def window_decode_logits(self, inputs: WindowDecodeInputs, num_kv_splits: int = 0,
                             kv_split_tokens: int = 0) -> torch.Tensor:
        meta = inputs.metadata(num_kv_splits, kv_split_tokens)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers, meta)
        return self.model.compute_logits(hidden)  # [num_rows, vocab]

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, requests: list[Request]) -> list[SampledToken]:
        return sample_requests(self.sampler, logits, requests, self.config.max_logprobs)


def sample_requests(sampler: Sampler, logits: torch.Tensor, requests: list[Request],
                    max_logprobs: int) -> list[SampledToken]:
    """logits: [rows, vocab] with rows >= len(requests); row i belongs to requests[i].

    A request with params.n > 1 (on a prefill node) gets one row per sample, each a copy of its logits row
    sampled with seed sample_seed(seed, i): the sampler's rows are independent, so sample i's token is the
    one a request with that seed gets."""
    seeds = [r.seed for r in requests]
    indices = [0] * len(requests)
    if any(r.params.n > 1 for r in requests):
        rows = [row for row, r in enumerate(requests) for _ in range(r.params.n)]
        logits = logits[rows]
        indices = [i for r in requests for i in range(r.params.n)]
        requests = [requests[row] for row in rows]
        seeds = [sample_seed(r.seed, i) for r, i in zip(requests, indices, strict=True)]
    bitmask = sampler.grammars.bitmask(requests, logits.shape[0], logits.shape[-1]) if sampler.grammars else None
    batch = SamplingBatch.build([r.params for r in requests], seeds, [r.num_tokens for r in requests],
                                logits.shape[0], logits.device, requests, bitmask)
    wanted = any(r.params.logprobs is not None for r in requests)
    out = sampler(logits, batch, max_logprobs if wanted else None)
    return [SampledToken(r, tok, lp, i)
            for r, tok, lp, i in zip(requests, *to_host(out, requests), indices, strict=True)]


def to_host(out: SamplerOutput, requests: list[Request]) -> tuple[list[int], list[TokenLogprobs | None]]:
    num = len(requests)
    wants_top = out.topk_ids.shape[1] > 0 or any(r.params.logprobs is not None for r in requests)
    rows = [out.token_ids[:num], out.logprobs[:num]]
    rows += [out.topk_ids[:num], out.topk_logprobs[:num]] if wants_top else []
    token_ids, logprobs, *top = (t.tolist() for t in read_back(rows))
    if not wants_top:
        return token_ids, [None] * num
    top_ids, top_logprobs = top
    results = []
    for i, request in enumerate(requests):
        k = request.params.logprobs
        top = tuple(zip(top_ids[i][:k], top_logprobs[i][:k], strict=True)) if k else ()
        results.append(None if k is None else TokenLogprobs(token_ids[i], logprobs[i], top))
    return token_ids, results
