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


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_o, num_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    sum_squares = tl.zeros([BLOCK], tl.float32)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < num_cols, other=0.0).to(tl.float32)
        sum_squares += x * x
    inv_rms = 1.0 / tl.sqrt(tl.sum(sum_squares, 0) / num_cols + eps)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < num_cols
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        normed = (x * inv_rms).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * stride_o + cols, w * normed, mask=mask)


def batch_invariant_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, one program per row, one fixed reduction order (HF's float32 formula)."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch.empty_like(rows)
    _rms_norm_kernel[(rows.shape[0],)](rows, weight, out, rows.stride(0), out.stride(0), rows.shape[1], eps,
                                       BLOCK=min(1024, triton.next_power_of_2(rows.shape[1])))
    return out.view(x.shape)


@triton.jit
def _log_softmax_kernel(x_ptr, out_ptr, stride_x, stride_o, num_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    running_max = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < num_cols, other=float("-inf")).to(tl.float32)
        running_max = tl.maximum(running_max, x)
    row_max = tl.max(running_max, 0)
    sum_exp = tl.zeros([BLOCK], tl.float32)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < num_cols, other=float("-inf")).to(tl.float32)
        sum_exp += tl.exp(x - row_max)
    log_sum = tl.log(tl.sum(sum_exp, 0)) + row_max
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < num_cols
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_o + cols, x - log_sum, mask=mask)


def batch_invariant_log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax over the last dim of [rows, vocab] float32, one program per row, fixed order."""
    out = torch.empty_like(logits, dtype=torch.float32)
    _log_softmax_kernel[(logits.shape[0],)](logits, out, logits.stride(0), out.stride(0), logits.shape[1],
                                            BLOCK=1024)
    return out
