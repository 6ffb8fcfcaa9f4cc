"""When a launcher starts a dead node again: at once after a long run, after doubling waits when it keeps dying
soon after starting, never again after too many such deaths in a row (it is broken: a bad flag, a port taken,
a model that does not load), with one line saying why."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Literal

logger = logging.getLogger(__name__)

Decision = Literal["restart", "wait", "give_up"]


@dataclass
class NodeHistory:
    started_at: float
    quick_exits: int = 0
    """Consecutive exits within RestartPolicy.quick_exit_s of starting."""
    next_restart_at: float = 0.0
    gave_up: bool = False


@dataclass
class RestartPolicy:
    quick_exit_s: float = 10.0
    """An exit this soon after starting counts as a failure to start."""
    first_wait_s: float = 0.5
    max_wait_s: float = 30.0
    max_quick_exits: int = 5
    nodes: dict[str, NodeHistory] = field(default_factory=dict)

    def started(self, name: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        history = self.nodes.setdefault(name, NodeHistory(now))
        history.started_at = now

    def decide(self, name: str, exit_reason: str, now: float | None = None) -> Decision:
        """For a node found dead: restart it now, wait (backoff), or give up (logged once, with why)."""
        now = time.monotonic() if now is None else now
        history = self.nodes.setdefault(name, NodeHistory(float("-inf")))  # NOTE: never seen start: long ago
        if history.gave_up:
            return "give_up"
        if history.next_restart_at == 0.0:  # NOTE: first seen dead since its last start
            quick = now - history.started_at < self.quick_exit_s
            history.quick_exits = history.quick_exits + 1 if quick else 0
            if history.quick_exits >= self.max_quick_exits:
                history.gave_up = True
                logger.error("giving up on %s: it exited %d times in a row within %g s of starting (last: %s)",
                             name, history.quick_exits, self.quick_exit_s, exit_reason)
                return "give_up"
            wait = 0.0 if not history.quick_exits else min(self.max_wait_s,
                                                           self.first_wait_s * 2 ** (history.quick_exits - 1))
            history.next_restart_at = now + wait
            if wait:
                logger.warning("%s exited (%s) %.1f s after starting; starting it again in %.1f s", name, exit_reason,
                               now - history.started_at, wait)
        if now < history.next_restart_at:
            return "wait"
        history.next_restart_at = 0.0
        return "restart"
