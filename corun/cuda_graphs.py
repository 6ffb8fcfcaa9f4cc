"""Fixed-shape steps captured as CUDA graphs, one per size, sharing one memory pool (nano-vllm's
capture_cudagraph / run_model): static inputs are captured once and each replay copies a step's inputs into them.

Used for the decode step (fixed_shape captures exactly N rows; mixed-step modes several sizes) and for fixed_shape's
prefill forwards (one graph per prefill bucket, or one at the packed prefill's T rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import torch


class StaticInputs(Protocol):
    def copy_to(self, static) -> None: ...


Inputs = TypeVar("Inputs", bound=StaticInputs)


class CapturedGraphs(Generic[Inputs]):
    def __init__(self, sizes: list[int], make_static: Callable[[int], Inputs], run: Callable[[Inputs], torch.Tensor]):
        """make_static(size): device inputs of that size (padding only); run(static) -> the output tensor."""
        self.sizes = sorted(sizes)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Inputs, torch.Tensor]] = {}
        for size in reversed(self.sizes):  # NOTE: largest first, so smaller graphs reuse its pool memory
            self.graphs[size] = self.capture(make_static(size), run)
        self.num_replays = 0

    def capture(self, static: Inputs, run: Callable[[Inputs], torch.Tensor]):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # NOTE: warm up the allocator and lazy kernel set-up outside the capture
                run(static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = run(static)
        return graph, static, output

    def keep(self, sizes: list[int]) -> None:
        """Drop the graphs of every other size."""
        self.graphs = {size: self.graphs[size] for size in sizes}
        self.sizes = sorted(sizes)

    def size_for(self, num_rows: int) -> int:
        return next(size for size in self.sizes if size >= num_rows)

    def replay(self, size: int, inputs: Inputs) -> torch.Tensor:
        graph, static, output = self.graphs[size]
        inputs.copy_to(static)
        graph.replay()
        self.num_replays += 1
        return output
