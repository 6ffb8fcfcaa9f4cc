"""The traffic mixes `corun bench` sends and `corun plan` sizes for: seeded (input, output) length samples, and when
each request arrives.

Every workload is seeded and bounded. Arrivals follow `vllm bench serve`: rate inf sends every request at t=0;
a finite rate draws gamma-distributed gaps (shape = burstiness, mean 1/rate; burstiness 1 = Poisson).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from planner.prefix_workloads import SHARED_PREFIX_WORKLOADS, group_prompts, shared_prefix_requests
from wire.sampling_params import SamplingParams

PAPER_WORKLOADS = ("1024x128", "1024x2048", "4096x128", "4096x2048", "burstgpt")
"""The paper's workloads: `corun bench`'s default set."""
DEFAULT_NUM_REQUESTS = 256
RL_ROLLOUT_NUM_REQUESTS = 512
"""NOTE: the RL rollout batch of the issue: 512 prompts of 100-400 tokens, outputs 256-1024."""

LengthSampler = Callable[[random.Random], tuple[int, int]]


@dataclass(frozen=True)
class Workload:
    name: str
    lengths: tuple[tuple[int, int], ...]
    """(input tokens, output tokens) per request."""
    prefix_groups: tuple[tuple[int, int], ...] = ()
    """Shared-prefix workloads (planner/prefix_workloads.py): (group, shared tokens) per request, whose prompt starts
    with that many tokens of its group's sequence; () = every prompt random."""

    @property
    def max_sequence_len(self) -> int:
        return max((num_in + num_out for num_in, num_out in self.lengths), default=0)


def burstgpt_lengths(rng: random.Random) -> tuple[int, int]:
    # NOTE: BurstGPT-like: long-tailed (lognormal) prompt and response lengths, few beyond 4k. The draw order
    # (prompt, then output) is part of the workload: the same seed must keep giving the same lengths.
    return (min(6144, max(16, int(rng.lognormvariate(6.2, 0.9)))),
            min(2048, max(8, int(rng.lognormvariate(5.3, 1.0)))))


def sharegpt_lengths(rng: random.Random) -> tuple[int, int]:
    # NOTE: ShareGPT-like chat: short prompts, medium answers. Lognormal prompts with median 250 and sigma 0.6
    # (mean exp(sigma^2 / 2) = 1.2x the median: ~300 tokens), clipped to [4, 2048]; outputs median 210, sigma
    # 0.62 (mean ~250), clipped to [8, 1024]. Measured over 200k draws: means 299 and 253.
    return (min(2048, max(4, int(rng.lognormvariate(math.log(250), 0.6)))),
            min(1024, max(8, int(rng.lognormvariate(math.log(210), 0.62)))))


def rl_rollout_lengths(rng: random.Random) -> tuple[int, int]:
    return rng.randint(100, 400), rng.randint(256, 1024)


SAMPLED_WORKLOADS: dict[str, tuple[LengthSampler, int]] = {
    "burstgpt": (burstgpt_lengths, DEFAULT_NUM_REQUESTS), "sharegpt": (sharegpt_lengths, DEFAULT_NUM_REQUESTS),
    "rl_rollout": (rl_rollout_lengths, RL_ROLLOUT_NUM_REQUESTS)}
"""name -> (per-request length sampler, the workload's own request count)."""


def make_workload(name: str, num_requests: int | None = None, seed: int = 0) -> Workload:
    """name: a sampled mix (burstgpt, sharegpt, rl_rollout) or INxOUT, every request INPUT prompt tokens and OUTPUT
    generated ones (1024x128, ...; vLLM's random dataset). num_requests None: the workload's own default (256; 512
    for rl_rollout)."""
    if name in SHARED_PREFIX_WORKLOADS:
        requests = shared_prefix_requests(name, checked_count(num_requests, DEFAULT_NUM_REQUESTS), random.Random(seed))
        return Workload(name, tuple((r[0], r[1]) for r in requests), tuple((r[2], r[3]) for r in requests))
    if fixed := fixed_lengths(name):
        return Workload(name, (fixed,) * checked_count(num_requests, DEFAULT_NUM_REQUESTS))
    if name not in SAMPLED_WORKLOADS:
        raise ValueError(f"unknown workload {name!r} (have INxOUT such as 1024x128, or "
                         f"{', '.join([*SAMPLED_WORKLOADS, *SHARED_PREFIX_WORKLOADS])})")
    sampler, default_count = SAMPLED_WORKLOADS[name]
    rng = random.Random(seed)
    return Workload(name, tuple(sampler(rng) for _ in range(checked_count(num_requests, default_count))))


def fixed_lengths(name: str) -> tuple[int, int] | None:
    num_in, sep, num_out = name.partition("x")
    if not (sep and num_in.isdigit() and num_out.isdigit()):
        return None
    if int(num_in) < 1 or int(num_out) < 1:
        raise ValueError(f"workload {name!r}: input and output lengths must be >= 1")
    return int(num_in), int(num_out)


def default_workloads(max_model_len: int, num_requests: int | None = None,
                      seed: int = 0) -> tuple[list[Workload], str | None]:
    """`corun bench`'s workloads when none are named: the paper's set, those of it that fit max_model_len; when none
    fits (the built-in tiny model's 1024), one INxOUT sized to the engine. -> (workloads, what was left out)."""
    paper = [make_workload(name, num_requests, seed) for name in PAPER_WORKLOADS]
    fitting = [workload for workload in paper if workload.max_sequence_len <= max_model_len]
    left_out = [workload.name for workload in paper if workload not in fitting]
    note = f"{', '.join(left_out)} left out: longer than max_model_len {max_model_len}" if left_out else None
    if not fitting:
        fitting = [make_workload(f"{max_model_len * 3 // 4}x{max(1, max_model_len // 8)}", num_requests, seed)]
    return fitting, note


def checked_count(num_requests: int | None, default: int) -> int:
    if num_requests is None:
        return default
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    return num_requests


def check_fits(workload: Workload, max_model_len: int) -> None:
    """Refuse a workload the engine would reject request by request, before any model is loaded."""
    too_long = [(i, o) for i, o in workload.lengths if i + o > max_model_len]
    if too_long:
        num_in, num_out = max(too_long, key=sum)
        raise ValueError(f"workload {workload.name!r}: {len(too_long)} of {len(workload.lengths)} requests exceed "
                         f"max_model_len {max_model_len} (longest: {num_in} prompt + {num_out} output = "
                         f"{num_in + num_out} tokens); raise --max-model-len or pick a shorter workload")


def make_prompts(workload: Workload, vocab_size: int, seed: int) -> list[tuple[str, list[int], SamplingParams]]:
    """(request id, random prompt token ids, sampling params) per request: engine.add_request's arguments."""
    rng = random.Random(seed)
    if workload.prefix_groups:
        prompts = group_prompts(workload.lengths, workload.prefix_groups, vocab_size, rng)
    else:
        prompts = [[rng.randrange(vocab_size) for _ in range(num_in)] for num_in, _ in workload.lengths]
    return [(f"{workload.name}-{i}", prompt, SamplingParams(temperature=0.6, seed=i, max_tokens=num_out,
                                                           ignore_eos=True))
            for i, (prompt, (_, num_out)) in enumerate(zip(prompts, workload.lengths, strict=True))]


@dataclass(frozen=True)
class Arrivals:
    """When requests reach the engine: request_rate per second (inf: all at t=0) with gamma-distributed gaps."""

    request_rate: float = math.inf
    burstiness: float = 1.0
    """Gamma shape of the gaps: 1 is Poisson, < 1 burstier, > 1 more even (vLLM's --burstiness)."""
    seed: int = 0

    def __post_init__(self):
        if math.isnan(self.request_rate) or self.request_rate <= 0:
            raise ValueError(f"request rate must be > 0 requests/s (inf: all at once), got {self.request_rate}")
        if not (math.isfinite(self.burstiness) and self.burstiness > 0):
            raise ValueError(f"burstiness must be a finite number > 0, got {self.burstiness}")

    def times(self, num_requests: int) -> tuple[float, ...]:
        """Arrival second of each request, from the run's start."""
        if math.isinf(self.request_rate):
            return (0.0,) * num_requests
        rng, scale = random.Random(self.seed), 1.0 / (self.request_rate * self.burstiness)
        # NOTE: the first request arrives at t=0 and each later one one gap after the previous (as vLLM's
        # sender: send, then sleep), so a run never starts with the engine idle.
        gaps = [0.0] + [rng.gammavariate(self.burstiness, scale) for _ in range(num_requests - 1)]
        return tuple(itertools.accumulate(gaps[:num_requests]))

    def describe(self) -> dict:
        """JSON-safe (no Infinity): rate inf is written "inf", as vLLM's result files do."""
        rate = "inf" if math.isinf(self.request_rate) else self.request_rate
        return {"request_rate": rate, "burstiness": self.burstiness, "seed": self.seed}


DEFAULT_ARRIVALS = Arrivals()
"""Every request at t=0 (`corun bench`'s default, and the harness')."""
