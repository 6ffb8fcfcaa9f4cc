"""`corun plan --plot FILE.png`: predicted TTFT p99, TPOT p99 and goodput against the arrival rate for the
deployments the recommendation compares. matplotlib is imported here only, when a plot is asked for."""

from __future__ import annotations

import math

import numpy as np

from planner.capacity_model import WorkloadStats
from planner.deployments import ClusterModel, Deployment, Outlook, at_rate, predict
from planner.recommend import Recommendation
from planner.slo import SLO

NUM_RATES = 24


def sweep_rates(recommendation: Recommendation) -> np.ndarray:
    """From near zero to past the largest capacity among the contenders (at least twice the asked rate)."""
    rate = recommendation.chosen.rate
    top = max([2 * rate] + [1.3 * capacity for _, capacity in recommendation.contenders])
    return np.linspace(top / NUM_RATES, top, NUM_RATES)


def rate_sweep(cluster: ClusterModel, stats: WorkloadStats, slo: SLO,
               recommendation: Recommendation) -> dict[Deployment, list[Outlook]]:
    rates = sweep_rates(recommendation)
    return {deployment: [predict(cluster, deployment, at_rate(stats, float(r)), slo) for r in rates]
            for deployment, _ in recommendation.contenders}


def write_plot(path: str, sweeps: dict[Deployment, list[Outlook]], slo: SLO, recommendation: Recommendation,
               title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # NOTE: no display: write the file only
    import matplotlib.pyplot as plt

    figure, (ttft_axis, tpot_axis, goodput_axis) = plt.subplots(1, 3, figsize=(16, 4.8))
    for deployment, outlooks in sweeps.items():
        rates = [o.rate for o in outlooks]
        label = deployment.label + (" (recommended)" if deployment == recommendation.chosen.deployment else "")
        ttft_axis.plot(rates, [finite_ms(o.ttft_p99_s) for o in outlooks], marker=".", label=label)
        tpot_axis.plot(rates, [finite_ms(o.tpot_p99_s) for o in outlooks], marker=".", label=label)
        goodput_axis.plot(rates, [o.goodput_req_per_s for o in outlooks], marker=".", label=label)
    ttft_axis.axhline(1e3 * slo.ttft_p99_s, color="grey", linestyle="--", label="target")
    tpot_axis.axhline(1e3 * slo.tpot_p99_s, color="grey", linestyle="--", label="target")
    ttft_axis.set_ylim(0, 3e3 * slo.ttft_p99_s)
    tpot_axis.set_ylim(0, 3e3 * slo.tpot_p99_s)
    for axis, name in ((ttft_axis, "TTFT p99 (ms)"), (tpot_axis, "TPOT p99 (ms)"),
                       (goodput_axis, "goodput (req/s meeting both targets)")):
        axis.axvline(recommendation.chosen.rate, color="black", linewidth=0.8, linestyle=":")
        axis.set_xlabel("arrival rate (req/s, Poisson)")
        axis.set_ylabel(name)
        axis.grid(alpha=0.3)
    goodput_axis.legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def finite_ms(seconds: float) -> float:
    """Milliseconds; an unstable queue (infinite) is left out of the line."""
    return 1e3 * seconds if math.isfinite(seconds) else math.nan
