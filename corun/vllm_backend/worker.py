"""Every decode step of a vLLM engine at exactly N rows (`worker_extension_cls`, called by collective_rpc).

On CUDA the shape comes from vLLM itself (engine_args: cudagraph_mode FULL_DECODE_ONLY with the one capture size N:
a decode batch of k <= N requests is padded to N and replays that graph). On CPU vLLM has no static graphs and runs
each step at its own size, so matmul shapes (and with them the blocking, and the reduction order of a row) would
follow the number of running requests. fix_decode_shape pads uniform decode batches to N rows the way vLLM pads for
a CUDA graph: the padding tokens' slots are -1 (they write no KV) and attention runs on the real tokens only.

NOTE: the one change inside vLLM (0.32.0): the runner's CudagraphDispatcher.dispatch, wrapped to return the padded
batch size for a uniform decode batch when no graph applies. Tests: tests/vllm_backend (shapes seen by the model).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from vllm.config import CUDAGraphMode


class FixedDecodeShape:
    """Mixed into vLLM's worker; its methods run in the worker process."""

    def corun_fix_decode_shape(self, num_rows: int) -> bool:
        """Pad decode steps of <= num_rows requests to num_rows. False if vLLM's CUDA graph already does."""
        runner = self.model_runner
        dispatcher = runner.cudagraph_dispatcher
        if runner.compilation_config.cudagraph_mode != CUDAGraphMode.NONE:
            return False
        dispatch = dispatcher.dispatch

        def padded_dispatch(num_tokens: int, uniform_decode: bool = False, **kwargs):
            mode, descriptor = dispatch(num_tokens, uniform_decode=uniform_decode, **kwargs)
            if uniform_decode and mode == CUDAGraphMode.NONE and num_tokens <= num_rows:
                descriptor = dataclasses.replace(descriptor, num_tokens=num_rows)
            return mode, descriptor

        dispatcher.dispatch = padded_dispatch
        return True

    def corun_count_forward_rows(self) -> None:
        """From now on, count the token rows of every model forward (tests: what shapes the model saw)."""
        self.corun_forward_rows = Counter()
        self.model_runner.get_model().register_forward_pre_hook(self._corun_count_rows, with_kwargs=True)

    def _corun_count_rows(self, module, args, kwargs) -> None:
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        if positions is not None:
            self.corun_forward_rows[int(positions.shape[-1])] += 1

    def corun_forward_rows_seen(self) -> dict[int, int]:
        """Token rows of a model forward since corun_count_forward_rows -> how many forwards had that many."""
        return dict(self.corun_forward_rows)

    def corun_execute(self, scheduler_output):
        """One step the node scheduled (runner.VllmModelRunner) -> (vLLM's output, the raw logits by request key)."""
        self.execute_model(scheduler_output)
        output = self.sample_tokens(None)
        sampler = next(p for p in self.model_runner.input_batch.logitsprocs.all if hasattr(p, "last_logits"))
        return output, sampler.last_logits
