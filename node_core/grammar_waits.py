"""Constrained requests that wait on a node while their grammar compiles on a worker thread.

A node checks a request as it arrives, but compiling its structured-output constraint can take seconds: the process's
first compile also loads the tokenizer (2.45 s on this repository's 2-core host), and a large schema takes seconds
of its own. Inside the loop that held every running request's steps and the node's pings (under load the router
gave the node up: a 503). So the constraint compiles off the loop (Grammars.compile_later, as vLLM's structured
output manager does) and the request waits here; each turn the node takes what has finished: compiled -> the node's
queue (each of its requests bound to the grammar, so no step compiles), refused -> a 400 (NodeServer.drop_refused).
A decode node's job is in its queues meanwhile too: its KV is claimed and read while the grammar compiles, and it
runs once both are done. What a request samples does not depend on when its grammar was ready.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generic, TypeVar

from corun.request import Request
from corun.scheduler import RequestRejected
from corun.structured import GrammarError, grammars_for
from wire.structured import StructuredOutput

Item = TypeVar("Item")
"""What the node queues once the grammar is ready (a decode node's job, a prefill node's pending prompt, ...)."""


@dataclass
class Compiling(Generic[Item]):
    item: Item
    router: bytes
    """Who is told if the constraint does not compile."""
    request_id: str
    spec: StructuredOutput
    requests: list[Request]
    """Whose grammar state starts from the compiled constraint (a request's samples, each a Request of its own)."""
    compiled: Future


class GrammarWaits(Generic[Item]):
    def __init__(self, model_dir: str, vocab_size: int):
        self.grammars = grammars_for(model_dir)
        self.vocab_size = vocab_size
        self.compiling: list[Compiling[Item]] = []

    def add(self, item: Item, router: bytes, request_id: str, spec: StructuredOutput, requests: list[Request],
            tenant: str = "") -> None:
        """tenant: the router's client of the request, whose compiles take turns with other clients'."""
        self.compiling.append(Compiling(item, router, request_id, spec, requests,
                                        self.grammars.compile_later(spec, self.vocab_size, tenant)))

    def take_finished(self) -> tuple[list[Item], list[tuple[Compiling[Item], RequestRejected]]]:
        """-> (the items whose grammar compiled, in arrival order; each whose constraint does not compile, with its
        refusal)."""
        ready: list[Item] = []
        refused: list[tuple[Compiling[Item], RequestRejected]] = []
        still: list[Compiling[Item]] = []
        for entry in self.compiling:
            if not entry.compiled.done():
                still.append(entry)
                continue
            try:
                compiled = entry.compiled.result()
            except GrammarError as error:
                refused.append((entry, RequestRejected(f"request {entry.request_id}: {error}",
                                                       constraint_reason=error.constraint_reason)))
                continue
            for request in entry.requests:
                self.grammars.bind(request, compiled)
            ready.append(entry.item)
        self.compiling = still
        return ready, refused

    def remove(self, item: Item) -> None:
        """An aborted request: its compile is cancelled if it has not started and no other request waits for it (one
        running goes on, and is cached)."""
        leaving = [entry for entry in self.compiling if entry.item is item]
        self.compiling = [entry for entry in self.compiling if entry.item is not item]
        for entry in leaving:
            self.grammars.give_up(entry.spec, self.vocab_size, entry.compiled)

    def close(self) -> None:
        """The node stops: nobody waits for its compiles."""
        for entry in self.compiling:
            self.grammars.give_up(entry.spec, self.vocab_size, entry.compiled)
        self.compiling = []

    def items(self) -> list[Item]:
        return [entry.item for entry in self.compiling]

    def holds(self, request_id: str) -> bool:
        return any(entry.request_id == request_id for entry in self.compiling)

    def __len__(self) -> int:
        return len(self.compiling)
