"""Latency targets. Every SLO flag of corun takes milliseconds, as `corun bench --goodput ttft:500 tpot:50` does;
the planner's model works in seconds, so the conversion happens here, once."""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_PLAUSIBLE_MS = 1.0
"""NOTE: no served LLM's first token or decode step comes in under a millisecond, so a smaller target is a number of
seconds typed as milliseconds (`--tpot 0.05` once silently meant 50 us): refused rather than planned for."""


def checked_target_ms(name: str, value: float) -> float:
    """A latency target in milliseconds, refused when it cannot be one (not finite, or under MIN_PLAUSIBLE_MS)."""
    if not (math.isfinite(value) and value >= MIN_PLAUSIBLE_MS):
        hint = f" (if {value:g} was seconds: {value * 1e3:g})" if math.isfinite(value) and value > 0 else ""
        raise ValueError(f"{name} is in milliseconds and must be at least {MIN_PLAUSIBLE_MS:g} ms, got {value:g}"
                         f"{hint}")
    return value


@dataclass(frozen=True)
class SLO:
    ttft_p99_s: float
    tpot_p99_s: float
    """Time per output token (the fixed-shape step time), seconds."""

    def __post_init__(self):
        if not (self.ttft_p99_s > 0 and self.tpot_p99_s > 0):
            raise ValueError("the TTFT and TPOT targets must be > 0")

    @classmethod
    def from_ms(cls, ttft_p99_ms: float, tpot_p99_ms: float) -> SLO:
        """The targets as the flags give them (milliseconds), checked to be plausible as milliseconds."""
        return cls(checked_target_ms("the TTFT p99 target", ttft_p99_ms) / 1e3,
                   checked_target_ms("the TPOT p99 target", tpot_p99_ms) / 1e3)

    def describe_ms(self) -> str:
        return f"TTFT p99 <= {1e3 * self.ttft_p99_s:g} ms, TPOT p99 <= {1e3 * self.tpot_p99_s:g} ms"
