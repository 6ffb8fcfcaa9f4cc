"""Performance profiles for the capacity planner: measured points, fitted cost models (planner/profiling.py measures
the points on an engine).

A profile holds what was measured on one engine configuration:
  prefill points  (prompt length L, seconds of its isolated prefill, chunked as the engine chunks it);
  decode points   (active rows, total context of the active rows, seconds of one N-row decode step);
  the KV hand-off of a P/D request (a GPU per node, and a prefill and a decode process sharing one GPU), and the
  prefill token budget a colocated node runs with.
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
class KVHandoff:
    """The KV hand-off of a P/D request: from its prefill's end to its KV readable on the decode node (the decode
    node's READ): per_request_s + per_token_s * prompt tokens."""

    per_request_s: float = 0.0
    per_token_s: float = 0.0
    source: str = "not measured: taken as zero"
    """Where the numbers come from (a benchmark result file, the conditions it ran under)."""

    def __post_init__(self):
        if not (self.per_request_s >= 0 and self.per_token_s >= 0):
            raise ValueError("the KV hand-off's per_request_s and per_token_s must be >= 0")

    def seconds(self, prompt_lens) -> np.ndarray:
        return self.per_request_s + self.per_token_s * np.asarray(prompt_lens, dtype=float)


@dataclass(frozen=True)
class SharedGPU:
    """A prefill and a decode process on one GPU (1P1D on one GPU): without MPS the GPU time-slices between their
    CUDA contexts, so each one's work stretches while the other's runs, and the READ waits for a time slice. The
    planner scales each stretch by the other process's busy fraction."""

    decode_stretch: float
    """How much longer a decode step takes while the prefill process is busy the whole time."""
    prefill_stretch: float
    """How much longer a prefill takes while the decode process steps the whole time."""
    kv_handoff: KVHandoff
    """The hand-off under load on the shared GPU (it replaces the profile's kv_handoff there)."""
    source: str = ""
    decode_kv_capacity_tokens: int | None = None
    """KV tokens of the decode process on the shared GPU: the two processes each hold a reserve (and, in profiles
    measured before stop 53, the weights: since then they share one copy, corun/shared_weights.py) and split what is
    left (launch/cluster.py ROLE_KV_WEIGHTS). None (a profile made before stop 51): the profile's kv_capacity_tokens,
    as a GPU of its own."""

    def __post_init__(self):
        if not (self.decode_stretch >= 1 and self.prefill_stretch >= 1):
            raise ValueError(f"the stretches must be >= 1, got {self.decode_stretch} and {self.prefill_stretch}")
        if self.decode_kv_capacity_tokens is not None and self.decode_kv_capacity_tokens < 1:
            raise ValueError(f"decode_kv_capacity_tokens must be >= 1, got {self.decode_kv_capacity_tokens}")


@dataclass(frozen=True)
class PerformanceProfile:
    max_num_seqs: int
    """N the decode steps were measured at (the step shape; a plan must use the same N)."""
    prefill_chunk_size: int
    prefill_points: tuple[PrefillPoint, ...]
    decode_points: tuple[DecodePoint, ...]
    kv_capacity_tokens: int | None = None
    """KV tokens of one instance of the profiled engine (the planner's default)."""
    swap_capacity_tokens: int | None = None
    """KV tokens the profiled engine's swap space holds in host memory (corun/kv_swap.py: auto on CUDA, none on CPU;
    the planner's default). None: a profile made before stop 55, taken as none."""
    max_model_len: int | None = None
    block_size: int = CacheConfig.block_size
    source: str = ""
    """How the points were obtained (engine, device, file names)."""
    prefill_token_budget: int | None = None
    """The engine's prefill token budget in force (SchedulerConfig.decode_wait_tokens): how many prompt tokens a
    colocated node prefills between two decode steps while requests decode (0: all it can). None: not recorded."""
    kv_handoff: KVHandoff = KVHandoff()
    """P/D with a GPU per node: the KV hand-off per request."""
    shared_gpu: SharedGPU | None = None
    """P/D with a prefill and a decode process on one GPU; None: not measured (the planner then offers no such
    deployment)."""

    def __post_init__(self):
        if min(self.max_num_seqs, self.prefill_chunk_size, self.block_size) < 1:
            raise ValueError("max_num_seqs, prefill_chunk_size and block_size must be >= 1")
        if not self.prefill_points or not self.decode_points:
            raise ValueError("a profile needs prefill points and decode points")
        if any(p.prompt_len < 1 or p.seconds <= 0 for p in self.prefill_points):
            raise ValueError("prefill points need prompt_len >= 1 and seconds > 0")
        if self.swap_capacity_tokens is not None and self.swap_capacity_tokens < 0:
            raise ValueError(f"swap_capacity_tokens must be >= 0, got {self.swap_capacity_tokens}")
        if self.prefill_token_budget is not None and self.prefill_token_budget < 0:
            raise ValueError(f"prefill_token_budget must be >= 0, got {self.prefill_token_budget}")
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
            if "kv_handoff" in data:
                fields["kv_handoff"] = KVHandoff(**data["kv_handoff"])
            if data.get("shared_gpu") is not None:
                shared = data["shared_gpu"]
                fields["shared_gpu"] = SharedGPU(**shared | {"kv_handoff": KVHandoff(**shared["kv_handoff"])})
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
