"""CoRun: deterministic LLM inference by controlling execution shapes.

Isolated prefill, fixed-shape decode and request-keyed sampling; see `../shared/reference/design.md`.
"""

import os

from wire.sampling_params import SamplingParams

CPU_BLAS_REPRODUCIBILITY = "AUTO,STRICT"
"""MKL's conditional numerical reproducibility mode for CPU GEMMs (MKL_CBWR), set before the first MKL call.
NOTE: the contract needs a GEMM row's bits not to depend on the row's position at a fixed shape. MKL's default
mode does not give that everywhere: on an Intel AMX host with MKL_ENABLE_INSTRUCTIONS=AVX2 (what an AVX2-only Intel
CPU runs), rows 6-7 of an 8-row sgemm and 30-31 of a 32-row one (the rows past its 6-row kernel blocks) get other
bits than the same input at row 0; STRICT gives every row the same bits there, and changes nothing measured on
AVX-512. A value the user sets is kept (and is part of the fingerprint)."""
os.environ.setdefault("MKL_CBWR", CPU_BLAS_REPRODUCIBILITY)

__all__ = ["SamplingParams", "LLM"]


def __getattr__(name):
    # NOTE: lazy so that `from corun import SamplingParams` never pulls torch in.
    if name == "LLM":
        from corun.llm import LLM

        return LLM
    raise AttributeError(name)
