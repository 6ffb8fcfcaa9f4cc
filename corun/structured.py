"""Structured outputs on a node: the constraint compiled with xgrammar, and each constrained row's next-token bitmask.

The contract: a row's mask is a function of its request's constraint and its own output so far. Each request has a
grammar matcher advanced by its own tokens (GrammarState.advance_to replays the output tokens it has not consumed,
so a decode node rebuilds the state from the first token the prefill node sampled, which travels in the
DecodeRequest); the mask is applied to that row only, before logprobs and sampling (as vLLM), and a row without a
constraint is left untouched. Tokens other rows sample never reach a row's matcher.

When the grammar is complete, only the request's stop tokens are allowed (xgrammar's stop tokens are overridden
with the request's own: its stop_token_ids and EOS), so the request ends on EOS.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import cache

import torch
from torch import Tensor

from corun.fair_workers import FairWorkers
from wire.structured import StructuredOutput, invalid_constraint

logger = logging.getLogger(__name__)
MAX_CACHED_GRAMMARS = 256
BITS_PER_WORD = 32
COMPILE_THREADS = max(1, min(4, (os.cpu_count() or 2) // 2))
"""Threads compiling constraints off a node's loop (vLLM's rule: half the cores, here at most 4). xgrammar releases
the GIL while it compiles (a 10 s compile on a worker thread left the main thread at most 7 ms between turns on this
repository's 2-core host), so the loop runs on. Where there are several, one client's large schema does not hold
another's constrained request behind it; on a 2-core host there is one (the other core runs the loop)."""
SPARE_COMPILE_AFTER_S = 2.0
"""Once every compile thread has compiled one constraint this long, a client with no compile running gets a spare
thread for its next one (corun/fair_workers.py): a compile cannot be interrupted, and one client's schema that takes
minutes would otherwise hold every other client's constrained requests behind it."""
MAX_SPARE_COMPILES = 4


class GrammarError(ValueError):
    """The constraint does not compile (a bad schema, regex or grammar): the request is refused with a 400.
    constraint_reason: the grammar library's reason where the constraint itself is at fault (None: the model's)."""

    def __init__(self, message: str, constraint_reason: str | None = None):
        super().__init__(message)
        self.constraint_reason = constraint_reason


def num_bitmask_words(vocab_size: int) -> int:
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


BATCH_FILL_ROWS = 8
"""From this many constrained rows on, xgrammar's BatchGrammarMatcher fills their masks (threads over rows)."""


def apply_token_bitmask(logits: Tensor, bitmask: Tensor) -> Tensor:
    """logits [rows, vocab] float32, bitmask int32 [rows, words] on the CPU (bit j of word w: token 32 w + j allowed)
    -> logits with disallowed tokens at -inf (a new tensor). Only rows with some bit 0 are touched (xgrammar's
    kernel, CPU or CUDA): the others are copied bit for bit."""
    constrained = (bitmask != -1).any(dim=1).nonzero().flatten().tolist()
    if not constrained:
        return logits
    import xgrammar

    masked = logits.clone()
    xgrammar.apply_token_bitmask_inplace(masked, bitmask.to(logits.device, non_blocking=True), indices=constrained)
    return masked


@dataclass
class GrammarState:
    """One request's matcher and how many of its output tokens it has consumed."""

    matcher: object  # xgrammar.GrammarMatcher
    num_consumed: int = 0

    def advance_to(self, output_token_ids: Sequence[int], request_id: str) -> None:
        for token_id in output_token_ids[self.num_consumed:]:
            # NOTE: a refused token (min_tokens banning EOS, say) leaves the matcher where it was: the mask stays a
            # function of the output so far.
            if not self.matcher.is_terminated() and not self.matcher.accept_token(token_id):
                logger.warning("request %s: token %d does not follow its grammar", request_id, token_id)
            self.num_consumed += 1


class Grammars:
    """A model's grammar compiler (per vocabulary size), compiled constraints (LRU) and each request's state."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self._compilers: dict[int, object] = {}
        self._compiled: OrderedDict[tuple[StructuredOutput, int], object] = OrderedDict()
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        """Guards the compiled cache only: never held while a constraint compiles, so that a step's sampler, which
        looks up its requests' grammars, does not wait for a compile on a worker thread."""
        self._compiler_lock = threading.Lock()
        self._workers: FairWorkers | None = None
        self._pending: dict[tuple[StructuredOutput, int], PendingCompile] = {}
        """Compiles queued or running: requests with the same constraint share one (an evaluation sends every request
        with the same schema)."""
        self._batch = None

    def compiler(self, vocab_size: int):
        with self._compiler_lock:  # NOTE: the first build loads the tokenizer (seconds): once per vocabulary size
            if vocab_size not in self._compilers:
                self._compilers[vocab_size] = self.build_compiler(vocab_size)
            return self._compilers[vocab_size]

    def build_compiler(self, vocab_size: int):
        import transformers
        import xgrammar

        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        except (OSError, ValueError) as error:  # NOTE: random-weight presets have no tokenizer
            raise GrammarError(f"structured outputs need the model's tokenizer: {first_line(error)}") from None
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        return xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, spec: StructuredOutput, vocab_size: int):
        """The compiled constraint (cached); GrammarError when it does not compile. Blocks while it compiles: a
        node's loop uses compile_later."""
        key = (spec, vocab_size)
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                return self._compiled[key]
        compiler = self.compiler(vocab_size)
        try:
            compiled = compile_spec(compiler, spec)
        except (RuntimeError, ValueError, TypeError) as error:
            reason = first_line(error)
            raise GrammarError(invalid_constraint(spec.kind, reason), constraint_reason=reason) from None
        with self._lock:
            self._compiled[key] = compiled
            while len(self._compiled) > MAX_CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        return compiled

    def compile_later(self, spec: StructuredOutput, vocab_size: int, tenant: str = "") -> Future:
        """compile() on a worker thread, tenant's compiles taking turns with the other tenants' (corun/fair_workers.py):
        -> its future (done at once where the constraint is cached; the one already queued or running for the same
        constraint)."""
        key = (spec, vocab_size)
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is not None:
                done: Future = Future()
                done.set_result(compiled)
                return done
            pending = self._pending.get(key)
            if pending is not None:
                pending.num_waiting += 1
                return pending.future
            if self._workers is None:
                self._workers = FairWorkers(COMPILE_THREADS, "grammar-compile", SPARE_COMPILE_AFTER_S,
                                            MAX_SPARE_COMPILES)
            pending = self._pending[key] = PendingCompile(
                self._workers.submit(tenant, self.compile_pending, spec, vocab_size))
            return pending.future

    def give_up(self, spec: StructuredOutput, vocab_size: int, future: Future) -> None:
        """A waiter on compile_later's future leaves (its request aborted, its node closed): a compile nobody waits
        for any more that has not started is cancelled, so that it takes no turn of the compile threads."""
        key = (spec, vocab_size)
        with self._lock:
            pending = self._pending.get(key)
            if pending is None or pending.future is not future:
                return
            pending.num_waiting -= 1
            if pending.num_waiting == 0 and future.cancel():
                del self._pending[key]

    def compile_pending(self, spec: StructuredOutput, vocab_size: int):
        """compile(), on a worker thread, for compile_later. NOTE: cached (by compile) before it stops being pending,
        so a request arriving in between finds one or the other."""
        try:
            return self.compile(spec, vocab_size)
        finally:
            with self._lock:
                del self._pending[(spec, vocab_size)]

    def bind(self, request, compiled) -> None:
        """Give request its matcher of the compiled constraint now, so that its steps never compile (the cache may
        have let the constraint go by then)."""
        self._states[request] = GrammarState(self.new_matcher(request, compiled))

    @staticmethod
    def new_matcher(request, compiled):
        import xgrammar

        stop_ids = sorted(request.stop_token_ids)
        return xgrammar.GrammarMatcher(compiled, override_stop_tokens=stop_ids or None)

    def state(self, request, vocab_size: int) -> GrammarState:
        """request's grammar state; one not bound yet (the engine's requests) compiles its constraint here."""
        if request not in self._states:
            self.bind(request, self.compile(request.params.structured, vocab_size))
        return self._states[request]

    def bitmask(self, requests: Sequence, num_rows: int, vocab_size: int) -> Tensor | None:
        """int32 [num_rows, words]: row i is requests[i]'s allowed next tokens (all ones for an unconstrained row
        or a padding row); None when no request is constrained."""
        if not any(r.params.structured is not None for r in requests):
            return None
        bitmask = torch.full((num_rows, num_bitmask_words(vocab_size)), -1, dtype=torch.int32)
        to_fill, copies = self.advance_rows(requests, bitmask, vocab_size)
        if len(to_fill) >= BATCH_FILL_ROWS:  # NOTE: each row's mask is its own matcher's, whichever thread fills it
            import xgrammar

            if self._batch is None:
                self._batch = xgrammar.BatchGrammarMatcher("auto")
            self._batch.batch_fill_next_token_bitmask(list(to_fill.values()), bitmask, list(to_fill))
        else:
            for row, matcher in to_fill.items():
                matcher.fill_next_token_bitmask(bitmask, row)
        for row, source in copies:
            bitmask[row] = bitmask[source]
        return bitmask

    def advance_rows(self, requests: Sequence, bitmask: Tensor, vocab_size: int):
        """Each constrained request's matcher advanced to its output so far -> ({row: matcher to fill}, [(row, the
        row it copies)]). NOTE: a prefill node's n samples are rows of one request: its matcher is filled once (one
        matcher is never filled by two threads). A finished grammar's row allows only the stop tokens."""
        to_fill, copies, first_rows = {}, [], {}
        for row, request in enumerate(requests):
            if request.params.structured is None:
                continue
            if id(request) in first_rows:
                copies.append((row, first_rows[id(request)]))
                continue
            first_rows[id(request)] = row
            state = self.state(request, vocab_size)
            state.advance_to(request.output_token_ids, request.request_id)
            if state.matcher.is_terminated():  # NOTE: it accepted a stop token (ignore_eos kept the request going)
                bitmask[row] = only_tokens(state.matcher.stop_token_ids, bitmask.shape[1])
            else:
                to_fill[row] = state.matcher
        return to_fill, copies


@dataclass
class PendingCompile:
    future: Future
    num_waiting: int = 1
    """compile_later's callers that wait on it and have not given up."""


def only_tokens(token_ids: Sequence[int], num_words: int) -> Tensor:
    """int32 [words]: a bitmask row allowing token_ids only."""
    bits = [0] * num_words
    for token_id in token_ids:
        bits[token_id // BITS_PER_WORD] |= 1 << (token_id % BITS_PER_WORD)
    return torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in bits], dtype=torch.int32)


def compile_spec(compiler, spec: StructuredOutput):
    """vLLM's mapping of its constraint kinds onto xgrammar's compiler (vllm/v1/structured_output/
    backend_xgrammar.py)."""
    separators = None if spec.any_whitespace else (",", ":")
    if spec.kind in ("json", "json_object"):
        schema = spec.spec if spec.kind == "json" else '{"type": "object"}'
        json.loads(schema)  # NOTE: a clear error for text that is not JSON at all
        return compiler.compile_json_schema(schema, any_whitespace=spec.any_whitespace, separators=separators)
    if spec.kind == "regex":
        return compiler.compile_regex(spec.spec)
    if spec.kind == "choice":
        return compiler.compile_grammar(spec.grammar_text())
    return compiler.compile_grammar(spec.spec)


def first_line(error: Exception) -> str:
    """xgrammar's errors start with a timestamp and a source path: keep the message."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text.split(": ", 1)[1] if text.startswith("[") and ": " in text else text


@cache
def grammars_for(model_dir: str) -> Grammars:
    """One Grammars per model directory and process: the admission check and the sampler share its cache."""
    return Grammars(model_dir)
