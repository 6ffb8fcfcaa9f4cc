"""A decode node's KV blocks as its samples' tokens need them, and the newest samples paused to host memory when the
cache runs out (the swap space: corun/kv_swap.py says why every admitted request still finishes).

KVGrowth is a part of DecodeServer (decode_node/server.py), kept here so that each file reads as one concern: it uses
the server's running and paused samples (oldest first by RunningSample.order), its block manager and its HostSwap.
Each step's blocks and the resumes are the engine's (corun/swap_preemption.GrowsOnDemand); the samples are its
holders, and every running sample decodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corun.request import Request
from corun.swap_preemption import GrowsOnDemand, may_need_blocks, move_to_paused

if TYPE_CHECKING:
    from corun.block_manager import BlockManager
    from corun.kv_swap import HostSwap
    from decode_node.jobs import DecodeJob, RunningSample


class KVGrowth(GrowsOnDemand):
    running: list[RunningSample]
    paused: list[RunningSample]
    """Oldest first."""
    claiming: dict[str, DecodeJob]
    transferring: dict[str, DecodeJob]
    awaiting_grammar: dict[str, DecodeJob]
    block_manager: BlockManager
    swap: HostSwap
    num_preemptions: int

    def ready_to_step(self) -> list[Request]:
        """The running samples whose blocks hold what the next step writes (one may wait a step for blocks that only
        reads in flight hold: grow_running)."""
        # NOTE: not the engine's way (grow_running telling which it left short): a step's tokens read on the host
        # between the two (schedule) move samples to their next positions
        return [s.request for s in self.running if not may_need_blocks(self.block_manager, s.request) or
                len(s.request.block_ids) >= self.blocks_for_next_step(s.request)]

    def whole_blocks(self, request: Request) -> int:
        return self.block_manager.blocks_needed(request.max_num_tokens)

    def admitted_jobs(self) -> list[DecodeJob]:
        """Admitted, not running yet: each holds its slots and blocks."""
        return [*self.claiming.values(), *self.transferring.values(), *self.awaiting_grammar.values()]

    def blocks_promised(self) -> int:
        """The blocks the whole sequences of every admitted sample take (corun/kv_swap.py: what admission bounds)."""
        pulling = [r for job in self.admitted_jobs() for r in job.samples.values()]
        admitted = [*pulling, *(sample.request for sample in [*self.running, *self.paused])]
        return sum(self.whole_blocks(r) for r in admitted)

    def free_copied(self) -> None:
        """The blocks of paused samples whose copies to host memory have completed go back to the pool."""
        copied = self.swap.copied_blocks()
        if copied:
            self.block_manager.free(copied)

    def decoding(self) -> list[RunningSample]:
        return self.running

    @staticmethod
    def request_of(holder: RunningSample) -> Request:
        return holder.request

    @staticmethod
    def order_of(holder: RunningSample) -> int:
        return holder.order

    def pause_newest(self) -> bool:
        """Pause the newest sample holding blocks, running or paused, unless it is the only one (the oldest always
        runs on): its blocks (all of them, or as many as the swap space takes: at least one while admission's bound
        holds) are copied to host memory and come back to the pool when the copy ends; -> whether any was."""
        holders = [s for s in [*self.running, *self.paused] if s.request.block_ids]
        if self.swap.room == 0 or len(holders) < 2:
            return False
        victim = max(holders, key=self.order_of)
        request = victim.request
        count = min(len(request.block_ids), self.swap.room)  # NOTE: >= needed while admission holds (kv_swap.py)
        victim.swapped = self.swap.pause_tail(request, count, victim.swapped)
        self.num_preemptions += move_to_paused(self.running, self.paused, victim, self.order_of)
        self.free_copied()  # NOTE: on CPU the copy is complete already
        return True
