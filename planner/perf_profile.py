"""Performance profiles for the capacity planner: measured points, fitted cost models, measurement on an engine.

A profile holds what was measured on one engine configuration:
  prefill points  (prompt length L, seconds of its isolated prefill, chunked as the engine chunks it);
  decode points   (active rows, total context of the active rows, seconds of one N-row decode step).
Fitted models (weighted by 1/time, so short prompts count as much as long ones; coefficients kept >= 0, so the
fits are monotone):
  prefill chunk of n tokens after a prefix of p:  a + b*n + c*n*(n + 2p)
    -> a prompt of L tokens in k chunks costs k*a + b*L + c*L^2 (the attention term telescopes over chunks);
  decode step at fixed N:  a + b*sum_context (the GEMMs, sampler and host work cost the same for 1 or N busy
    rows; only attention reads the active rows' KV).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wire.config import CacheConfig


@dataclass(frozen=True)
class PrefillPoint:
    prompt_len: int
    seconds: float
    """Isolated prefill of the whole prompt (all its chunks), token 1 sampled."""


@dataclass(frozen=True)
class DecodePoint:
    num_rows: int
    """Active (non-padding) rows of the N-row step."""
    sum_context: int
    """Tokens attended, summed over the active rows."""
    seconds: float


@dataclass(frozen=True)
class PerformanceProfile:
    max_num_seqs: int
    """N the decode steps were measured at (the step shape; a plan must use the same N)."""
    prefill_chunk_size: int
    prefill_points: tuple[PrefillPoint, ...]
    decode_points: tuple[DecodePoint, ...]
    kv_capacity_tokens: int | None = None
    """KV tokens of one instance of the profiled engine (the planner's default)."""
    max_model_len: int | None = None
    block_size: int = CacheConfig.block_size
    source: str = ""
    """How the points were obtained (engine, device, file names)."""

    def __post_init__(self):
        if min(self.max_num_seqs, self.prefill_chunk_size, self.block_size) < 1:
            raise ValueError("max_num_seqs, prefill_chunk_size and block_size must be >= 1")
        if not self.prefill_points or not self.decode_points:
            raise ValueError("a profile needs prefill points and decode points")
        if any(p.prompt_len < 1 or p.seconds <= 0 for p in self.prefill_points):
            raise ValueError("prefill points need prompt_len >= 1 and seconds > 0")
        if any(not 1 <= p.num_rows <= self.max_num_seqs or p.sum_context < 0 or p.seconds <= 0
               for p in self.decode_points):
            raise ValueError(f"decode points need 1 <= num_rows <= {self.max_num_seqs}, sum_context >= 0 and "
                             "seconds > 0")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PerformanceProfile:
        try:
            fields = dict(data)
            fields["prefill_points"] = tuple(PrefillPoint(**p) for p in data["prefill_points"])
            fields["decode_points"] = tuple(DecodePoint(**p) for p in data["decode_points"])
            return cls(**fields)
        except (KeyError, TypeError) as error:
            raise ValueError(f"not a performance profile: {error}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> PerformanceProfile:
        return cls.from_dict(json.loads(Path(path).read_text()))


@dataclass(frozen=True)
class PrefillModel:
    a: float
    """Seconds per chunk (launches, sampling, host work)."""
    b: float
    """Seconds per prompt token (the GEMMs)."""
    c: float
    """Seconds per unit of n*(n + 2p) (attention of a chunk over its prefix and itself)."""
    chunk_size: int

    def seconds(self, prompt_lens) -> np.ndarray:
        lengths = np.asarray(prompt_lens, dtype=float)
        num_chunks = np.ceil(lengths / self.chunk_size)
        return self.a * num_chunks + self.b * lengths + self.c * lengths**2


@dataclass(frozen=True)
class DecodeStepModel:
    a: float
    """Seconds of the fixed N-row step with no context (GEMMs, sampler, host work)."""
    b: float
    """Seconds per attended token, summed over the active rows."""
    max_num_seqs: int

    def seconds(self, sum_context) -> np.ndarray:
        return self.a + self.b * np.asarray(sum_context, dtype=float)


@dataclass(frozen=True)
class PerformanceModel:
    prefill: PrefillModel
    decode: DecodeStepModel
    prefill_max_rel_error: float
    decode_max_rel_error: float

    @classmethod
    def fit(cls, profile: PerformanceProfile) -> PerformanceModel:
        prefill, prefill_error = fit_prefill(profile.prefill_points, profile.prefill_chunk_size)
        decode, decode_error = fit_decode(profile.decode_points, profile.max_num_seqs)
        return cls(prefill, decode, prefill_error, decode_error)

    def with_chunk_size(self, chunk_size: int) -> PerformanceModel:
        return dataclasses.replace(self, prefill=dataclasses.replace(self.prefill, chunk_size=chunk_size))

    def summary(self) -> dict:
        return {"prefill": {"per_chunk_s": self.prefill.a, "per_token_s": self.prefill.b,
                            "per_attention_pair_s": self.prefill.c, "chunk_size": self.prefill.chunk_size,
                            "max_rel_error": round(self.prefill_max_rel_error, 4)},
                "decode_step": {"fixed_s": self.decode.a, "per_context_token_s": self.decode.b,
                                "max_num_seqs": self.decode.max_num_seqs,
                                "max_rel_error": round(self.decode_max_rel_error, 4)}}


def fit_prefill(points, chunk_size: int) -> tuple[PrefillModel, float]:
    lengths = np.array([p.prompt_len for p in points], dtype=float)
    if len(set(lengths)) < 2:
        raise ValueError("the prefill fit needs points at two or more prompt lengths")
    features = [np.ceil(lengths / chunk_size), lengths, lengths**2]
    # NOTE: a quadratic through two lengths is underdetermined; with fewer than three, prefill is linear.
    if len(set(lengths)) < 3:
        features[2] = np.zeros_like(lengths)
    coefs, error = fit_nonnegative(np.stack(features, axis=1), np.array([p.seconds for p in points]))
    return PrefillModel(*coefs, chunk_size=chunk_size), error


def fit_decode(points, max_num_seqs: int) -> tuple[DecodeStepModel, float]:
    contexts = np.array([p.sum_context for p in points], dtype=float)
    if len(set(contexts)) < 2:
        raise ValueError("the decode fit needs steps at two or more total contexts")
    coefs, error = fit_nonnegative(np.stack([np.ones_like(contexts), contexts], axis=1),
                                   np.array([p.seconds for p in points]))
    return DecodeStepModel(*coefs, max_num_seqs=max_num_seqs), error


def fit_nonnegative(features: np.ndarray, seconds: np.ndarray) -> tuple[list[float], float]:
    """Least squares of relative errors with every coefficient >= 0: the best unconstrained fit over each subset
    of the (at most three) columns, kept if non-negative. Returns the coefficients and the max relative error."""
    weighted = features / seconds[:, None]
    scale = np.abs(weighted).max(axis=0)
    scale[scale == 0] = 1.0
    best, best_residual = None, np.inf
    num_columns = features.shape[1]
    for size in range(1, num_columns + 1):
        for columns in itertools.combinations(range(num_columns), size):
            if not weighted[:, columns].any():
                continue
            solution = np.linalg.lstsq(weighted[:, columns] / scale[list(columns)], np.ones(len(seconds)),
                                       rcond=None)[0] / scale[list(columns)]
            if (solution < 0).any():
                continue
            coefs = np.zeros(num_columns)
            coefs[list(columns)] = solution
            residual = float(np.sum((weighted @ coefs - 1.0) ** 2))
            if residual < best_residual - 1e-15:
                best, best_residual = coefs, residual
    if best is None:
        raise ValueError("no non-negative fit of the profile points")
    return [float(c) for c in best], float(np.max(np.abs(features @ best / seconds - 1.0)))


def profile_engine(config, prefill_lengths=None, decode_contexts=None, decode_rows=None, num_decode_steps: int = 8,
                   repeats: int = 3, seed: int = 0, progress=None) -> PerformanceProfile:
    """Measure isolated prefills and N-row decode steps on a real corun LLMEngine built from `config`.

    prefill_lengths: prompt lengths to prefill alone (default: powers of 4 from 16, up to max_model_len - 1).
    decode_contexts x decode_rows: decode steps with that many active rows of that prompt length (default: three
    of the prefill lengths x {1, N/2, N}); combinations whose KV does not fit are skipped. A decode context leaves
    room for the steps it is timed over: at most max_model_len - num_decode_steps - 3.
    progress: called with one line per measurement (they can take minutes on a large model).
    """
    from corun.engine import LLMEngine

    if config.scheduler.mode != "fixed_shape":
        raise ValueError(f"the planner models fixed_shape mode; got mode {config.scheduler.mode!r}")
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
              if measure.fits(rows, context + num_decode_steps + 3)]
    decode_points = []
    for i, (rows, context) in enumerate(shapes, 1):
        decode_points.append(measure.decode_step(rows, context, num_decode_steps))
        report(f"decode step {i}/{len(shapes)}: {rows} rows of {context} tokens, "
               f"{decode_points[-1].seconds * 1e3:.1f} ms")
    if not decode_points:
        raise ValueError("no decode measurement fits the KV cache; lower decode_rows or decode_contexts")
    return PerformanceProfile(
        max_num_seqs=sched.max_num_seqs, prefill_chunk_size=sched.prefill_chunk_size,
        prefill_points=tuple(prefill_points), decode_points=tuple(decode_points),
        kv_capacity_tokens=engine.block_manager.num_usable_blocks * config.cache.block_size,
        max_model_len=sched.max_model_len, block_size=config.cache.block_size,
        source=f"profile_engine: {config.model} {config.dtype} on {config.device}")


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

    def decode_step(self, num_rows: int, prompt_len: int, num_steps: int) -> DecodePoint:
        """Median time of the N-row decode step with num_rows active rows of about prompt_len context."""
        # NOTE: token 1 from prefill, a warm-up step, num_steps timed steps: none finishes inside a timed step
        requests = [self.add(prompt_len, max_tokens=num_steps + 3) for _ in range(num_rows)]
        while any(r.is_prefilling or not r.output_token_ids for r in requests):
            self.engine.step()
        self.engine.step()  # NOTE: warm-up step (first use of this context window)
        samples, contexts = [], []
        for _ in range(num_steps):
            contexts.append(sum(r.num_tokens for r in requests))
            start = time.perf_counter()
            self.engine.step()
            samples.append(time.perf_counter() - start)
        for request in requests:
            self.engine.abort_request(request)
        return DecodePoint(num_rows, round(statistics.mean(contexts)), statistics.median(samples))
