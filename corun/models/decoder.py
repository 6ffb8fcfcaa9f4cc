"""A dense decoder-only transformer (Qwen3 and Llama families) over a paged KV cache.

Weights are fused at load time (q/k/v into one projection, gate/up into one) so a step runs few, large GEMMs.
Every op is token-wise except attention, which is request-local (corun/attention.py).
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

    def forward(self, x, cos, sin, kv_layer, meta: AttentionMetadata):
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attention(q, k, v, kv_layer[0], kv_layer[1], meta, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class GatedMLP(nn.Module):
    def __init__(self, cfg: ModelArchConfig):
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


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


class DecoderLM(nn.Module):
    def __init__(self, cfg: ModelArchConfig, max_positions: int):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tied_matmul = F.linear
        cos, sin = cos_sin_table(cfg, max_positions)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, input_ids, positions, kv_layers, meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: [num_tokens]; kv_layers: per layer (k_cache, v_cache). -> [num_tokens, hidden]."""
        x = self.embed_tokens(input_ids)
        cos = self.rope_cos[positions].to(x.dtype)  # [num_tokens, head_dim]
        sin = self.rope_sin[positions].to(x.dtype)
        for layer, kv_layer in zip(self.layers, kv_layers):
            x = layer(x, cos, sin, kv_layer, meta)
        return self.norm(x)

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
