"""Measuring a PerformanceProfile on a real corun engine: isolated prefills by prompt length (on whatever prefill path
the engine's config resolves to: bucketed, packed or natural; the profile's source names it), N-row decode steps by
active rows and context, and the KV hand-off of a P/D request by prompt length (planner/kv_handoff.py: a NIXL READ
of the engine's KV blocks between two processes on its device)."""

from __future__ import annotations

import itertools
import random
import statistics
import time

from planner.kv_handoff import measure_kv_handoff
from planner.perf_profile import DecodePoint, KVHandoff, PerformanceProfile, PrefillPoint


def profile_engine(config, prefill_lengths=None, decode_contexts=None, decode_rows=None, num_decode_steps: int = 8,
                   repeats: int = 3, seed: int = 0, progress=None, measure_handoff: bool = True) -> PerformanceProfile:
    """Measure isolated prefills and N-row decode steps on a real corun LLMEngine built from `config`.

    prefill_lengths: prompt lengths to prefill alone (default: powers of 4 from 16, up to max_model_len - 1).
    decode_contexts x decode_rows: decode steps with that many active rows of that prompt length (default: three
    of the prefill lengths x {1, N/2, N}); combinations whose KV does not fit are skipped. A decode context leaves
    room for the steps it is timed over: at most max_model_len - num_decode_steps - 3.
    progress: called with one line per measurement (they can take minutes on a large model).
    measure_handoff: time the KV hand-off at the prefill lengths (False: the profile takes it as zero, and says so).
    """
    from corun.device_facts import resolved_on_device
    from corun.engine import LLMEngine

    if config.scheduler.mode != "fixed_shape":
        raise ValueError(f"the planner models fixed_shape mode; got mode {config.scheduler.mode!r}")
    config = resolved_on_device(config)  # NOTE: N, the lengths and the dtype as the engine will run them
    sched = config.scheduler
    prefill_lengths = sorted(set(prefill_lengths or default_lengths(sched.max_model_len)))
    if prefill_lengths[0] < 1 or prefill_lengths[-1] >= sched.max_model_len:
        raise ValueError(f"prefill lengths must be in [1, max_model_len - 1 = {sched.max_model_len - 1}]")
    longest_context = sched.max_model_len - num_decode_steps - 3
    if decode_contexts is None:
        decode_contexts = [min(length, longest_context) for length in
                           prefill_lengths[:: max(1, len(prefill_lengths) // 3)]]
    decode_contexts = sorted(set(decode_contexts))
    if decode_contexts[0] < 1 or decode_contexts[-1] > longest_context:
        raise ValueError(f"decode contexts must be in [1, max_model_len - {num_decode_steps + 3} = {longest_context}] "
                         f"(each is timed over {num_decode_steps} more tokens), got {decode_contexts[-1]}")
    decode_rows = sorted(set(decode_rows or (1, max(1, sched.max_num_seqs // 2), sched.max_num_seqs)))
    report = progress or (lambda line: None)
    report(f"building the engine ({config.model}, {config.dtype} on {config.device})")
    engine = LLMEngine(config)
    measure = EngineMeasurer(engine, random.Random(seed))
    measure.prefill(prefill_lengths[0])  # NOTE: warm-up (kernel compilation, allocator) outside the points
    prefill_points = []
    for i, length in enumerate(prefill_lengths, 1):
        prefill_points.append(measure.prefill(length, repeats))
        report(f"prefill {i}/{len(prefill_lengths)}: {length} tokens, {prefill_points[-1].seconds * 1e3:.1f} ms")
    shapes = [(rows, context) for context in decode_contexts for rows in decode_rows
              if measure.fits(rows, context + measure.decode_max_tokens(rows, context, num_decode_steps))]
    decode_points = []
    for i, (rows, context) in enumerate(shapes, 1):
        decode_points.append(measure.decode_step(rows, context, num_decode_steps))
        report(f"decode step {i}/{len(shapes)}: {rows} rows of {context} tokens, "
               f"{decode_points[-1].seconds * 1e3:.1f} ms")
    if not decode_points:
        raise ValueError("no decode measurement fits the KV cache; lower decode_rows or decode_contexts")
    kv_handoff = engine_kv_handoff(engine, prefill_lengths, seed, report) if measure_handoff else \
        KVHandoff(source="not measured (profile_engine asked not to); taken as zero")
    resolved = engine.config.scheduler  # NOTE: 'auto' settings as the engine resolved them on its device
    return PerformanceProfile(
        max_num_seqs=sched.max_num_seqs, prefill_chunk_size=resolved.prefill_chunk_size,
        prefill_points=tuple(prefill_points), decode_points=tuple(decode_points),
        kv_capacity_tokens=engine.block_manager.num_usable_blocks * config.cache.block_size,
        swap_capacity_tokens=(engine.scheduler.swap.capacity_blocks if engine.scheduler.swap else 0) *
        config.cache.block_size,
        max_model_len=sched.max_model_len, block_size=config.cache.block_size,
        source=f"profile_engine: {config.model} {config.dtype} on {config.device}, prefill path "
               f"{engine.runner.prefill_path}",
        prefill_token_budget=resolved.decode_wait_tokens, kv_handoff=kv_handoff)


def engine_kv_handoff(engine, prompt_lens: list[int], seed: int, report) -> KVHandoff:
    """The hand-off of the engine's KV blocks (its cache's block shape and dtype, on its device)."""
    kv = engine.runner.kv_cache.data  # [num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]
    handoff = measure_kv_handoff(kv.shape[1:], kv.dtype, engine.config.device, engine.config.cache.block_size,
                                 prompt_lens, seed=seed, progress=report)
    report(f"KV hand-off: {handoff.source}")
    return handoff


def default_lengths(max_model_len: int) -> list[int]:
    lengths = [4**k for k in range(2, 12) if 4**k < max_model_len]
    return sorted(set(lengths + [max_model_len - 1]))


class EngineMeasurer:
    """Timed engine steps for one idle engine (each measurement leaves it idle again)."""

    def __init__(self, engine, rng: random.Random):
        self.engine = engine
        self.rng = rng
        self.request_ids = itertools.count()

    def fits(self, num_rows: int, num_tokens: int) -> bool:
        manager = self.engine.block_manager
        return num_rows <= self.engine.config.scheduler.max_num_seqs and \
            num_rows * manager.blocks_needed(num_tokens) <= manager.num_usable_blocks

    def add(self, prompt_len: int, max_tokens: int):
        from wire.sampling_params import SamplingParams

        vocab = self.engine.runner.model.cfg.vocab_size
        request_id = f"profile-{next(self.request_ids)}"
        return self.engine.add_request(request_id, [self.rng.randrange(vocab) for _ in range(prompt_len)],
                                       SamplingParams(temperature=0.6, seed=0, max_tokens=max_tokens, ignore_eos=True))

    def prefill(self, prompt_len: int, repeats: int = 1) -> PrefillPoint:
        """Median time of an isolated prefill (max_tokens=1: it finishes with token 1)."""
        samples = []
        for _ in range(repeats):
            self.add(prompt_len, max_tokens=1)
            start = time.perf_counter()
            while self.engine.has_unfinished():
                self.engine.step()
            samples.append(time.perf_counter() - start)
        return PrefillPoint(prompt_len, statistics.median(samples))

    def decode_max_tokens(self, num_rows: int, prompt_len: int, num_steps: int) -> int:
        """max_tokens that keeps every row alive until its timed steps end: token 1, a warm-up step, num_steps timed
        steps, and the decode steps the engine runs while the rows are still being prefilled (with a prefill token
        budget it decodes the rows prefilled first between packs: one step per budget's worth of prompt tokens),
        capped by the context left."""
        budget = self.engine.config.scheduler.decode_wait_tokens
        fill_steps = -(-num_rows * prompt_len // budget) if budget else 0
        longest = self.engine.config.scheduler.max_model_len - prompt_len
        return min(longest, num_steps + 3 + fill_steps)

    def decode_step(self, num_rows: int, prompt_len: int, num_steps: int) -> DecodePoint:
        """Median time of the N-row decode step with num_rows active rows of about prompt_len context (sum_context:
        what they held when timed, the tokens decoded while the later rows were prefilled included)."""
        max_tokens = self.decode_max_tokens(num_rows, prompt_len, num_steps)
        requests = [self.add(prompt_len, max_tokens) for _ in range(num_rows)]
        while any(r.is_prefilling or not r.output_token_ids for r in requests):
            self.engine.step()
        self.engine.step()  # NOTE: warm-up step (first use of this context window)
        samples, contexts = [], []
        for _ in range(num_steps):
            contexts.append(sum(r.num_tokens for r in requests))
            start = time.perf_counter()
            sampled = self.engine.step()
            samples.append(time.perf_counter() - start)
            if len(sampled) != num_rows:  # NOTE: a row that ended early would time a smaller step under this name
                raise RuntimeError(f"a decode step meant for {num_rows} rows of {prompt_len} tokens sampled "
                                   f"{len(sampled)} (max_tokens {max_tokens})")
        for request in requests:
            self.engine.abort_request(request)
        while self.engine.has_unfinished():  # NOTE: the step launched ahead (async scheduling) is read and dropped
            self.engine.step()
        return DecodePoint(num_rows, round(statistics.mean(contexts)), statistics.median(samples))
