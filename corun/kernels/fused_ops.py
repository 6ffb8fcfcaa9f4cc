"""Fused Triton kernels for a decoder layer's token-wise glue (CUDA), as vLLM's and SGLang's custom ops.

In torch, one decode step of a Qwen3-8B-shaped model launches ~50 small kernels per layer beside the GEMMs and
attention: RMSNorm as seven ops, the q/k norms, RoPE through cat/mul/add, the residual adds, silu * mul and two
index_put for the KV write. Here that glue is four launches per layer:

- fused_add_rms_norm: the residual add fused into the next RMSNorm (before attention, before the MLP, and the
  model's final norm); rms_norm is the same kernel without a residual (the first layer's input norm);
- qk_norm_rope_write_kv: per token, Qwen3's per-head q/k RMSNorm, RoPE (HF rotate_half layout) and the K/V
  cache write, in one program; qk_norm_rope is the same kernel without the write;
- silu_and_mul: the gated MLP's activation.

Batch invariance: every kernel is elementwise or reduces inside one program over one row (a token's hidden
vector, or one head of it) held whole in one block. Block shapes and num_warps follow from the row length alone,
so a row's reduction order, and with it its bits, never depends on how many rows share the launch. So the kernels
serve every mode, batch_invariant included.

Rounding follows the torch path (corun/models/decoder.py, rope.py): norm statistics in float32, and a round to
the model dtype wherever torch rounds (torch computes each elementwise op of a low-precision dtype in float32 and
rounds the result; so do these kernels). What differs is the order of the norms' sum of squares, the
implementations of exp and rsqrt and, on CUDA, the compiler's multiply-add contraction (seen on the H200: RoPE
alone is not bitwise torch's there), so results agree with torch to a few ulps, not bitwise. Only the residual
add is bitwise torch's.

Graph-capturable: outputs come from torch.empty, grids depend only on shapes, nothing syncs with the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SILU_BLOCK = 1024
"""Columns per program of silu_and_mul (elementwise, so it only sets the grid)."""
QK_NUM_WARPS = 4


@triton.jit
def _add_rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
                         stride_x, stride_r, stride_o, stride_ro, num_cols, eps,
                         HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < num_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        # NOTE: the sum rounded to the input dtype, as torch's `x + residual`: it is the next residual stream.
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * stride_ro + cols, x, mask=mask)
    x = x.to(tl.float32)
    inv_rms = tl.math.rsqrt(tl.sum(x * x, 0) / num_cols + eps)
    # NOTE: normalized values are rounded to the input dtype before the weight multiplies them (transformers).
    normed = (x * inv_rms).to(x_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (weight * normed).to(out_ptr.dtype.element_ty), mask=mask)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: [..., hidden] -> (RMSNorm(x + residual), x + residual); the sum in x's dtype."""
    return _launch_rms_norm(x, residual, weight, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, one program per row (decoder.RMSNorm's float32 formula)."""
    return _launch_rms_norm(x, None, weight, eps)[0]


def _launch_rms_norm(x, residual, weight, eps):
    rows = _as_rows(x)
    num_rows, num_cols = rows.shape
    # NOTE: torch's `weight * normed` promotes; the model keeps both in its dtype, so this is x's dtype there.
    out = torch.empty(num_rows, num_cols, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    residual_rows = _as_rows(residual) if residual is not None else rows
    residual_out = torch.empty_like(rows) if residual is not None else rows
    if num_rows:
        block = triton.next_power_of_2(num_cols)
        _add_rms_norm_kernel[(num_rows,)](
            rows, residual_rows, weight, out, residual_out,
            rows.stride(0), residual_rows.stride(0), out.stride(0), residual_out.stride(0), num_cols, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=_row_warps(block))
    new_residual = residual_out.view(x.shape) if residual is not None else None
    return out.view(*x.shape[:-1], num_cols), new_residual


def _row_warps(block: int) -> int:
    # NOTE: a function of the row length only: the warp count shapes the in-block reduction tree, so it must
    # never follow the number of rows.
    return max(1, min(8, block // 256))


@triton.jit
def _norm_rope(x1, x2, weight_ptr, cos1, sin1, cos2, sin2, dims, dim_mask, eps,
               HALF: tl.constexpr, HAS_NORM: tl.constexpr):
    """One tensor's heads of one token: x1, x2 are the halves [HEADS_PAD, HALF_PAD] of every head's vector (the
    rotate_half pairs), cos*/sin* the matching halves [HALF_PAD] of the token's rows. -> the two output halves."""
    dtype = x1.dtype
    if HAS_NORM:
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        mean_square = (tl.sum(f1 * f1, 1) + tl.sum(f2 * f2, 1)) / (2 * HALF)
        inv_rms = tl.math.rsqrt(mean_square + eps)[:, None]
        w1 = tl.load(weight_ptr + dims, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(weight_ptr + HALF + dims, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
        x1 = (w1 * (f1 * inv_rms).to(dtype).to(tl.float32)).to(dtype)
        x2 = (w2 * (f2 * inv_rms).to(dtype).to(tl.float32)).to(dtype)
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    # NOTE: apply_rope computes `x * cos + rotate_half(x) * sin` in the model dtype: both products and the sum
    # are rounded there, so they are here (rotate_half's negation is exact, so `- b` equals `+ (-x2) * sin`).
    out1 = (f1 * cos1).to(dtype).to(tl.float32) - (f2 * sin1).to(dtype).to(tl.float32)
    out2 = (f2 * cos2).to(dtype).to(tl.float32) + (f1 * sin2).to(dtype).to(tl.float32)
    return out1.to(dtype), out2.to(dtype)


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr, k_ptr, v_ptr, q_weight_ptr, k_weight_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
    k_cache_ptr, v_cache_ptr, slot_blocks_ptr, slot_offsets_ptr, eps,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos, stride_sin,
    stride_qot, stride_qoh, stride_kot, stride_koh, stride_cache_block, stride_cache_slot, stride_cache_head,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, Q_HEADS_PAD: tl.constexpr, KV_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, HAS_NORM: tl.constexpr, WRITE_KV: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    dims = tl.arange(0, HALF_PAD)
    dim_mask = dims < HALF
    cos1 = tl.load(cos_ptr + token * stride_cos + dims, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
    cos2 = tl.load(cos_ptr + token * stride_cos + HALF + dims, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
    sin1 = tl.load(sin_ptr + token * stride_sin + dims, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
    sin2 = tl.load(sin_ptr + token * stride_sin + HALF + dims, mask=dim_mask, other=0.0).to(tl.float32)[None, :]

    q_heads = tl.arange(0, Q_HEADS_PAD)
    q_mask = (q_heads < NUM_Q_HEADS)[:, None] & dim_mask[None, :]
    q_in = q_ptr + token * stride_qt + q_heads[:, None] * stride_qh + dims[None, :]
    q1 = tl.load(q_in, mask=q_mask, other=0.0)
    q2 = tl.load(q_in + HALF, mask=q_mask, other=0.0)
    q1, q2 = _norm_rope(q1, q2, q_weight_ptr, cos1, sin1, cos2, sin2, dims, dim_mask, eps, HALF, HAS_NORM)
    q_out = q_out_ptr + token * stride_qot + q_heads[:, None] * stride_qoh + dims[None, :]
    tl.store(q_out, q1, mask=q_mask)
    tl.store(q_out + HALF, q2, mask=q_mask)

    kv_heads = tl.arange(0, KV_HEADS_PAD)
    kv_mask = (kv_heads < NUM_KV_HEADS)[:, None] & dim_mask[None, :]
    k_in = k_ptr + token * stride_kt + kv_heads[:, None] * stride_kh + dims[None, :]
    k1 = tl.load(k_in, mask=kv_mask, other=0.0)
    k2 = tl.load(k_in + HALF, mask=kv_mask, other=0.0)
    k1, k2 = _norm_rope(k1, k2, k_weight_ptr, cos1, sin1, cos2, sin2, dims, dim_mask, eps, HALF, HAS_NORM)
    k_out = k_out_ptr + token * stride_kot + kv_heads[:, None] * stride_koh + dims[None, :]
    tl.store(k_out, k1, mask=kv_mask)
    tl.store(k_out + HALF, k2, mask=kv_mask)

    if WRITE_KV:  # write_kv's k_cache[slot_blocks, slot_offsets] = k (and v), for this token's slot
        block = tl.load(slot_blocks_ptr + token).to(tl.int64)
        offset = tl.load(slot_offsets_ptr + token).to(tl.int64)
        slot = block * stride_cache_block + offset * stride_cache_slot
        cache = slot + kv_heads[:, None] * stride_cache_head + dims[None, :]
        tl.store(k_cache_ptr + cache, k1, mask=kv_mask)
        tl.store(k_cache_ptr + cache + HALF, k2, mask=kv_mask)
        v_in = v_ptr + token * stride_vt + kv_heads[:, None] * stride_vh + dims[None, :]
        tl.store(v_cache_ptr + cache, tl.load(v_in, mask=kv_mask, other=0.0), mask=kv_mask)
        tl.store(v_cache_ptr + cache + HALF, tl.load(v_in + HALF, mask=kv_mask, other=0.0), mask=kv_mask)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                 cos: torch.Tensor, sin: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [tokens, heads, head_dim], k: [tokens, kv_heads, head_dim] (strided views of the qkv output allowed,
    last dim contiguous); q_weight, k_weight: [head_dim] per-head RMSNorm weights (Qwen3) or None (Llama: no
    q/k norm); cos, sin: [tokens, head_dim] in q's dtype. -> (q, k) normed and rotated, new contiguous tensors."""
    return _launch_qk(q, k, None, q_weight, k_weight, cos, sin, eps, None)


def qk_norm_rope_write_kv(q, k, v, q_weight, k_weight, cos, sin, eps: float, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, slot_blocks: torch.Tensor,
                          slot_offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """qk_norm_rope, and the rotated k and v written to the paged cache as attention.write_kv does.

    v: [tokens, kv_heads, head_dim]; k_cache, v_cache: [num_blocks, block_size, kv_heads, head_dim] with the same
    strides (PagedKVCache's per-layer views); slot_blocks, slot_offsets: [tokens] int, each token's cache slot."""
    if v_cache.stride() != k_cache.stride():
        raise ValueError("k_cache and v_cache must share strides (PagedKVCache's per-layer views do)")
    return _launch_qk(q, k, v, q_weight, k_weight, cos, sin, eps, (k_cache, v_cache, slot_blocks, slot_offsets))


def _launch_qk(q, k, v, q_weight, k_weight, cos, sin, eps, kv_write):
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if (q_weight is None) != (k_weight is None):
        raise ValueError("q and k norms come together (Qwen3) or not at all (Llama)")
    if head_dim % 2 or q.stride(-1) != 1 or k.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError("need an even head_dim and contiguous last dims")
    q_out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
    k_out = torch.empty(num_tokens, num_kv_heads, head_dim, dtype=k.dtype, device=k.device)
    if not num_tokens:
        return q_out, k_out
    has_norm = q_weight is not None
    # NOTE: Triton needs real tensors for unused pointer arguments; the constexpr flags keep them unread.
    k_cache, v_cache, slot_blocks, slot_offsets = kv_write if kv_write is not None else (q, q, q, q)
    v = v if v is not None else k
    cache_strides = k_cache.stride()[:3] if kv_write is not None else (0, 0, 0)
    half = head_dim // 2
    _qk_norm_rope_kernel[(num_tokens,)](
        q, k, v, q_weight if has_norm else q, k_weight if has_norm else k, cos, sin, q_out, k_out,
        k_cache, v_cache, slot_blocks, slot_offsets, eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), sin.stride(0),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), *cache_strides,
        NUM_Q_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, Q_HEADS_PAD=triton.next_power_of_2(num_heads),
        KV_HEADS_PAD=triton.next_power_of_2(num_kv_heads), HALF=half, HALF_PAD=triton.next_power_of_2(half),
        HAS_NORM=has_norm, WRITE_KV=kv_write is not None, num_warps=QK_NUM_WARPS)
    return q_out, k_out


@triton.jit
def _silu_and_mul_kernel(gate_up_ptr, out_ptr, stride_in, stride_out, size, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < size
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + size + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    # NOTE: torch's F.silu(gate) * up: silu (x / (1 + exp(-x)), as torch writes it) rounded to the input dtype,
    # then the product rounded again.
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (silu * up).to(dtype), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [..., 2 * I] (gate first, up second) -> silu(gate) * up: [..., I] in gate_up's dtype."""
    rows = _as_rows(gate_up)
    num_rows, size = rows.shape[0], rows.shape[1] // 2
    out = torch.empty(num_rows, size, dtype=gate_up.dtype, device=gate_up.device)
    if num_rows:
        block = min(SILU_BLOCK, triton.next_power_of_2(size))
        _silu_and_mul_kernel[(num_rows, triton.cdiv(size, block))](
            rows, out, rows.stride(0), out.stride(0), size, BLOCK=block)
    return out.view(*gate_up.shape[:-1], size)


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    """[..., cols] -> [rows, cols] with a contiguous last dim (a view whenever the layout allows)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()
