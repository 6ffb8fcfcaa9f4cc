"""A decode node's KV blocks as its samples' tokens need them, and the newest samples paused to host memory when the
cache runs out (the swap space: corun/kv_swap.py says why every admitted request still finishes).

KVGrowth is a part of DecodeServer (decode_node/server.py), kept here so that each file reads as one concern: it uses
the server's running and paused samples (oldest first by RunningSample.order), its block manager and its HostSwap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corun.request import Request
from corun.swap_preemption import blocks_for_next_step, may_need_blocks, move_to_paused

if TYPE_CHECKING:
    from corun.block_manager import BlockManager
    from corun.kv_swap import HostSwap
    from decode_node.jobs import DecodeJob, RunningSample


class KVGrowth:
    running: list[RunningSample]
    paused: list[RunningSample]
    """Oldest first."""
    claiming: dict[str, DecodeJob]
    transferring: dict[str, DecodeJob]
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

    def blocks_promised(self) -> int:
        """The blocks the whole sequences of every admitted sample take (corun/kv_swap.py: what admission bounds)."""
        pulling = [r for job in [*self.claiming.values(), *self.transferring.values()] for r in job.samples.values()]
        admitted = [*pulling, *(sample.request for sample in [*self.running, *self.paused])]
        return sum(self.whole_blocks(r) for r in admitted)

    def grow_running(self) -> None:
        """Each running sample gets the blocks its next step writes into (its position after the token in flight, if
        any), oldest first; where the cache has none left, the newest sample is paused for them. Then a block is kept
        free (or on its way back from a copy) for each running sample, so that the next steps' blocks do not wait
        for a copy: a sample that finds none free waits a step (ready_to_step)."""
        needing = [s for s in self.running if may_need_blocks(self.block_manager, s.request)]
        for sample in sorted(needing, key=lambda s: s.order):
            if sample not in self.running:  # NOTE: paused below for an older one
                continue
            request = sample.request
            needed = self.blocks_for_next_step(request) - len(request.block_ids)
            while needed > 0:
                if self.block_manager.num_free_blocks == 0 and (self.swap.blocks_in_copy >= needed or
                                                                 not self.pause_newest()):
                    break  # NOTE: blocks on their way back from a copy (or held by pulling jobs): it waits a step
                if sample not in self.running or self.block_manager.num_free_blocks == 0:
                    break  # NOTE: it was the newest, paused itself; or the blocks come back when the copy ends
                new = self.block_manager.allocate(min(needed, self.block_manager.num_free_blocks) *
                                                  self.block_manager.block_size)
                request.block_ids = request.block_ids + new  # NOTE: replaced, never mutated (step_inputs caches it)
                needed -= len(new)
        while self.block_manager.num_free_blocks + self.swap.blocks_in_copy < len(self.running) and \
                self.pause_newest():
            pass

    def free_copied(self) -> None:
        """The blocks of paused samples whose copies to host memory have completed go back to the pool."""
        copied = self.swap.copied_blocks()
        if copied:
            self.block_manager.free(copied)

    def blocks_for_next_step(self, request: Request) -> int:
        return blocks_for_next_step(self.block_manager, request)

    def pause_newest(self) -> bool:
        """Pause the newest sample holding blocks, running or paused, unless it is the only one (the oldest always
        runs on): its blocks (all of them, or as many as the swap space takes: at least one while admission's bound
        holds) are copied to host memory and come back to the pool when the copy ends; -> whether any was."""
        holders = [s for s in [*self.running, *self.paused] if s.request.block_ids]
        if self.swap.room == 0 or len(holders) < 2:
            return False
        victim = max(holders, key=lambda s: s.order)
        request = victim.request
        count = min(len(request.block_ids), self.swap.room)  # NOTE: >= needed while admission holds (kv_swap.py)
        victim.swapped = self.swap.pause_tail(request, count, victim.swapped)
        self.num_preemptions += move_to_paused(self.running, self.paused, victim, lambda s: s.order)
        self.free_copied()  # NOTE: on CPU the copy is complete already
        return True

    def resume_paused(self) -> None:
        """Paused samples, oldest first, while the cache has room for their blocks, their next step's and a block for
        each running sample's next (grow_running's reserve, lest it pause one at once): copied back (queued before
        the step that reads them)."""
        while self.paused:
            sample = self.paused[0]
            request, swapped = sample.request, sample.swapped
            held = len(request.block_ids) + swapped.num_blocks
            wanted = swapped.num_blocks + max(0, self.blocks_for_next_step(request) - held) + len(self.running) + 1
            if self.block_manager.num_free_blocks < wanted:
                return
            self.swap.resume(request, swapped, self.block_manager)
            sample.swapped = None
            self.running.append(self.paused.pop(0))
