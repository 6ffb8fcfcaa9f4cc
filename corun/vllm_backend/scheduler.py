"""The fixed_shape schedule for vLLM engines (`scheduler_cls`): the paper's Algorithms 1 and 2 over vLLM's scheduler.

Each step is exactly one of:
  - the next chunk of the prompt being prefilled (Algorithm 1: a started prefill finishes first), alone;
  - else the first chunk of the head of the waiting queue, alone, if fewer than N requests run and the KV of its
    whole configured sequence (prompt + max_tokens) fits beside what the running requests reserved;
  - else one decode step of every running request (Algorithm 2), padded to N rows by worker.FixedDecodeShape.
Chunks are `prefill_chunk_size` tokens (the last one shorter): cuts at positions that depend on the prompt alone.
Since admission reserves KV for the whole sequence, vLLM never needs to preempt.

NOTE: vLLM's own schedule() builds each step's SchedulerOutput; this class only narrows what it sees: the running
requests it may schedule, how many it may admit (max_num_active_reqs) and the token budget.
"""

from __future__ import annotations

from contextlib import contextmanager

from vllm.v1.core.sched.scheduler import Scheduler

from corun.vllm_backend.engine_args import CORUN_CHUNK_SIZE_KEY


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class FixedShapeVllmScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        extra = self.vllm_config.additional_config or {}
        self.prefill_chunk_size = int(extra.get(CORUN_CHUNK_SIZE_KEY, self.max_num_scheduled_tokens))
        self.num_usable_blocks = self.kv_cache_manager.block_pool.num_gpu_blocks - 1  # NOTE: block 0 is vLLM's null
        self.block_size = self.cache_config.block_size
        self.num_prefill_steps = 0
        self.num_decode_steps = 0
        self.max_decode_rows = 0
        self.num_preempted = 0
        """Requests vLLM preempted: admission makes it 0 (tests check)."""

    def schedule(self, throttle_prefills: bool = False):
        prefilling = [r for r in self.running if r.num_computed_tokens < r.num_prompt_tokens]
        if prefilling:
            self.num_prefill_steps += 1
            return self.narrowed_schedule(prefilling[:1], admit=0, token_budget=self.prefill_chunk_size)
        if self.head_admissible():
            self.num_prefill_steps += 1
            return self.narrowed_schedule([], admit=1, token_budget=self.prefill_chunk_size)
        self.num_decode_steps += bool(self.running)
        self.max_decode_rows = max(self.max_decode_rows, len(self.running))
        return self.narrowed_schedule(self.running, admit=0, token_budget=self.max_num_scheduled_tokens)

    def narrowed_schedule(self, running: list, admit: int, token_budget: int):
        with self.narrowed(running, admit, token_budget):
            output = super().schedule()
        self.num_preempted += len(output.preempted_req_ids or ())
        return output

    def head_admissible(self) -> bool:
        """The next waiting request may start: a slot, and blocks for its whole sequence beside the reservations."""
        queue = self.kv_holding_waiting or self.waiting
        if not queue or len(self.running) >= self.max_num_running_reqs:
            return False
        reserved = sum(self.blocks_reserved(r) for r in self.running)
        return reserved + self.blocks_reserved(queue.peek_request()) <= self.num_usable_blocks

    def blocks_reserved(self, request) -> int:
        return cdiv(request.num_prompt_tokens + request.max_tokens, self.block_size)

    @contextmanager
    def narrowed(self, running: list, admit: int, token_budget: int):
        """vLLM's schedule() sees only `running`, admits at most `admit` waiting requests, schedules at most
        token_budget tokens; the running requests it did not see stay running, in their order."""
        shown = {id(r) for r in running}
        hidden = [r for r in self.running if id(r) not in shown]
        saved = self.max_num_active_reqs, self.max_num_running_reqs, self.max_num_scheduled_tokens
        self.running = list(running)
        self.max_num_active_reqs = self.max_num_running_reqs = len(running) + admit
        self.max_num_scheduled_tokens = token_budget
        try:
            yield
        finally:
            self.max_num_active_reqs, self.max_num_running_reqs, self.max_num_scheduled_tokens = saved
            self.running = hidden + self.running
