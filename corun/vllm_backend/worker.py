"""Every decode step of a vLLM engine at exactly N rows (`worker_extension_cls`, called by collective_rpc).

On CUDA the model forward's shape comes from vLLM itself (engine_args: cudagraph_mode FULL_DECODE_ONLY with the one
capture size N: a decode batch of k <= N requests is padded to N and replays that graph). On CPU vLLM has no static
graphs and runs each step at its own size, so matmul shapes (and with them the blocking, and the reduction order of
a row) would follow the number of running requests: fix_decode_shape pads uniform decode batches to N rows the way
vLLM pads for a CUDA graph (the padding tokens' slots are -1: they write no KV; attention runs on the real tokens
only).

On both, vLLM computes logits after the forward, eagerly, on the rows it samples (k of them): that lm_head GEMM is
padded to N rows too, so cuBLAS (or the CPU BLAS) never sees a batch-sized M.

NOTE: the changes inside vLLM (0.32.0), both wrappers on one worker's objects: the runner's
CudagraphDispatcher.dispatch (returns the padded size for a uniform decode batch when no graph applies) and the
model's compute_logits. Tests: tests/vllm_backend (the shapes the model and lm_head saw).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch
from vllm.config import CUDAGraphMode


class FixedDecodeShape:
    """Mixed into vLLM's worker; its methods run in the worker process."""

    def corun_fix_decode_shape(self, num_rows: int) -> None:
        """Pad decode steps of <= num_rows requests, and logits of <= num_rows rows, to num_rows."""
        runner = self.model_runner
        self._corun_pad_logits(runner.get_model(), num_rows)
        if runner.compilation_config.cudagraph_mode != CUDAGraphMode.NONE:
            return  # NOTE: vLLM's graph at N pads the forward already
        dispatcher = runner.cudagraph_dispatcher
        dispatch = dispatcher.dispatch

        def padded_dispatch(num_tokens: int, uniform_decode: bool = False, **kwargs):
            mode, descriptor = dispatch(num_tokens, uniform_decode=uniform_decode, **kwargs)
            if uniform_decode and mode == CUDAGraphMode.NONE and num_tokens <= num_rows:
                descriptor = dataclasses.replace(descriptor, num_tokens=num_rows)
            return mode, descriptor

        dispatcher.dispatch = padded_dispatch

    def _corun_pad_logits(self, model, num_rows: int) -> None:
        compute_logits = model.compute_logits
        self.__dict__.setdefault("corun_logits_rows", Counter())

        padded: list[torch.Tensor] = []
        """The N-row input, made at the first call: its rows past the real ones hold whatever came before (a row's
        logits depend on that row alone), so a step only copies its k rows in."""

        def padded_compute_logits(hidden_states: torch.Tensor, *args, **kwargs):
            rows = hidden_states.shape[0]
            if rows < num_rows:
                if not padded:
                    padded.append(hidden_states.new_zeros(num_rows, *hidden_states.shape[1:]))
                padded[0][:rows] = hidden_states
                hidden_states = padded[0]
            logits = compute_logits(hidden_states, *args, **kwargs)
            self.corun_logits_rows[hidden_states.shape[0]] += 1
            return logits[:rows]

        model.compute_logits = padded_compute_logits

    def corun_count_forward_rows(self) -> None:
        """From now on, count the token rows of every model forward and lm_head call (tests: the shapes seen)."""
        self.corun_forward_rows, self.corun_logits_rows = Counter(), Counter()
        self.model_runner.get_model().register_forward_pre_hook(self._corun_count_rows, with_kwargs=True)

    def _corun_count_rows(self, module, args, kwargs) -> None:
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        if positions is not None:
            self.corun_forward_rows[int(positions.shape[-1])] += 1

    def corun_forward_rows_seen(self) -> dict[str, dict[int, int]]:
        """Token rows -> how many model forwards ("forward") and padded lm_head calls ("logits") had that many,
        since corun_count_forward_rows."""
        return {"forward": dict(self.corun_forward_rows), "logits": dict(self.corun_logits_rows)}

    def corun_execute(self, scheduler_output):
        """One step the node scheduled (runner.VllmModelRunner) -> (vLLM's output, the raw logits by request key)."""
        self.execute_model(scheduler_output)
        output = self.sample_tokens(None)
        sampler = next(p for p in self.model_runner.input_batch.logitsprocs.all if hasattr(p, "last_logits"))
        return output, sampler.last_logits
