"""The deployment `corun plan` recommends for a workload, rate and SLO on the GPUs it is given, and why, in a few lines.

Rule: of the candidates (planner/deployments.py) that meet both targets at the rate with no pool busier than
max_utilization, the one on the fewest GPUs; among those, the one with the most room to grow (the highest rate at
which it still meets the SLO). When none meets the SLO, the one with the most predicted goodput (ties: more GPUs),
said plainly. So the recommendation meets the SLO whenever any candidate does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.capacity_model import WorkloadStats
from planner.deployments import ClusterModel, Deployment, Outlook, at_rate, candidates, predict
from planner.slo import SLO

KIND_NAMES = {"colocated": "colocated nodes", "disaggregated": "P/D, a GPU per node",
              "shared_gpu": "P/D sharing GPUs"}


@dataclass(frozen=True)
class Recommendation:
    chosen: Outlook
    meets_slo: bool
    outlooks: tuple[Outlook, ...]
    """Every candidate at the rate."""
    capacity_req_per_s: float
    """The highest rate at which the chosen deployment still meets the SLO (0: none)."""
    summary: tuple[str, ...]
    contenders: tuple[tuple[Deployment, float], ...]
    """The chosen deployment and the best of each other kind, each with its capacity (the rate it meets the SLO up
    to): what the summary compares and the plot draws."""

    def to_dict(self) -> dict:
        return {"deployment": self.chosen.deployment.label, "kind": self.chosen.deployment.kind,
                "gpus": self.chosen.deployment.num_gpus, "num_colocated": self.colocated_count,
                "num_prefill": self.chosen.deployment.num_prefill, "num_decode": self.chosen.deployment.num_decode,
                "serve_flags": self.chosen.deployment.serve_flags(), "meets_slo": self.meets_slo,
                "capacity_req_per_s": round(self.capacity_req_per_s, 3), "prediction": self.chosen.to_dict(),
                "summary": list(self.summary),
                "contenders": [{"deployment": d.label, "capacity_req_per_s": round(c, 3)} for d, c in self.contenders],
                "candidates": [o.to_dict() for o in self.outlooks]}

    @property
    def colocated_count(self) -> int:
        return self.chosen.deployment.num_instances if self.chosen.deployment.kind == "colocated" else 0


def best_of(outlooks, slo: SLO, max_utilization: float, capacity_of) -> tuple[Outlook, bool]:
    """(the pick, whether it meets the SLO): fewest GPUs meeting it, then the most room to grow (capacity_of: the
    highest rate a deployment meets the SLO at); else the most goodput (ties: more GPUs)."""
    meeting = [o for o in outlooks if o.meets(slo, max_utilization)]
    if meeting:
        fewest = min(o.deployment.num_gpus for o in meeting)
        tied = [o for o in meeting if o.deployment.num_gpus == fewest]
        return max(tied, key=lambda o: capacity_of(o.deployment)), True
    return max(outlooks, key=lambda o: (o.goodput_req_per_s, o.deployment.num_gpus)), False


def recommend(cluster: ClusterModel, stats: WorkloadStats, slo: SLO, num_gpus: int,
              max_utilization: float = 0.9) -> Recommendation:
    outlooks = tuple(predict(cluster, deployment, stats, slo)
                     for deployment in candidates(num_gpus, cluster.shared_gpu is not None))
    capacities: dict[Deployment, float] = {}

    def capacity_of(deployment: Deployment) -> float:
        if deployment not in capacities:
            capacities[deployment] = max_meeting_rate(cluster, deployment, stats, slo, max_utilization)
        return capacities[deployment]

    chosen, meets = best_of(outlooks, slo, max_utilization, capacity_of)
    others = [best_of([o for o in outlooks if o.deployment.kind == kind], slo, max_utilization, capacity_of)
              for kind in KIND_NAMES if kind != chosen.deployment.kind and
              any(o.deployment.kind == kind for o in outlooks)]
    lines = summary_lines(chosen, meets, others, slo, num_gpus, capacity_of, cluster)
    contenders = tuple((o.deployment, capacity_of(o.deployment)) for o in [chosen] + [o for o, _ in others])
    return Recommendation(chosen, meets, outlooks, capacity_of(chosen.deployment), tuple(lines), contenders)


def max_meeting_rate(cluster: ClusterModel, deployment: Deployment, stats: WorkloadStats, slo: SLO,
                     max_utilization: float, rel_precision: float = 0.02) -> float:
    """The highest rate at which the deployment meets the SLO (bisection in log rate; 0 when it meets it nowhere
    near the workload's rate)."""
    def meets(rate: float) -> bool:
        return predict(cluster, deployment, at_rate(stats, rate), slo).meets(slo, max_utilization)

    low, high = stats.rate, stats.rate
    if meets(low):
        while meets(high):
            low, high = high, 2 * high
    else:
        while not meets(low):
            if low < stats.rate / 1024:
                return 0.0
            low, high = low / 2, low
    while high / low > 1 + rel_precision:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if meets(middle) else (low, middle)
    return low


def summary_lines(chosen: Outlook, meets: bool, others: list[tuple[Outlook, bool]], slo: SLO, num_gpus: int,
                  capacity_of, cluster: ClusterModel) -> list[str]:
    """others: the best of each other kind, and whether it meets the SLO."""
    deployment, rate = chosen.deployment, chosen.rate
    if meets:
        lines = [f"Recommended: {deployment.label} on {deployment.num_gpus} of {num_gpus} GPU(s) (corun serve "
                 f"{deployment.serve_flags()}): the fewest GPUs that meet {slo.describe_ms()} at {rate:g} req/s."]
    else:
        lines = [f"No deployment on {num_gpus} GPU(s) meets {slo.describe_ms()} at {rate:g} req/s; the most "
                 f"goodput: {deployment.label} (corun serve {deployment.serve_flags()})."]
    capacity = capacity_of(deployment)
    lines.append(f"Predicted there: {describe(chosen)}; it meets the SLO up to about {capacity:.3g} req/s."
                 if capacity else f"Predicted there: {describe(chosen)}.")
    for best, best_meets in others:
        why_not = verdict(best, best_meets, chosen, slo, capacity_of)
        lines.append(f"Best of {KIND_NAMES[best.deployment.kind]}: {best.deployment.label}, {why_not}.")
    if deployment.kind != "colocated":
        handoff = cluster.shared_gpu.kv_handoff if deployment.kind == "shared_gpu" else cluster.kv_handoff
        lines.append(f"KV hand-off per request: {1e3 * handoff.per_request_s:.3g} ms + "
                     f"{1e6 * handoff.per_token_s:.3g} us per prompt token ({handoff.source}).")
    return lines


def describe(outlook: Outlook) -> str:
    if not math.isfinite(outlook.ttft_p99_s):
        return "a queue grows without bound (unstable)"
    return (f"TTFT p99 {1e3 * outlook.ttft_p99_s:.0f} ms, TPOT p99 {1e3 * outlook.tpot_p99_s:.1f} ms, busiest pool "
            f"{100 * outlook.max_utilization:.0f}%, goodput {outlook.goodput_req_per_s:.3g} req/s")


def verdict(other: Outlook, other_meets: bool, chosen: Outlook, slo: SLO, capacity_of) -> str:
    """Why another deployment was not picked."""
    slo_line = "meets the SLO"
    if other_meets:
        if other.deployment.num_gpus > chosen.deployment.num_gpus:
            return f"{slo_line} but needs {other.deployment.num_gpus} GPUs"
        return f"{slo_line} on as many GPUs, up to about {capacity_of(other.deployment):.3g} req/s only"
    if not math.isfinite(other.ttft_p99_s):
        return "unstable at this rate (a queue grows without bound)"
    misses = [f"{name} p99 {1e3 * value:.1f} ms > {1e3 * target:g} ms" for name, value, target in
              (("TTFT", other.ttft_p99_s, slo.ttft_p99_s), ("TPOT", other.tpot_p99_s, slo.tpot_p99_s))
              if value > target]
    return "misses " + ("; ".join(misses) if misses else "the utilisation cap") + \
        f" (goodput {other.goodput_req_per_s:.3g} req/s)"
