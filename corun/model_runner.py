"""Runs scheduled batches on the model: isolated prefill, the fixed N-row decode step, standard mixed steps.

The corun decode step always computes exactly N rows: running requests fill rows 0..k-1 in running order
(so a request moves up when an earlier one finishes) and the rest are padding that reads and writes only the
null block and whose sampled values are dropped. On CUDA the step (model + lm head) is captured once as one
CUDA graph and replayed; the sampler runs outside it on the same N rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from corun.config import EngineConfig
from corun.kv_cache import PagedKVCache
from corun.models.loader import DTYPES, load_model
from corun.outputs import TokenLogprobs
from corun.request import Request
from corun.sampler import Sampler, SamplerOutput, SamplingBatch
from corun.scheduler import PrefillChunk, ScheduledBatch
from corun.step_inputs import StepInputs, WindowDecodeInputs, build_step, build_window_decode


@dataclass
class SampledToken:
    request: Request
    token_id: int
    logprobs: TokenLogprobs | None


class ModelRunner:
    def __init__(self, config: EngineConfig, capture_decode_graph: bool = True):
        """capture_decode_graph: False on prefill-only nodes, which never run the decode step."""
        self.config = config
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.device = torch.device(config.device)
        self.block_size = config.cache.block_size
        self.num_rows = config.scheduler.max_num_seqs
        self.window_blocks = config.max_blocks_per_seq
        self.model = load_model(config.model, config.dtype, config.device, config.scheduler.max_model_len)
        self.kv_cache = PagedKVCache(self.model.cfg, config.cache, DTYPES[config.dtype], config.device)
        self.sampler = Sampler()
        self.num_prefill_forwards = self.num_decode_forwards = self.num_mixed_forwards = 0
        self.decode_graph = None
        if capture_decode_graph and self.device.type == "cuda" and config.use_cuda_graph \
                and config.scheduler.mode == "corun":
            self.decode_graph = DecodeGraph(self)

    def run_prefill(self, chunk: PrefillChunk) -> list[SampledToken]:
        """One request's chunk, alone, at its natural length; samples token 1 after the last chunk."""
        hidden = self.forward(build_step([], 0, [chunk], self.block_size, self.device))
        self.num_prefill_forwards += 1
        chunk.request.num_computed_tokens = chunk.start + chunk.num_tokens
        if not chunk.is_last:
            return []
        return self.sample(self.model.compute_logits(hidden[-1:]), [chunk.request])

    def run_decode(self, requests: list[Request]) -> list[SampledToken]:
        """The fixed-shape step: exactly N rows whatever len(requests) is."""
        self.num_decode_forwards += 1
        if self.decode_graph is not None:
            inputs = build_window_decode(requests, self.num_rows, self.window_blocks, self.block_size)
            return self.sample(self.decode_graph.replay(inputs), requests)
        hidden = self.forward(build_step(requests, self.num_rows, [], self.block_size, self.device))
        return self.sample(self.model.compute_logits(hidden), requests)

    def run_mixed(self, batch: ScheduledBatch) -> list[SampledToken]:
        """standard mode: decodes and prompt chunks of several requests in one forward, no padding."""
        decodes, chunks = batch.decode_requests, batch.prefill_chunks
        hidden = self.forward(build_step(decodes, len(decodes), chunks, self.block_size, self.device))
        self.num_mixed_forwards += 1
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

    def forward_counts(self) -> dict[str, int]:
        return {"num_prefill_forwards": self.num_prefill_forwards, "num_decode_forwards": self.num_decode_forwards,
                "num_mixed_forwards": self.num_mixed_forwards}

    @torch.inference_mode()
    def forward(self, inputs: StepInputs) -> torch.Tensor:
        return self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers, inputs.meta)

    @torch.inference_mode()
    def window_decode_logits(self, inputs: WindowDecodeInputs) -> torch.Tensor:
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers, inputs.metadata())
        return self.model.compute_logits(hidden)  # [num_rows, vocab]

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, requests: list[Request]) -> list[SampledToken]:
        """logits: [rows, vocab] with rows >= len(requests); row i belongs to requests[i]."""
        batch = SamplingBatch.build([r.params for r in requests], [r.seed for r in requests],
                                    [r.num_tokens for r in requests], logits.shape[0], logits.device)
        out = self.sampler(logits, batch, self.config.max_logprobs)
        return [SampledToken(r, tok, lp) for r, tok, lp in zip(requests, *to_host(out, requests))]


def to_host(out: SamplerOutput, requests: list[Request]) -> tuple[list[int], list[TokenLogprobs | None]]:
    num = len(requests)
    token_ids, logprobs = out.token_ids[:num].tolist(), out.logprobs[:num].tolist()
    top_ids, top_logprobs = out.topk_ids[:num].tolist(), out.topk_logprobs[:num].tolist()
    results = []
    for i, request in enumerate(requests):
        k = request.params.logprobs
        top = tuple(zip(top_ids[i][:k], top_logprobs[i][:k])) if k else ()
        results.append(None if k is None else TokenLogprobs(token_ids[i], logprobs[i], top))
    return token_ids, results


class DecodeGraph:
    """The N-row fixed-window decode step (model + lm head) captured once as one CUDA graph."""

    def __init__(self, runner: ModelRunner):
        blank = build_window_decode([], runner.num_rows, runner.window_blocks, runner.block_size)
        self.static = blank.to(runner.device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # NOTE: warm up the allocator and lazy kernel set-up outside the capture
                runner.window_decode_logits(self.static)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = runner.window_decode_logits(self.static)
        self.num_replays = 0

    def replay(self, inputs: WindowDecodeInputs) -> torch.Tensor:
        inputs.copy_to(self.static)
        self.graph.replay()
        self.num_replays += 1
        return self.logits
