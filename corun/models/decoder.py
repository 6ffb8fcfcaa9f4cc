"""A dense decoder-only transformer (Qwen3 and Llama families) over a paged KV cache.

Weights are fused at load time (q/k/v into one projection, gate/up into one) so a step runs few, large GEMMs.
Every op is token-wise except attention, which is request-local (corun/attention.py).

Two implementations of the glue between the GEMMs: torch ops (CPU, and the reference for transformers parity),
and on CUDA fused Triton kernels (corun/kernels/fused_ops.py, DecoderLM.use_fused_kernels), where the residual
add moves into the next norm and q/k norm, RoPE and the KV-cache write are one launch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from corun.attention import AttentionMetadata, attention
from corun.models.config import ModelArchConfig
from corun.models.rope import apply_rope, cos_sin_table


class Linear(nn.Linear):
    """nn.Linear whose matmul can be swapped for the batch-invariant kernel (batch_invariant mode)."""

    matmul = staticmethod(F.linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    kernel = None
    """batch_invariant mode: a row-wise kernel with one fixed reduction order, kernel(x, weight, eps)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None:
            return self.kernel(x, self.weight, self.eps)
        # NOTE: computed in float32 and cast back, exactly as transformers does, for logit parity.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelArchConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim ** -0.5
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.rms_norm_eps = cfg.rms_norm_eps

    def forward(self, x, cos, sin, kv_layer, meta: AttentionMetadata):
        q, k, v = self.project_qkv(x)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attention(q, k, v, kv_layer[0], kv_layer[1], meta, self.scale)
        return self.o_proj(out.reshape(x.shape[0], self.q_size))

    def forward_fused(self, x, cos, sin, kv_layer, meta: AttentionMetadata, ops):
        """forward with q/k norm, RoPE and the KV-cache write in one kernel; ops: corun.kernels.fused_ops."""
        q, k, v = self.project_qkv(x)
        q_weight, k_weight = (None, None) if self.q_norm is None else (self.q_norm.weight, self.k_norm.weight)
        q, k = ops.qk_norm_rope_write_kv(q, k, v, q_weight, k_weight, cos, sin, self.rms_norm_eps, kv_layer[0],
                                         kv_layer[1], meta.slot_blocks, meta.slot_offsets)
        out = attention(q, k, v, kv_layer[0], kv_layer[1], meta, self.scale, kv_written=True)
        return self.o_proj(out.reshape(x.shape[0], self.q_size))

    def project_qkv(self, x):
        """x: [tokens, hidden] -> q [tokens, heads, head_dim], k, v [tokens, kv_heads, head_dim] (views)."""
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        return q, k, v


class GatedMLP(nn.Module):
    def __init__(self, cfg: ModelArchConfig):
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)

    def forward_fused(self, x, ops):
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelArchConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SelfAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg)

    def forward(self, x, cos, sin, kv_layer, meta):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_layer, meta)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_fused(self, x, residual, cos, sin, kv_layer, meta, ops):
        """The fused path's layer: -> (MLP output, residual stream before it), left for the next norm to add, as
        forward's `x + mlp(...)` would (the same sum: addition commutes bitwise). residual None: x is the
        embedding, with nothing to add yet. ops: corun.kernels.fused_ops."""
        if residual is None:
            hidden, residual = ops.rms_norm(x, self.input_layernorm.weight, self.input_layernorm.eps), x
        else:
            hidden, residual = ops.fused_add_rms_norm(x, residual, self.input_layernorm.weight,
                                                      self.input_layernorm.eps)
        attn_out = self.self_attn.forward_fused(hidden, cos, sin, kv_layer, meta, ops)
        hidden, residual = ops.fused_add_rms_norm(attn_out, residual, self.post_attention_layernorm.weight,
                                                  self.post_attention_layernorm.eps)
        return self.mlp.forward_fused(hidden, ops), residual


class DecoderLM(nn.Module):
    def __init__(self, cfg: ModelArchConfig, max_positions: int):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tied_matmul = F.linear
        self.fused_ops = None
        """corun.kernels.fused_ops when the fused Triton path is on (use_fused_kernels), else None (torch ops)."""
        cos, sin = cos_sin_table(cfg, max_positions)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, input_ids, positions, kv_layers, meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: [num_tokens]; kv_layers: per layer (k_cache, v_cache). -> [num_tokens, hidden]."""
        x = self.embed_tokens(input_ids)
        cos = self.rope_cos[positions].to(x.dtype)  # [num_tokens, head_dim]
        sin = self.rope_sin[positions].to(x.dtype)
        if self.fused_ops is not None:
            return self.forward_fused(x, cos, sin, kv_layers, meta)
        for layer, kv_layer in zip(self.layers, kv_layers, strict=True):
            x = layer(x, cos, sin, kv_layer, meta)
        return self.norm(x)

    def forward_fused(self, x, cos, sin, kv_layers, meta: AttentionMetadata) -> torch.Tensor:
        """x: the embedded tokens; each layer hands back (its MLP output, the residual stream) and the next norm
        (the final one after the last layer) adds the two."""
        ops, residual = self.fused_ops, None
        for layer, kv_layer in zip(self.layers, kv_layers, strict=True):
            x, residual = layer.forward_fused(x, residual, cos, sin, kv_layer, meta, ops)
        if residual is None:  # NOTE: no layers: x is still the embedding
            return ops.rms_norm(x, self.norm.weight, self.norm.eps)
        return ops.fused_add_rms_norm(x, residual, self.norm.weight, self.norm.eps)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [rows, hidden] -> [rows, vocab] float32."""
        if self.lm_head is None:
            return self.tied_matmul(hidden, self.embed_tokens.weight).float()
        return self.lm_head(hidden).float()

    def use_batch_invariant_kernels(self, matmul, rms_norm) -> None:
        """Swap every projection's matmul (and the tied lm head's) and every RMSNorm for fixed-order kernels."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.matmul = matmul
            elif isinstance(module, RMSNorm):
                module.kernel = rms_norm
        self.tied_matmul = matmul

    def use_fused_kernels(self, enabled: bool = True) -> None:
        """Run the glue between the GEMMs (norms, residual adds, q/k norm + RoPE + KV write, silu * mul) as fused
        Triton kernels (CUDA; Triton's interpreter in CPU tests). Those are row-wise with a fixed reduction
        order, so they serve every mode; in batch_invariant mode they take over from the RMSNorm kernel swap.
        enabled=False returns to the torch ops."""
        if not enabled:
            self.fused_ops = None
            return
        from corun.kernels import fused_ops  # NOTE: Triton only on CUDA hosts (and in tests)

        self.fused_ops = fused_ops
