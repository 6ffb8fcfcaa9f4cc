"""An engine's KV blocks as its requests' tokens need them, the newest requests paused to host memory when the cache
runs out (the engine's and a colocated node's scheduler, corun/scheduler.py; a decode node's, decode_node/
kv_growth.py, shares each step's growth and the resumes: GrowsOnDemand). corun/kv_swap.py says why a copy and never
a recompute: a paused request continues on the bits it had.

With a swap space (CacheConfig.swap_space_bytes > 0) a request is admitted with blocks for its prompt and token 1,
while the whole sequences (prompt + max_tokens) of every admitted request fit the cache and the swap space together;
without one, with blocks for its whole sequence, as before (nothing is ever paused). Why every admitted request still
finishes:
- The oldest admitted request is never paused. When it needs a block and none is free (none on its way back from a
  copy either), every cache block is held by admitted requests, so the bound leaves the swap space room for at least
  that block.
- A paused request's blocks go to host memory whole, the prefix cache's chunks among them (copied, then let go: others
  may still read them); where the swap space is short, only its own trailing blocks (its decode-written KV, its
  prompt's partial chunk). So admission also keeps free, past the new prompt's blocks, as many blocks as any admitted
  request may still grow by: every block taken after that is some request's own trailing block, which a pause gives
  back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corun.block_manager import BlockManager
    from corun.kv_swap import HostSwap
    from corun.request import Request


def blocks_for_next_step(block_manager: BlockManager, request: Request) -> int:
    """Blocks to the position a request's next decode step writes, after its token in flight if any (one too many
    otherwise): an engine's and a decode node's.
    NOTE: at most max_num_tokens - 1 positions: a request's last token is never fed back, so its KV is never written (a
    request whose token in flight is its last by length runs no further step; asking a block for it paused others for
    a block no step writes)."""
    return block_manager.blocks_needed(min(request.num_tokens + 1, request.max_num_tokens - 1))


def may_need_blocks(block_manager: BlockManager, request: Request) -> bool:
    """Whether a request's blocks may end before the position its next step writes (False: they surely do not).
    Every step asks it of every running request, an engine's and a decode node's, so blocks_for_next_step, the exact
    bound, is left for these."""
    return len(request.block_ids) * block_manager.block_size <= request.num_tokens


def move_to_paused(running: list, paused: list, holder, order: Callable) -> bool:
    """A paused holder (an engine's request, a decode node's sample) leaves running for paused, which stays oldest
    first by order; -> whether it was running (a new pause, not a paused one paused further)."""
    if holder not in running:
        return False
    running.remove(holder)
    paused.append(holder)
    paused.sort(key=order)
    return True


class GrowsOnDemand:
    """What an engine's scheduler and a decode node do alike with blocks as tokens need them: each step's blocks,
    oldest holder first, and paused holders back, oldest first. A holder is an engine's request or a decode node's
    sample (its request, its order, its `swapped` blocks): the subclass says which holders decode and how to pause
    one (pause_newest), since the engine's and the node's pauses differ (the prefix cache's chunks, the oldest kept)."""

    running: list
    paused: list
    """Oldest first."""
    block_manager: BlockManager
    swap: HostSwap
    num_preemptions: int

    def decoding(self) -> list:
        """The holders that decode (the others prefill or are paused)."""
        raise NotImplementedError

    @staticmethod
    def request_of(holder) -> Request:
        raise NotImplementedError

    @staticmethod
    def order_of(holder) -> int:
        raise NotImplementedError

    def pause_newest(self) -> bool:
        raise NotImplementedError

    def blocks_for_next_step(self, request: Request) -> int:
        return blocks_for_next_step(self.block_manager, request)

    def grow_running(self) -> set[int]:
        """Each decoding holder, oldest first, gets its next step's blocks, pausing the newest where none are free;
        then a block is kept free (or on its way back) for each decoding holder, so that the next steps' blocks do not
        wait for a copy. -> the ids of the holders left without their next step's blocks (they wait a step).
        NOTE: every step, so only the holders whose blocks may end before the position their next step writes are
        looked at further: on this repository's 2-core host, 256 decoding requests cost 0.44-0.56 ms a step when each
        was, 0.20-0.24 ms since (benchmarks/results/cpu_swap_host_time_*.json)."""
        short = set()
        decoding, num_preemptions = self.decoding(), self.num_preemptions
        needing = [h for h in decoding if may_need_blocks(self.block_manager, self.request_of(h))]
        for holder in sorted(needing, key=self.order_of):
            request = self.request_of(holder)
            needed = self.blocks_for_next_step(request) - len(request.block_ids)
            while needed > 0 and holder in self.running:
                if self.block_manager.num_free_blocks == 0 and (self.swap.blocks_in_copy >= needed or
                                                                 not self.pause_newest()):
                    break  # NOTE: blocks on their way back from a copy (or held by a node's pulls): it waits a step
                free = self.block_manager.num_free_blocks
                if holder not in self.running or free == 0:
                    break  # NOTE: it was the newest and paused itself; or its blocks come back when the copy ends
                new = self.block_manager.allocate(min(needed, free) * self.block_manager.block_size)
                request.block_ids = request.block_ids + new  # NOTE: replaced, never mutated (step_inputs caches it)
                needed -= len(new)
            if needed > 0:
                short.add(id(holder))
        # NOTE: the list is built again only where a pause changed it (a list of every decoding holder, each step)
        num_decoding = len(decoding) if self.num_preemptions == num_preemptions else len(self.decoding())
        while self.block_manager.num_free_blocks + self.swap.blocks_in_copy < num_decoding and self.pause_newest():
            num_decoding = len(self.decoding())
        return short

    def resume_paused(self) -> None:
        """Paused holders, oldest first, while the cache has room for their blocks, their next step's and a block for
        each decoding holder's next (grow_running's reserve, lest it pause one at once): copied back (queued before
        the step that reads them)."""
        while self.paused:
            holder = self.paused[0]
            request, swapped = self.request_of(holder), holder.swapped
            held = len(request.block_ids) + swapped.num_blocks
            wanted = swapped.num_blocks + max(0, self.blocks_for_next_step(request) - held) + \
                len(self.decoding()) + 1
            if self.block_manager.num_free_blocks < wanted:
                return
            self.swap.resume(request, swapped, self.block_manager)
            holder.swapped = None
            self.running.append(self.paused.pop(0))


class SwapPreemption(GrowsOnDemand):
    """A part of Scheduler (corun/scheduler.py): its running and paused requests (paused oldest first, by
    Request.admission_order), its block manager and its HostSwap. Its holders are the requests themselves."""

    running: list[Request]
    paused: list[Request]
    block_manager: BlockManager
    swap: HostSwap | None
    num_preemptions: int
    chunks_let_go_after_copy: list
    """(HostCopy, the prefix-cache chunks a paused request held): let go once that copy has read their blocks."""

    @property
    def grows_on_demand(self) -> bool:
        return self.swap is not None and self.swap.capacity_blocks > 0

    # --- admission --------------------------------------------------------------------------------------------
    def admission_tokens(self, request: Request) -> int:
        """The tokens a request gets blocks for when admitted: its prompt and token 1, or (no swap space) its whole
        sequence."""
        if not self.grows_on_demand:
            return request.max_num_tokens
        return min(request.num_prompt_tokens + 1, request.max_num_tokens)

    def may_admit(self, request: Request) -> bool:
        """With a swap space: nothing paused (it comes back first), the whole sequences within the cache and the swap
        space, and after the prompt's blocks, a block free for each decoding request's next step and for the most
        any admitted request may still grow by (see the module's note)."""
        if not self.grows_on_demand:
            return True
        if self.paused:
            return False
        whole = self.whole_blocks
        if sum(map(whole, self.running)) + whole(request) > self.block_manager.num_usable_blocks + \
                self.swap.capacity_blocks:
            return False
        prompt_blocks = self.block_manager.blocks_needed(self.admission_tokens(request))
        most_growth = max([whole(request) - prompt_blocks, *map(self.growth_left, self.running)])
        decoding = sum(not r.is_prefilling for r in self.running)
        return self.block_manager.num_free_blocks - prompt_blocks >= most_growth + decoding

    def whole_blocks(self, request: Request) -> int:
        return self.block_manager.blocks_needed(request.max_num_tokens)

    def growth_left(self, request: Request) -> int:
        swapped = request.swapped.num_blocks if request.swapped is not None else 0
        return self.whole_blocks(request) - len(request.block_ids) - swapped

    # --- before each step -------------------------------------------------------------------------------------
    def prepare_blocks(self) -> list[Request]:
        """Blocks copied out go back to the pool, paused requests come back where they fit, and every decoding
        request gets the blocks its next step writes (the newest paused where the cache has none); -> the decoding
        requests whose blocks hold what the next step writes (one may wait a step for blocks on their way back from a
        copy)."""
        if not self.grows_on_demand:
            return self.decoding()
        self.free_copied()
        self.resume_paused()
        short = self.grow_running()
        return [r for r in self.decoding() if id(r) not in short]

    def decoding(self) -> list[Request]:
        return [r for r in self.running if not r.is_prefilling]

    @staticmethod
    def request_of(holder: Request) -> Request:
        return holder

    @staticmethod
    def order_of(holder: Request) -> int:
        return holder.admission_order

    # --- pause and resume -------------------------------------------------------------------------------------
    def pause_newest(self) -> bool:
        """Pause the newest decoding or paused request holding blocks, never the oldest admitted one: all its blocks
        where the swap space has room for them (the prefix cache's chunks it holds are let go once copied), else its
        own trailing ones (as many as the swap space takes), are copied to host memory and come back to the pool when
        the copy ends; -> whether any was."""
        admitted = [*self.running, *self.paused]
        if self.swap.room == 0 or len(admitted) < 2:
            return False
        oldest = min(admitted, key=self.order_of)
        victims = [r for r in admitted if r is not oldest and not r.is_prefilling and self.pausable_blocks(r)]
        if not victims:
            return False
        victim = max(victims, key=self.order_of)
        victim.swapped = self.swap.pause_tail(victim, self.pausable_blocks(victim), victim.swapped)
        if not victim.block_ids and victim.cached_chunks:
            # NOTE: the chunks' blocks may be reused only once the copy (its newest part: first) has read them
            self.chunks_let_go_after_copy.append((victim.swapped.parts[0], victim.cached_chunks))
            victim.cached_chunks = []
        self.num_preemptions += move_to_paused(self.running, self.paused, victim, self.order_of)
        self.free_copied()  # NOTE: on CPU the copy is complete already
        return True

    def pausable_blocks(self, request: Request) -> int:
        """All its blocks if the swap space holds them, else its own trailing ones (after the last prefix-cache
        chunk it holds), as many as the swap space takes.
        NOTE: with only its own blocks paused, a request kept its prompt's chunks in the cache, and on an H100 with a
        12 GB cache (8B shape, 1024x2048) the paused requests' prompts left ~10 rows running (1,127 tok/s against
        2,880 without a swap space)."""
        room = self.swap.room
        if len(request.block_ids) <= room:
            return len(request.block_ids)
        shared = {b for chunk in request.cached_chunks for b in chunk.block_ids}
        own = 0
        for block in reversed(request.block_ids):
            if block in shared:
                break
            own += 1
        return min(own, room)

    def free_copied(self) -> None:
        """The blocks whose copies to host memory have completed go back to the pool: a request's own freed, the
        prefix cache's chunks it held let go."""
        copied = set(self.swap.copied_blocks())
        if not copied:
            return
        self.block_manager.free([b for b in copied if b in self.block_manager.allocated_block_ids])
        pending = []
        for part, chunks in self.chunks_let_go_after_copy:
            if part.done():
                self.block_manager.let_go(chunks)
            else:
                pending.append((part, chunks))
        self.chunks_let_go_after_copy = pending

    def forget_paused(self, request: Request) -> None:
        """A paused request ends (its token in flight finished it, or an abort): its host copy is dropped (its blocks
        still in copy go back to the pool when the copy ends)."""
        self.paused.remove(request)
        if request.swapped is not None:
            self.swap.drop(request.swapped)
            request.swapped = None
