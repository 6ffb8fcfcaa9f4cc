"""A batch-invariant matmul in Triton: one fixed tiling for every shape, no split-K.

The batch-invariant baseline (Thinking Machines' batch_invariant_ops, vLLM's VLLM_BATCH_INVARIANT): each output
tile reduces over the whole K dimension in the same BLOCK_K steps whatever M is, so a row's result never depends
on how many rows share the call. cuBLAS instead picks tiles and split-K from the shape (invariance-measured.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CONFIG = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                   stride_cm, stride_cn, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None].to(tl.int64) * stride_am + ks[None, :] * stride_ak
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :].to(tl.int64) * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = (k0 + ks) < K
        a = tl.load(a_ptrs, mask=(rows[:, None] < M) & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    c_ptrs = c_ptr + rows[:, None].to(tl.int64) * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def batch_invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) with a fixed tiling: x [..., K], weight [N, K] -> [..., N]."""
    a = x.reshape(-1, x.shape[-1])
    num_rows, num_cols, depth = a.shape[0], weight.shape[0], a.shape[1]
    out = torch.empty(num_rows, num_cols, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(num_rows, CONFIG["BLOCK_M"]), triton.cdiv(num_cols, CONFIG["BLOCK_N"]))
    _matmul_kernel[grid](
        a, weight, out, bias if bias is not None else out, num_rows, num_cols, depth,
        a.stride(0), a.stride(1), weight.stride(1), weight.stride(0), out.stride(0), out.stride(1),
        HAS_BIAS=bias is not None, PRECISION="ieee" if x.dtype == torch.float32 else "tf32", **CONFIG)
    return out.reshape(*x.shape[:-1], num_cols)
