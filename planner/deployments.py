"""What a deployment predicts at a rate: colocated nodes, P/D with a GPU per node, or P/D pairs sharing GPUs.

The P/D pools are planner/capacity_model.py's (planner/plan.py's docstring gives the formulas), with the KV hand-off
added to the TTFT of every request that decodes. The other two are modelled here:
- Colocated node (`corun serve --colocated K`; colocated_node/server.py): one process, one GPU, the engine's
  fixed_shape schedule. It prefills (one chunk per forward) while no request decodes or until it has prefilled
  the prefill token budget B since the last decode step, then runs one N-row decode step. So:
  - its GPU spends rho = lambda * E[prefill] of its time prefilling (lambda = rate / K: the router sends to the
    least loaded node), and the decode steps get the rest: a decoding row waits step / (1 - rho) between tokens
    on average; its TPOT is its steps plus the prefills that land among them, over its steps (a Poisson count of
    prefills in its window, at most one pack of max(B, chunk) tokens between two steps): a short request that
    catches one long prefill sets the p99 (capacity_model.PrefillInterference);
  - a prompt of L tokens waits for L / B decode steps while it is prefilled, if any request is decoding (B = 0: it
    waits for none, Algorithm 1): its prefill service is prefill(L) + P(decoding) * L / B * step, an M/G/K queue
    over the K nodes (prefill wait), after its admission (a slot and KV for the whole sequence, as a decode
    node's);
  - token 1 comes from its own prefill: no hand-off; up to one decode step in flight at its arrival is added.
  The budget also bounds the prefill done between two steps, but the prefill queue is unstable first (with
  lambda * E[prefill service] < 1 the mean prefill between two steps stays under the budget's).
- P/D sharing GPUs (K GPUs, each with a prefill and a decode process; the H200's 1P1D on one GPU): the GPU
  time-slices between the two CUDA contexts (profile.shared_gpu, measured with both processes busy): a prefill runs
  prefill_stretch times as long while requests decode, and in equal time slices the decode steps run as many times
  slower while it runs, so each isolated prefill second costs the decode prefill_stretch - 1 seconds
  (capacity_model.shared_gpu_delay): the colocated node's TPOT model with that delay per prefill second instead of
  1. A prefill stretches by 1 + (prefill_stretch - 1) * P(a request decoding), and the hand-off is the one measured
  under load there. Its decode node holds the KV the profile measured for it on the shared GPU
  (SharedGPU.decode_kv_capacity_tokens: the two processes each hold a reserve and split the rest; in the H200
  profile, measured before stop 53, each held the weights too, where they now share one copy), where the profile
  gives it.
Goodput: requests per second that meet both targets, rate * (1 - P(TTFT > target)) * (1 - P(TPOT > target)) (the two
taken as independent); 0 when a queue is unstable.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from planner.capacity_model import (
    PrefillInterference,
    WorkloadStats,
    bisect_quantile,
    decode_load,
    max_decode_context,
    prefill_wait,
    queue_wait,
    shared_gpu_delay,
    tpot_exceed,
    ttft_exceed,
)
from planner.perf_profile import KVHandoff, PerformanceModel, PerformanceProfile, SharedGPU
from planner.plan import DecodeConfig
from planner.slo import SLO
from wire.config import DEFAULT_BATCHED_TOKENS

Kind = Literal["colocated", "disaggregated", "shared_gpu"]


@dataclass(frozen=True)
class Deployment:
    kind: Kind
    num_instances: int
    """colocated: nodes; shared_gpu: GPUs, each with one prefill and one decode process; disaggregated: unused
    (num_prefill + num_decode)."""
    num_prefill: int = 0
    num_decode: int = 0

    @classmethod
    def colocated(cls, num_nodes: int) -> Deployment:
        return cls("colocated", num_nodes)

    @classmethod
    def disaggregated(cls, num_prefill: int, num_decode: int) -> Deployment:
        return cls("disaggregated", num_prefill + num_decode, num_prefill, num_decode)

    @classmethod
    def shared_gpu(cls, num_gpus: int) -> Deployment:
        return cls("shared_gpu", num_gpus, num_gpus, num_gpus)

    @property
    def num_gpus(self) -> int:
        return self.num_instances

    @property
    def label(self) -> str:
        if self.kind == "colocated":
            return f"{self.num_instances} colocated node{'s' if self.num_instances > 1 else ''}"
        if self.kind == "disaggregated":
            return f"{self.num_prefill}P:{self.num_decode}D"
        return f"{self.num_instances}P:{self.num_instances}D sharing {self.num_instances} GPU" + \
            ("s" if self.num_instances > 1 else "")

    def serve_flags(self) -> str:
        """The `corun serve` flags that run it on GPUs 0, 1, ... (local launcher, --device cuda)."""
        if self.kind == "colocated":
            return f"--prefill 0 --decode 0 --colocated {self.num_instances} --colocated-gpus " + \
                gpu_list(0, self.num_instances)
        decode_first_gpu = 0 if self.kind == "shared_gpu" else self.num_prefill
        return (f"--prefill {self.num_prefill} --decode {self.num_decode} --prefill-gpus "
                f"{gpu_list(0, self.num_prefill)} --decode-gpus {gpu_list(decode_first_gpu, self.num_decode)}")


def gpu_list(first: int, count: int) -> str:
    return ",".join(str(first + i) for i in range(count))


@dataclass(frozen=True)
class ClusterModel:
    """What a prediction needs besides the workload: fitted costs, the node shape and the measured hand-offs."""

    performance: PerformanceModel
    node: DecodeConfig
    """N, KV tokens and max_model_len of a decode node, and of a colocated node (one GPU each)."""
    prefill_token_budget: int
    """B: prompt tokens a colocated node prefills between two decode steps while requests decode (0: no limit)."""
    kv_handoff: KVHandoff
    shared_gpu: SharedGPU | None

    @classmethod
    def of(cls, performance: PerformanceModel, profile: PerformanceProfile, node: DecodeConfig,
           prefill_token_budget: int | None = None) -> ClusterModel:
        """prefill_token_budget None: the profile's, else (a profile that did not record it, made before it was
        recorded) the engine's default away from a large GPU (its auto rule: max_num_batched_tokens, 2048 there)."""
        budget = prefill_token_budget if prefill_token_budget is not None else profile.prefill_token_budget
        if budget is None:
            budget = DEFAULT_BATCHED_TOKENS
        if budget < 0:
            raise ValueError(f"the prefill token budget must be >= 0, got {budget}")
        return cls(performance, node, budget, profile.kv_handoff, profile.shared_gpu)


@dataclass(frozen=True)
class Outlook:
    """A deployment's prediction at one rate."""

    deployment: Deployment
    rate: float
    ttft_p99_s: float
    tpot_p99_s: float
    goodput_req_per_s: float
    tok_per_s: float
    """Output tokens per second (every request finishes when the queues are stable)."""
    max_utilization: float
    """The busiest pool: prefill servers, decode slots or KV (colocated: its prefill queue, slots or KV)."""
    token_interval_s: float = math.inf
    """Mean time between two tokens of a decoding row (the step over the share of the GPU it gets)."""

    def meets(self, slo: SLO, max_utilization: float) -> bool:
        return self.ttft_p99_s <= slo.ttft_p99_s and self.tpot_p99_s <= slo.tpot_p99_s and \
            self.max_utilization <= max_utilization

    def to_dict(self) -> dict:
        numbers = {k: round(v, 5) if math.isfinite(v) else None for k, v in dataclasses.asdict(self).items()
                   if isinstance(v, float)}
        return {"deployment": self.deployment.label, "gpus": self.deployment.num_gpus} | numbers


def predict(cluster: ClusterModel, deployment: Deployment, stats: WorkloadStats, slo: SLO) -> Outlook:
    """The deployment at stats.rate."""
    if deployment.kind == "colocated":
        return predict_colocated(cluster, deployment, stats, slo)
    if deployment.kind == "shared_gpu" and cluster.shared_gpu is None:
        raise ValueError("the profile has no shared_gpu measurement: P/D sharing a GPU cannot be predicted")
    return predict_disaggregated(cluster, deployment, stats, slo)


def predict_disaggregated(cluster: ClusterModel, deployment: Deployment, stats: WorkloadStats, slo: SLO) -> Outlook:
    num_prefill, num_decode = deployment.num_prefill, deployment.num_decode
    prefill_s, handoff, interference = stats.prefill_s, cluster.kv_handoff, None
    shared = cluster.shared_gpu if deployment.kind == "shared_gpu" else None
    if shared is not None:
        interference = PrefillInterference(stats.rate / num_prefill, stats.prefill_s,
                                           shared_gpu_delay(shared.prefill_stretch))
        handoff = shared.kv_handoff
    if shared is not None and shared.decode_kv_capacity_tokens is not None:
        cluster = dataclasses.replace(cluster, node=dataclasses.replace(
            cluster.node, kv_capacity_tokens=shared.decode_kv_capacity_tokens))
    load = decode_load(stats, cluster.performance, cluster.node, num_decode, interference)
    if shared is not None:
        prefill_s = prefill_s * (1 + (shared.prefill_stretch - 1) * decoding_probability(load, cluster.node))
    stretched = dataclasses.replace(stats, prefill_s=prefill_s)
    waiting = prefill_wait(stretched, num_prefill)
    prefill_busy = stats.rate * float(prefill_s.mean()) / num_prefill
    exceed = ttft_exceed(stretched, waiting, load.wait, load.cycle_s, handoff.seconds(stats.input_lens))
    return outlook(deployment, stats, slo, cluster, load, num_decode, exceed,
                   max(prefill_busy, load.slot_utilization, load.kv_utilization))


def predict_colocated(cluster: ClusterModel, deployment: Deployment, stats: WorkloadStats, slo: SLO) -> Outlook:
    num_nodes = deployment.num_instances
    prefill_fraction = stats.rate * float(stats.prefill_s.mean()) / num_nodes
    if prefill_fraction >= 1:
        return unstable(deployment, stats)
    load = decode_load(stats, cluster.performance, cluster.node, num_nodes, colocated_interference(cluster, stats,
                                                                                                   num_nodes))
    steps_per_token = 1 / cluster.prefill_token_budget if cluster.prefill_token_budget else 0.0
    service = stats.prefill_s + decoding_probability(load, cluster.node) * steps_per_token * stats.input_lens * \
        load.mean_step_s  # [n]
    mean_service = float(service.mean())
    waiting = queue_wait(num_nodes, stats.rate, mean_service, float(service.var()) / mean_service**2)
    exceed = ttft_exceed(stats, waiting, load.wait, load.mean_step_s, 0.0, service)
    prefill_busy = stats.rate * mean_service / num_nodes
    return outlook(deployment, stats, slo, cluster, load, num_nodes, exceed,
                   max(prefill_busy, load.slot_utilization, load.kv_utilization))


def colocated_interference(cluster: ClusterModel, stats: WorkloadStats, num_nodes: int) -> PrefillInterference:
    """A colocated node's prefills stall its decode steps for their whole time. Between two steps it prefills at
    most one pack of max(budget, chunk) tokens (the scheduler's pack_rows_left), which bounds a row's loss per
    step; with no budget (0) a row waits for every queued prefill."""
    budget = cluster.prefill_token_budget
    most_per_step = float(cluster.performance.prefill.seconds(max(budget, cluster.performance.prefill.chunk_size))) \
        if budget else math.inf
    return PrefillInterference(stats.rate / num_nodes, stats.prefill_s, 1.0, most_per_step)


def decoding_probability(load, node: DecodeConfig) -> float:
    """P(an instance has a request decoding): its number of decoding requests taken as Poisson."""
    return 1 - math.exp(-load.slot_utilization * node.max_num_seqs)


def outlook(deployment: Deployment, stats: WorkloadStats, slo: SLO, cluster: ClusterModel, load, num_decode: int,
            ttft_exceed_at, max_utilization: float) -> Outlook:
    if ttft_exceed_at is None or not load.stable:
        return unstable(deployment, stats)
    ttft_p99 = bisect_quantile(ttft_exceed_at, 0.0, slo.ttft_p99_s)
    decodes = stats.decodes
    tpot_miss = 0.0
    if decodes.any():
        instance_rate = stats.rate * float(decodes.mean()) / num_decode
        tpot_at = tpot_exceed(stats, cluster.performance, instance_rate, load.cycle_s, load.mean_context, num_decode,
                              load.interference, max_decode_context(cluster.node))
        tpot_miss = float(decodes.mean()) * tpot_at(slo.tpot_p99_s)
    good = (1 - ttft_exceed_at(slo.ttft_p99_s)) * (1 - tpot_miss)
    return Outlook(deployment, stats.rate, ttft_p99, load.tpot_p99_s, stats.rate * good,
                   stats.rate * float(stats.output_lens.mean()), max_utilization, load.cycle_s)


def unstable(deployment: Deployment, stats: WorkloadStats) -> Outlook:
    return Outlook(deployment, stats.rate, math.inf, math.inf, 0.0, 0.0, math.inf)


def at_rate(stats: WorkloadStats, rate: float) -> WorkloadStats:
    return dataclasses.replace(stats, rate=rate)


def candidates(num_gpus: int, shared_gpu_measured: bool) -> list[Deployment]:
    """Every deployment on at most num_gpus GPUs: K colocated nodes, P:D with a GPU per node, and (when the profile
    measured it) K GPUs each running a prefill and a decode process."""
    if num_gpus < 1:
        raise ValueError(f"the planner needs at least one GPU, got {num_gpus}")
    found = [Deployment.colocated(k) for k in range(1, num_gpus + 1)]
    found += [Deployment.disaggregated(p, d) for total in range(2, num_gpus + 1) for p in range(1, total)
              for d in [total - p]]
    if shared_gpu_measured:
        found += [Deployment.shared_gpu(k) for k in range(1, num_gpus + 1)]
    return found
