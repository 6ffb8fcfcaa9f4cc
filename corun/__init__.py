"""CoRun: deterministic LLM inference by controlling execution shapes.

Isolated prefill, fixed-shape decode and request-keyed sampling; see `../shared/reference/design.md`.
"""

from wire.sampling_params import SamplingParams

__all__ = ["SamplingParams", "LLM"]


def __getattr__(name):
    # NOTE: lazy so that `from corun import SamplingParams` never pulls torch in.
    if name == "LLM":
        from corun.llm import LLM

        return LLM
    raise AttributeError(name)
