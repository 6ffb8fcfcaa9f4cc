"""cuBLAS without split-K: EngineConfig.cublas_split_k (off by default).

With split-K, cuBLAS may cut a GEMM's inner dimension across thread blocks for small row counts and add the pieces
afterwards, so a row's reduction order depends on how many rows the GEMM has. Without a workspace it cannot, and a
row's bits stop depending on the step's row count over a wider range: on the H200 (8B shape, bf16) the decode-size
verification then keeps 16-row steps where it kept 128 rows and up with split-K, and the decode GEMMs ran faster
(benchmarks/results/h200_tail_step_profile_no_split_k.json, h200_no_split_k_t0.json). The verification still
decides which sizes are kept.

torch reads the workspace size once per process, when it makes its first cuBLAS handle, so this is a process-wide
setting: it is applied when an engine is built, before CUDA starts (resolved_on_device, corun/device_facts.py, the
first thing an engine or a node does on its device), and what is in effect goes in the fingerprint.
NOTE: torch.use_deterministic_algorithms(True) asks for its own workspace settings (:4096:8, :16:8) and may refuse
cuBLAS calls under this one; CoRun does not need it (its outputs are fixed by shapes), a process that wants it runs
with cublas_split_k on.
"""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)

NO_WORKSPACE = {"CUBLAS_WORKSPACE_CONFIG": ":0:0", "CUBLASLT_WORKSPACE_SIZE": "0"}
"""torch's cuBLAS and cuBLASLt workspaces of 0 bytes: cuBLAS then picks no split-K kernel."""


def split_k_in_effect() -> bool:
    return any(os.environ.get(name) != value for name, value in NO_WORKSPACE.items())


def apply_cublas_split_k(wanted: bool) -> bool:
    """Sets this process's cuBLAS workspace for `wanted` if CUDA has not started; -> the setting in effect (which
    differs from `wanted`, with a warning, where CUDA started first)."""
    if split_k_in_effect() == wanted:
        return wanted
    if torch.cuda.is_initialized():
        logger.warning("cublas_split_k=%s asked after CUDA started in this process; keeping %s (set it before the "
                       "first CUDA call, or set %s in the environment)", wanted, split_k_in_effect(), NO_WORKSPACE)
        return split_k_in_effect()
    for name, value in NO_WORKSPACE.items():
        if wanted:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return wanted
