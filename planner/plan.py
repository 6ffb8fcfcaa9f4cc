"""Capacity planner: how many prefill and decode instances a workload needs under TTFT and TPOT targets (and, in
planner/deployments.py and planner/recommend.py, colocated nodes and P/D sharing a GPU: what to run on given GPUs).

Inputs: a fitted PerformanceModel (planner/perf_profile.py), a Workload (Poisson rate, (input, output) samples),
an SLO (TTFT p99, TPOT p99) and the decode instance's DecodeConfig (N, KV tokens, max_model_len).
The analytic model (planner/capacity_model.py; planner/plan_sim.py replays the cluster event by event to check it):
- Prefill pool: P servers, each prefills one request at a time: an M/G/P queue whose service time is the fitted
  isolated prefill of the prompt. An arrival waits with the Erlang-C probability C(P, lambda*E[S]); a wait is
  exponential with mean (1 + cv^2(S)) / 2 / (P/E[S] - lambda) (the M/M/c tail, Allen-Cunneen's factor). It
  treats the pool as one central queue; the router's least-outstanding-tokens choice queues a little worse
  (simulated: up to ~10% more TTFT p99 near 90% load).
- Decode pool: D instances of N slots. A request holds a slot and KV for its whole sequence (prompt +
  max_tokens, block-rounded) for out - 1 decode steps. A step costs a + b * (total context of the instance's
  active rows) whatever the number of busy rows; by Little's law the mean context is
  (lambda/D) * s * E[sum of a request's contexts], so s = a / (1 - b * (lambda/D) * E[...]). Usable slots per
  instance = min(N, KV capacity / holding-weighted mean reservation); admission waits as in the prefill pool,
  over D * slots servers. With a swap space (DecodeConfig.swap_tokens, corun/kv_swap.py) a request holds the
  blocks its tokens need, admission bounds the whole sequences by KV + swap space, and the newest requests pause
  while the running ones' tokens outgrow the KV: usable slots = min(N, (KV + swap) / mean reservation, KV /
  holding-weighted mean of the tokens a request holds over its steps).
- TTFT = prefill wait + prefill + decode admission wait + the KV hand-off (the profile's kv_handoff: per request
  and per prompt token; zero where not measured) + up to one step (token 1 streams from the decode node after
  admission and the READ, at a step boundary). The p99 is solved over the samples.
- TPOT = a request's mean step time (fixed shape: every busy row waits for the whole step): a + b * (its own
  context + the others', averaged over its lifetime); the others' fluctuation is shot noise (M/G/inf), evened
  out by the router's fewest-unfinished choice (capacity_model.tpot_exceed).
- Headroom: no pool is planned busier than max_utilization (default 0.9).
Search: the fewest decode instances with headroom and TPOT met; then for each D upwards the fewest prefill
instances meeting TTFT; the pair with the fewest instances in all wins (ties: fewer decode instances).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.capacity_model import (
    QUANTILE,
    DecodeLoad,
    WaitTail,
    WorkloadStats,
    decode_load,
    prefill_utilization,
    prefill_wait,
    tpot_alone_p99,
    ttft_p99,
)
from planner.perf_profile import KVHandoff, PerformanceModel
from planner.slo import SLO
from wire.config import CacheConfig


@dataclass(frozen=True)
class Workload:
    rate: float
    """Poisson arrival rate, requests per second."""
    lengths: tuple[tuple[int, int], ...]
    """(input tokens, output tokens) samples; each arrival draws one."""
    name: str = "custom"

    def __post_init__(self):
        object.__setattr__(self, "lengths", tuple((int(i), int(o)) for i, o in self.lengths))
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"rate must be a positive number of requests/s, got {self.rate}")
        if not self.lengths:
            raise ValueError("the workload has no (input, output) length samples")
        if any(num_in < 1 or num_out < 1 for num_in, num_out in self.lengths):
            raise ValueError("every (input, output) sample needs input >= 1 and output >= 1")

    def summary(self) -> dict:
        inputs, outputs = np.array(self.lengths).T
        return {"name": self.name, "rate_per_s": self.rate, "num_samples": len(self.lengths),
                "input_mean": round(float(inputs.mean()), 1), "input_p99": int(np.quantile(inputs, QUANTILE)),
                "output_mean": round(float(outputs.mean()), 1), "output_p99": int(np.quantile(outputs, QUANTILE))}


def named_workload(name: str, rate: float, num_samples: int = 2000, seed: int = 0) -> Workload:
    """A workload of benchmarks.harness (1024x128, ..., burstgpt) as length samples."""
    from planner.workloads import make_workload

    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    return Workload(rate, make_workload(name, num_samples, seed).lengths, name)


def read_lengths(path: str | Path) -> tuple[tuple[int, int], ...]:
    """(input, output) pairs from JSON ([[in, out], ...] or [{"input": .., "output": ..}, ...]) or from text
    lines "in,out" / "in out" (lines starting with # and a non-numeric header are skipped)."""
    text = Path(path).read_text()
    if text.lstrip().startswith("["):
        try:
            return tuple((int(r["input"]), int(r["output"])) if isinstance(r, dict) else (int(r[0]), int(r[1]))
                         for r in json.loads(text))
        except (KeyError, IndexError, TypeError) as error:
            raise ValueError(f"{path}: expected [[input, output], ...] or [{{'input': .., 'output': ..}}, ...] "
                             f"({error!r})") from None
    pairs = []
    for line in text.splitlines():
        fields = line.replace(",", " ").split()
        if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
            pairs.append((int(fields[0]), int(fields[1])))
        elif fields and not line.startswith("#") and pairs:
            raise ValueError(f"{path}: cannot read {line!r} as 'input,output'")
    return tuple(pairs)


@dataclass(frozen=True)
class DecodeConfig:
    max_num_seqs: int
    """N: slots (and rows of every step) per decode instance."""
    kv_capacity_tokens: int
    """KV tokens per decode instance (usable blocks * block_size)."""
    max_model_len: int
    block_size: int = CacheConfig.block_size
    swap_tokens: int = 0
    """KV tokens the instance's swap space holds in host memory (corun/kv_swap.py): admission bounds the whole
    sequences by kv_capacity_tokens + swap_tokens, a request holds the blocks its tokens need, and the newest requests
    pause while the running ones' tokens exceed the KV. 0: every whole sequence reserved in the KV at admission."""

    def __post_init__(self):
        for name in ("max_num_seqs", "kv_capacity_tokens", "max_model_len", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.swap_tokens < 0:
            raise ValueError(f"swap_tokens must be >= 0, got {self.swap_tokens}")

    @property
    def admission_tokens(self) -> int:
        """What the whole sequences of the admitted requests may take."""
        return self.kv_capacity_tokens + self.swap_tokens

    def reserved_tokens(self, total_lens) -> np.ndarray:
        """KV reserved at admission: the whole sequence, in whole blocks."""
        return np.ceil(np.asarray(total_lens) / self.block_size) * self.block_size


def split_too_long(workload: Workload, decode: DecodeConfig) -> tuple[Workload, int]:
    """The workload without samples a cluster rejects (longer than max_model_len or than one instance's KV),
    and how many there were."""
    kept = tuple((i, o) for i, o in workload.lengths if i + o <= decode.max_model_len
                 and decode.reserved_tokens(i + o) <= decode.kv_capacity_tokens)
    if not kept:
        raise ValueError(f"no workload sample fits max_model_len {decode.max_model_len} and the KV capacity")
    return dataclasses.replace(workload, lengths=kept), len(workload.lengths) - len(kept)


@dataclass(frozen=True)
class Prediction:
    ttft_p99_s: float
    tpot_p99_s: float
    mean_step_s: float
    prefill_utilization: float
    """Busy fraction of the prefill servers."""
    decode_slot_utilization: float
    """Mean busy slots / N."""
    decode_kv_utilization: float
    """Mean reserved KV / KV capacity."""
    usable_slots_per_decode: int
    """min(N, what the KV holds of the workload's mean reservation)."""


@dataclass(frozen=True)
class Plan:
    feasible: bool
    num_prefill: int | None
    num_decode: int | None
    prefill_limited_by: str
    """What one fewer prefill instance would break: prefill_throughput (busier than max_utilization), ttft, or
    one_instance (one is enough)."""
    decode_limited_by: str
    """What one fewer decode instance would break: decode_slots or kv_capacity (whichever runs out first: busier
    than max_utilization, or admission waits breaking TTFT), tpot, or one_instance; for an infeasible plan,
    what no number of instances meets (tpot, ttft)."""
    prediction: Prediction | None
    reason: str

    @property
    def ratio(self) -> str | None:
        if not self.feasible:
            return None
        divisor = math.gcd(self.num_prefill, self.num_decode)
        return f"{self.num_prefill // divisor}:{self.num_decode // divisor}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"ratio": self.ratio}


def plan(model: PerformanceModel, workload: Workload, slo: SLO, decode: DecodeConfig, max_utilization: float = 0.9,
         max_instances: int = 1024, kv_handoff: KVHandoff = KVHandoff()) -> Plan:
    """The fewest prefill + decode instances whose predicted TTFT p99 and TPOT p99 meet the SLO, with no pool
    busier than max_utilization (slots or KV for decode).

    NOTE: the headroom is there because near saturation the p99 swings with every burst (simulated TTFT p99 at
    98% prefill load ranged 2-8 s over seeds), so neither the model nor a short test run can promise it.
    """
    if not 0 < max_utilization <= 1:
        raise ValueError(f"max_utilization must be in (0, 1], got {max_utilization}")
    if model.decode.max_num_seqs != decode.max_num_seqs:
        raise ValueError(f"the decode profile was measured at N = {model.decode.max_num_seqs}, the plan asks for "
                         f"N = {decode.max_num_seqs}: profile again at that N")
    _, num_too_long = split_too_long(workload, decode)
    if num_too_long:
        raise ValueError(f"{num_too_long} workload samples exceed max_model_len {decode.max_model_len} or the KV "
                         "capacity of one instance (split_too_long drops them)")
    stats = WorkloadStats.of(workload, model, decode)
    return Planner(model, stats, slo, decode, max_utilization, max_instances,
                   kv_handoff.seconds(stats.input_lens)).search()


class Planner:
    def __init__(self, model: PerformanceModel, stats: WorkloadStats, slo: SLO, decode: DecodeConfig,
                 max_utilization: float, max_instances: int, handoff_s=0.0):
        self.model, self.stats, self.slo, self.decode = model, stats, slo, decode
        self.handoff_s = handoff_s
        """Each sample's KV hand-off (seconds), or one for all."""
        self.max_utilization, self.max_instances = max_utilization, max_instances
        self.decode_loads: dict[int, DecodeLoad] = {}

    def decode_at(self, num_decode: int) -> DecodeLoad:
        if num_decode not in self.decode_loads:
            self.decode_loads[num_decode] = decode_load(self.stats, self.model, self.decode, num_decode)
        return self.decode_loads[num_decode]

    def ttft(self, num_prefill: int | None, num_decode: int | None) -> float:
        """TTFT p99; None: that pool unlimited (no waits; for decode, the step at zero context)."""
        if num_decode is None:
            return ttft_p99(self.stats, prefill_wait(self.stats, num_prefill), WaitTail.none(), self.model.decode.a,
                            self.handoff_s)
        load = self.decode_at(num_decode)
        return ttft_p99(self.stats, prefill_wait(self.stats, num_prefill), load.wait, load.mean_step_s,
                        self.handoff_s)

    def decode_has_headroom(self, num_decode: int) -> bool:
        load = self.decode_at(num_decode)
        return load.stable and max(load.slot_utilization, load.kv_utilization) <= self.max_utilization

    def decode_ok(self, num_decode: int) -> bool:
        return self.decode_has_headroom(num_decode) and self.decode_at(num_decode).tpot_p99_s <= self.slo.tpot_p99_s

    def search(self) -> Plan:
        infeasible = self.check_floors()
        if infeasible is not None:
            return infeasible
        min_decode = first_meeting(self.decode_ok, 1, self.max_instances)
        if min_decode is None:
            return self.infeasible(self.decode_at(self.max_instances).limited_by,
                                   f"more than {self.max_instances} decode instances needed")
        min_prefill = self.min_prefill(None)
        best = None
        for num_decode in range(min_decode, self.max_instances + 1):
            if best is not None and num_decode + min_prefill >= sum(best):
                break  # NOTE: no prefill count below the unlimited-decode one, so no smaller total is left
            num_prefill = self.min_prefill(num_decode)
            if num_prefill is not None and (best is None or num_prefill + num_decode < sum(best)):
                best = (num_prefill, num_decode)
        if best is None:
            return self.infeasible("ttft", f"TTFT not met with up to {self.max_instances} instances per pool")
        return self.feasible(*best)

    def check_floors(self) -> Plan | None:
        """Targets no number of instances meets: TPOT over a request's own context, TTFT of prefill alone."""
        tpot_alone = tpot_alone_p99(self.stats, self.model)
        if tpot_alone > self.slo.tpot_p99_s:
            return self.infeasible("tpot", f"the N = {self.decode.max_num_seqs} step alone takes "
                                   f"{1e3 * tpot_alone:.1f} ms at the p99 request's context, over the "
                                   f"{1e3 * self.slo.tpot_p99_s:.1f} ms TPOT target: no number of decode "
                                   "instances helps (lower N or the context, or a faster decode step)")
        ttft = self.ttft(None, None)
        if ttft > self.slo.ttft_p99_s:
            return self.infeasible("ttft", f"prefill alone (no queueing) gives a TTFT p99 of {ttft:.3f} s, over "
                                   f"the {self.slo.ttft_p99_s} s target: no number of instances helps")
        return None

    def min_prefill(self, num_decode: int | None) -> int | None:
        """Fewest prefill instances meeting TTFT with num_decode decode instances (None: unlimited)."""
        if self.ttft(None, num_decode) > self.slo.ttft_p99_s:
            return None
        low = max(1, math.ceil(prefill_utilization(self.stats, 1) / self.max_utilization - 1e-9))
        return first_meeting(lambda p: self.ttft(p, num_decode) <= self.slo.ttft_p99_s, low, self.max_instances)

    def feasible(self, num_prefill: int, num_decode: int) -> Plan:
        load = self.decode_at(num_decode)
        prediction = Prediction(
            ttft_p99_s=self.ttft(num_prefill, num_decode), tpot_p99_s=load.tpot_p99_s, mean_step_s=load.mean_step_s,
            prefill_utilization=prefill_utilization(self.stats, num_prefill),
            decode_slot_utilization=load.slot_utilization, decode_kv_utilization=load.kv_utilization,
            usable_slots_per_decode=load.usable_slots)
        prefill_by, decode_by = self.prefill_limit(num_prefill), self.decode_limit(num_decode)
        reason = (f"{num_prefill} prefill instance(s), limited by {prefill_by}; {num_decode} decode instance(s), "
                  f"limited by {decode_by}")
        return Plan(True, num_prefill, num_decode, prefill_by, decode_by, round_floats(prediction), reason)

    def prefill_limit(self, num_prefill: int) -> str:
        if num_prefill == 1:
            return "one_instance"
        if prefill_utilization(self.stats, num_prefill - 1) > self.max_utilization:
            return "prefill_throughput"
        return "ttft"

    def decode_limit(self, num_decode: int) -> str:
        if num_decode == 1:
            return "one_instance"
        fewer = self.decode_at(num_decode - 1)
        if self.decode_has_headroom(num_decode - 1) and fewer.tpot_p99_s > self.slo.tpot_p99_s:
            return "tpot"
        # NOTE: over the utilisation cap, or its admission waits push TTFT over the target: slots or KV run out
        return fewer.limited_by

    def infeasible(self, limited_by: str, reason: str) -> Plan:
        return Plan(False, None, None, "n/a", limited_by, None, reason)


def first_meeting(check, low: int, limit: int) -> int | None:
    """The smallest n in [low, limit] with check(n), for a check that stays true from some n on (None: none).

    NOTE: more instances only shorten waits and steps, so each check here is monotone: double, then bisect.
    """
    high = min(low, limit)
    while not check(high):
        if high >= limit:
            return None
        low, high = high + 1, min(2 * high, limit)
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if check(middle) else (middle + 1, high)
    return low


def round_floats(prediction: Prediction) -> Prediction:
    return dataclasses.replace(prediction, **{f.name: round(getattr(prediction, f.name), 5)
                                              for f in dataclasses.fields(prediction)
                                              if isinstance(getattr(prediction, f.name), float)})
