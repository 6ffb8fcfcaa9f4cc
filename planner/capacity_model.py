"""The planner's analytic model of one (P, D) cluster: queue waits, decode step time, TTFT and TPOT p99.

Formulas and their assumptions are in planner/plan.py's docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

QUANTILE = 0.99
MAX_PAIRS = 1000
"""Samples on the other side of the TPOT variance sum (it pairs every request with every other one)."""


@dataclass(frozen=True)
class WaitTail:
    """P(wait > x) = probability * exp(-x / mean) for x >= 0."""

    probability: float
    mean: float

    @classmethod
    def none(cls) -> WaitTail:
        return cls(0.0, 0.0)


def erlang_c(num_servers: int, load: float) -> float:
    """Probability that an arrival waits in M/M/c with num_servers and `load` Erlangs (< num_servers)."""
    blocking = 1.0
    for k in range(1, num_servers + 1):  # NOTE: Erlang B recursion, stable for thousands of servers
        blocking = load * blocking / (k + load * blocking)
        if blocking < 1e-300:  # NOTE: far more servers than load: nobody waits (and the loop ends early)
            return 0.0
    return num_servers * blocking / (num_servers - load * (1.0 - blocking))


def queue_wait(num_servers: int, arrival_rate: float, mean_service: float, service_cv2: float) -> WaitTail | None:
    """The wait of an M/G/c FIFO queue (Erlang C, Allen-Cunneen tail); None when the queue is unstable."""
    load = arrival_rate * mean_service
    if load >= num_servers:
        return None
    if load == 0:
        return WaitTail.none()
    mean = (1.0 + service_cv2) / 2.0 / (num_servers / mean_service - arrival_rate)
    return WaitTail(erlang_c(num_servers, load), mean)


def sum_survival(first: WaitTail, second: WaitTail, x: np.ndarray) -> np.ndarray:
    """P(W1 + W2 > x) for independent waits of the WaitTail form (x < 0 gives 1)."""
    x_pos = np.maximum(x, 0.0)
    p1, p2, m1, m2 = first.probability, second.probability, first.mean, second.mean
    only_first = p1 * (1 - p2) * decay(x_pos, m1)
    only_second = p2 * (1 - p1) * decay(x_pos, m2)
    if abs(m1 - m2) <= 1e-9 * max(m1, m2, 1e-300):
        both = (1 + x_pos / max(m1, 1e-300)) * decay(x_pos, m1)
    else:  # NOTE: hypoexponential survival (sum of two exponentials)
        both = (m1 * decay(x_pos, m1) - m2 * decay(x_pos, m2)) / (m1 - m2)
    return np.where(x < 0, 1.0, only_first + only_second + p1 * p2 * both)


def decay(x: np.ndarray, mean: float) -> np.ndarray:
    return np.exp(-x / mean) if mean > 0 else np.zeros_like(x)


@dataclass(frozen=True)
class WorkloadStats:
    """Per-sample quantities the model averages over (arrays indexed by sample)."""

    rate: float
    prefill_s: np.ndarray
    decode_steps: np.ndarray
    """out - 1: token 1 comes from prefill."""
    context_sum: np.ndarray
    """Sum over its decode steps of the tokens attended (step j attends input + j)."""
    reserved: np.ndarray
    """KV tokens reserved at admission."""
    input_lens: np.ndarray
    output_lens: np.ndarray
    held: np.ndarray
    """KV tokens a request holds over its decode steps, on average (its mean context, block-rounded; 0 for a request
    that does not decode): what a swap space lets it hold instead of its whole sequence."""

    @classmethod
    def of(cls, workload, model, decode) -> WorkloadStats:
        inputs, outputs = (np.array(x, dtype=float) for x in zip(*workload.lengths))
        steps = outputs - 1
        context_sum = steps * inputs + steps * (steps + 1) / 2
        held = decode.reserved_tokens(np.divide(context_sum, steps, out=np.zeros_like(steps), where=steps > 0))
        return cls(workload.rate, model.prefill.seconds(inputs), steps, context_sum,
                   decode.reserved_tokens(inputs + outputs), inputs, outputs, held)

    @property
    def decodes(self) -> np.ndarray:
        return self.decode_steps > 0


@dataclass(frozen=True)
class DecodeLoad:
    """The decode pool at D instances (an unstable pool's TPOT and wait are infinite)."""

    stable: bool
    mean_step_s: float
    tpot_p99_s: float
    slot_utilization: float
    kv_utilization: float
    usable_slots: int
    wait: WaitTail
    cycle_s: float = 0.0
    """Mean time between a row's tokens: the step, over the share of the GPU's time the steps get."""
    mean_context: float = 0.0
    """Mean tokens attended by an instance's step."""
    gpu_share: float = 1.0
    interference: PrefillInterference | None = None

    @property
    def limited_by(self) -> str:
        return "kv_capacity" if self.kv_utilization >= self.slot_utilization else "decode_slots"


@dataclass(frozen=True)
class PrefillInterference:
    """Prefill forwards that hold back the decode steps of the same GPU. A decoding row's TPOT is its steps plus the
    decode time lost to the prefills that run during its decode, over its steps. Prefills come as a Poisson stream,
    so a short request that catches one long prompt's prefill sees its TPOT jump: the p99 is set by that jump, which
    a mean share of the GPU (the steps slowed by the average prefill load) hides."""

    rate: float
    """Prefills per second on this GPU."""
    prefill_s: np.ndarray
    """Isolated prefill seconds, one per workload sample (the prompts' distribution)."""
    delay_per_prefill_s: float
    """Decode seconds lost per isolated prefill second: 1 on a colocated node (its prefills run between its steps),
    less for a prefill process time-slicing the GPU with the decode process (shared_gpu_delay)."""
    max_delay_per_step_s: float = math.inf
    """The most decode time lost between two steps (a colocated node's prefill token budget bounds it)."""

    def __post_init__(self):
        if not (self.rate >= 0 and self.delay_per_prefill_s >= 0 and self.max_delay_per_step_s > 0):
            raise ValueError("a prefill interference needs rate >= 0, delay_per_prefill_s >= 0 and "
                             f"max_delay_per_step_s > 0, got {self.rate}, {self.delay_per_prefill_s} and "
                             f"{self.max_delay_per_step_s}")
        if len(self.prefill_s) == 0 or not (np.asarray(self.prefill_s) > 0).all():
            raise ValueError("a prefill interference needs prefill seconds > 0 for at least one sample")

    @property
    def lost_fraction(self) -> float:
        """The fraction of the GPU's time the decode steps lose to prefills, on average."""
        return self.rate * self.delay_per_prefill_s * float(np.mean(self.prefill_s))

    def delays(self, windows: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Decode seconds lost by each request during its window (seconds it decodes for) over its steps: DELAY_DRAWS
        seeded draws per request, [n, DELAY_DRAWS]. The prefills in a window are a Poisson count of workload
        samples, summed exactly up to EXACT_PREFILLS of them and as a normal beyond (many prefills: the sum is
        near normal)."""
        rng = np.random.default_rng(DELAY_SEED)
        shape = (len(windows), DELAY_DRAWS)
        counts = rng.poisson(self.rate * np.asarray(windows, dtype=float)[:, None], size=shape)
        picked = rng.choice(np.asarray(self.prefill_s, dtype=float), size=(*shape, EXACT_PREFILLS))
        exact = np.where(np.arange(EXACT_PREFILLS) < counts[..., None], picked, 0.0).sum(axis=-1)
        mean, variance = float(np.mean(self.prefill_s)), float(np.var(self.prefill_s))
        approximate = np.maximum(counts * mean + np.sqrt(counts * variance) * rng.standard_normal(shape), 0.0)
        work = np.where(counts <= EXACT_PREFILLS, exact, approximate)
        return np.minimum(self.delay_per_prefill_s * work, np.asarray(steps, dtype=float)[:, None] *
                          self.max_delay_per_step_s)


DELAY_DRAWS = 16
"""Draws of the prefill delay per request (the TPOT mixture is over requests and draws)."""
EXACT_PREFILLS = 12
DELAY_SEED = 0
"""The draws are seeded: a prediction is a function of its inputs."""


def shared_gpu_delay(prefill_stretch: float) -> float:
    """Decode seconds lost per isolated prefill second when a prefill process time-slices the GPU with the decode
    process. While both have work the GPU alternates between the two contexts in equal slices: the prefill runs
    prefill_stretch times as long, and the decode steps go as many times slower for that long, so they lose
    1 - 1 / prefill_stretch of it: prefill_stretch - 1 per isolated prefill second.
    NOTE: the profile's decode_stretch is a TPOT ratio over a whole run, diluted by the time no prefill ran; taken as
    the stretch during a prefill it under-predicted 1P1D's TPOT p99 on the H200 by 1.07-2.4x (planner validation)."""
    if not prefill_stretch >= 1:
        raise ValueError(f"the prefill stretch must be >= 1, got {prefill_stretch}")
    return prefill_stretch - 1


def decode_load(stats: WorkloadStats, model, decode, num_decode: int,
                interference: PrefillInterference | None = None) -> DecodeLoad:
    """interference: the prefills that share the GPU with the decode steps (a colocated node between its steps, or
    a prefill process time-slicing the GPU); None on a decode node's own GPU. The steps get gpu_share = 1 - the
    fraction of the time they lose: a row waits step / share between two tokens on average, and holds its slot and
    KV that much longer; the TPOT p99 counts the prefills each request's own window catches (tpot_exceed)."""
    gpu_share = 1.0 - (interference.lost_fraction if interference else 0.0)
    step = model.decode
    if gpu_share <= 0:  # NOTE: the prefills take the whole GPU: no step ever runs
        return DecodeLoad(False, math.inf, math.inf, math.inf, math.inf, decode.max_num_seqs, WaitTail(1.0, math.inf),
                          math.inf, math.inf, 0.0, interference)
    busy = stats.decodes
    fraction = float(busy.mean())
    steps, reserved = stats.decode_steps[busy], stats.reserved[busy]
    if not fraction:  # NOTE: every request ends with token 1 from prefill: decode only streams it
        return DecodeLoad(True, step.a, step.a / gpu_share, 0.0, 0.0, decode.max_num_seqs, WaitTail.none(),
                          step.a / gpu_share, 0.0, gpu_share, interference)
    instance_rate = stats.rate * fraction / num_decode
    context_per_request = float(stats.context_sum[busy].mean())
    max_context = max_decode_context(decode)
    # NOTE: s = a + b * mean context and mean context = rate * (s / share) * context per request; past a coupling
    # of 1 (or the KV's most context) the pool saturates at the full step.
    coupling = step.b * instance_rate * context_per_request / gpu_share
    step_s = min(step.a / (1 - coupling) if coupling < 1 else math.inf, float(step.seconds(max_context)))
    cycle_s = step_s / gpu_share
    mean_context = instance_rate * cycle_s * context_per_request
    slots = usable_slots(decode, steps, reserved, stats.held[busy])
    wait = queue_wait(num_decode * slots, stats.rate * fraction, cycle_s * float(steps.mean()),
                      float(steps.var() / steps.mean() ** 2))
    stable = wait is not None and mean_context < max_context
    tpot_p99 = bisect_quantile(tpot_exceed(stats, model, instance_rate, cycle_s, mean_context, num_decode,
                                           interference, max_context), 0.0, max(cycle_s, 1e-9))
    return DecodeLoad(stable, step_s, tpot_p99 if stable else math.inf,
                      instance_rate * cycle_s * float(steps.mean()) / decode.max_num_seqs,
                      kv_utilization(decode, instance_rate * cycle_s, steps, reserved, stats.held[busy]),
                      slots, wait if stable else WaitTail(1.0, math.inf), cycle_s, mean_context, gpu_share,
                      interference)


def max_decode_context(decode) -> int:
    """The most tokens an instance's step can attend: its KV, or every slot at max_model_len."""
    return min(decode.kv_capacity_tokens, decode.max_num_seqs * decode.max_model_len)


def tpot_exceed(stats: WorkloadStats, model, instance_rate: float, cycle_s: float, mean_context: float,
                num_decode: int, interference: PrefillInterference | None = None, max_context: float = math.inf):
    """P(a request's TPOT > t), as a function of t. A request's TPOT is the step time averaged over its own
    H = steps * cycle seconds, a + b * (its own mean context + the others' context averaged over H) (at most the
    step at max_context), plus the decode time the prefills during H take from it (interference), over its steps.
    The others are shot noise (M/G/inf, arrivals seen as the time average): mean `mean_context`,
    and over a window T the variance rate / T^2 * E[c^2 * f(H, T)], with c a request's mean context and
    f(H, T) = int over its arrival time of (its overlap with the window)^2 = H^2 T - H^3 / 3 (H <= T) or
    T^2 H - T^3 / 3. The router sends each request to the instance with the fewest unfinished ones, which evens out
    the counts: the part of the variance that comes from the count (E[c]^2 of E[c^2]) shrinks D-fold. Normal within
    a request and a draw of its prefill delay; the mixture is over the workload's requests and the draws."""
    busy = stats.decodes
    steps = stats.decode_steps[busy]
    own_context = stats.context_sum[busy] / steps  # [n]
    window = steps * cycle_s  # [n]
    others = slice(None, None, max(1, len(steps) // MAX_PAIRS))
    holding, context = window[others][None, :], own_context[others][None, :]  # [1, k]
    span = window[:, None]  # [n, 1]
    overlap_sq = np.where(holding <= span, holding**2 * span - holding**3 / 3, span**2 * holding - span**3 / 3)
    mean_c, mean_c2 = (float(np.average(own_context**k, weights=steps)) for k in (1, 2))
    balanced = (mean_c2 - mean_c**2 + mean_c**2 / num_decode) / mean_c2
    variance = balanced * instance_rate / window**2 * (context**2 * overlap_sq).mean(axis=1)  # [n]
    mean = model.decode.seconds(np.minimum(mean_context + own_context, max_context))[:, None]  # [n, 1]
    if interference is not None:
        mean = mean + interference.delays(window, steps) / steps[:, None]  # [n, draws]
    spread = np.broadcast_to((model.decode.b * np.sqrt(variance))[:, None], mean.shape)

    def exceed(t: float) -> float:
        z = (t - mean) / np.maximum(spread, 1e-300)
        return float(np.mean(np.where(spread > 0, normal_survival(z), (mean > t).astype(float))))

    return exceed


def normal_survival(z: np.ndarray) -> np.ndarray:
    """P(N(0, 1) > z), vectorized: erfc by Numerical Recipes' Chebyshev fit (relative error < 1.2e-7), as the
    TPOT mixture evaluates it over every request and draw at each step of a bisection."""
    # NOTE: capped where exp(-x * x) is 0 in float64 already (x > 27.3): a request with no spread comes as z ~ 1e300,
    # whose square overflowed (a RuntimeWarning, though the result was right)
    x = np.minimum(np.abs(np.asarray(z, dtype=float)) / math.sqrt(2), 40.0)
    t = 1 / (1 + 0.5 * x)
    polynomial = 0.17087277
    for coefficient in (-0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418, 0.37409196,
                        1.00002368, -1.26551223):
        polynomial = coefficient + t * polynomial
    upper = 0.5 * t * np.exp(-x * x + polynomial)
    return np.where(np.asarray(z) >= 0, upper, 1 - upper)


def bisect_quantile(exceed, low: float, high: float) -> float:
    """The smallest t with exceed(t) <= 1 - QUANTILE, for a non-increasing exceed (high is raised until it holds)."""
    while exceed(high) > 1 - QUANTILE:
        low, high = high, 2 * high
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if exceed(middle) > 1 - QUANTILE else (low, middle)
    return high


def tpot_alone_p99(stats: WorkloadStats, model) -> float:
    """TPOT p99 with every request alone on its instance: the step over its own context only."""
    busy = stats.decodes
    if not busy.any():
        return model.decode.a
    return float(np.quantile(model.decode.seconds(stats.context_sum[busy] / stats.decode_steps[busy]), QUANTILE))


def usable_slots(decode, steps: np.ndarray, reserved: np.ndarray, held: np.ndarray) -> int:
    """Slots per instance the KV can keep busy: min(N, capacity / mean reservation of a resident request),
    where a resident is weighted by how long it stays (its decode steps). With a swap space: min(N, (capacity +
    swap space) / mean reservation, capacity / mean of what a resident holds)."""
    if steps.size == 0:
        return decode.max_num_seqs
    resident_reservation = float((steps * reserved).sum() / steps.sum())
    slots = min(decode.max_num_seqs, int(decode.admission_tokens // resident_reservation))
    if decode.swap_tokens:
        slots = min(slots, int(decode.kv_capacity_tokens // float((steps * held).sum() / steps.sum())))
    return max(1, slots)


def kv_utilization(decode, residence_per_step: float, steps: np.ndarray, reserved: np.ndarray,
                   held: np.ndarray) -> float:
    """Mean reserved KV over what admission may reserve (the KV, plus the swap space), or with a swap space the
    mean KV held over the KV where that is higher. residence_per_step: arrivals per second x a step's seconds."""
    reserving = residence_per_step * float((steps * reserved).mean()) / decode.admission_tokens
    if not decode.swap_tokens:
        return reserving
    return max(reserving, residence_per_step * float((steps * held).mean()) / decode.kv_capacity_tokens)


def prefill_utilization(stats: WorkloadStats, num_prefill: int) -> float:
    return stats.rate * float(stats.prefill_s.mean()) / num_prefill


def prefill_wait(stats: WorkloadStats, num_prefill: int | None) -> WaitTail | None:
    """None: unstable; num_prefill None: unlimited (no wait)."""
    if num_prefill is None:
        return WaitTail.none()
    mean = float(stats.prefill_s.mean())
    return queue_wait(num_prefill, stats.rate, mean, float(stats.prefill_s.var()) / mean**2)


def ttft_p99(stats: WorkloadStats, prefill: WaitTail | None, decode_wait: WaitTail, step_s: float,
             handoff_s=0.0) -> float:
    """Solve mean_i P(prefill wait + [decode wait + hand-off + step] + prefill_i > t) = 1 - QUANTILE by bisection
    (the bracket: only requests that decode wait for admission, the KV hand-off and a step)."""
    exceed = ttft_exceed(stats, prefill, decode_wait, step_s, handoff_s)
    if exceed is None:
        return math.inf
    return bisect_quantile(exceed, 0.0, float(ttft_base(stats, step_s, handoff_s).max()) + 1e-3)


def ttft_base(stats: WorkloadStats, step_s: float, handoff_s=0.0, prefill_s=None) -> np.ndarray:
    """Each sample's TTFT without waits: its prefill (prefill_s: instead of the isolated one), and for a request that
    decodes the KV hand-off and up to one step."""
    prefill_s = stats.prefill_s if prefill_s is None else prefill_s
    return prefill_s + np.where(stats.decodes, step_s + np.asarray(handoff_s, dtype=float), 0.0)


def ttft_exceed(stats: WorkloadStats, prefill: WaitTail | None, decode_wait: WaitTail, step_s: float,
                handoff_s=0.0, prefill_s=None):
    """P(TTFT > t) as a function of t; None when a queue is unstable (every TTFT infinite)."""
    if prefill is None or not math.isfinite(decode_wait.mean) or not math.isfinite(step_s):
        return None
    decodes = stats.decodes
    base = ttft_base(stats, step_s, handoff_s, prefill_s)
    no_wait = WaitTail.none()

    def exceed(t: float) -> float:
        with_decode = sum_survival(prefill, decode_wait, t - base)
        without = sum_survival(prefill, no_wait, t - base)
        return float(np.where(decodes, with_decode, without).mean())

    return exceed
