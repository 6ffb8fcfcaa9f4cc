"""A dense decoder-only transformer (Qwen3 and Llama families) over a paged KV cache.

Weights are fused at load time (q/k/v into one projection, gate/up into one) so a step runs few, large GEMMs.
Every op is token-wise except attention, which is request-local (corun/attention.py).

The architecture is written once, over an ops object that holds the glue between the GEMMs (DecoderLM.ops): torch
ops (TorchOps: CPU, and the reference for transformers parity), or on CUDA fused Triton kernels (FusedOps over
corun/kernels/fused_ops.py, DecoderLM.use_fused_kernels), where q/k norm, RoPE and the KV-cache write are one launch.
The residual stream travels as (x, residual) and each norm adds the two first, so both give the same sums (addition
commutes bitwise).
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


class TorchOps:
    """The glue in torch ops: the norms are the modules' own (batch_invariant mode swaps their kernel), the KV
    write is attention()'s."""

    writes_kv = False

    @staticmethod
    def add_rms_norm(x, residual, norm: RMSNorm):
        """-> (norm(residual + x), residual + x); residual None: x is the embedding, nothing to add yet."""
        stream = x if residual is None else residual + x
        return norm(stream), stream

    @staticmethod
    def qk_norm_rope(attn: SelfAttention, q, k, v, cos, sin, kv_layer, meta: AttentionMetadata):
        if attn.q_norm is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    @staticmethod
    def silu_and_mul(gate_up, intermediate_size: int):
        gate, up = gate_up.split(intermediate_size, dim=-1)
        return F.silu(gate) * up


class FusedOps:
    """The glue as fused Triton kernels (corun.kernels.fused_ops): row-wise with a fixed reduction order."""

    writes_kv = True
    """q/k norm and RoPE write k and v to the cache in the same launch."""

    def __init__(self, kernels):
        self.kernels = kernels

    def add_rms_norm(self, x, residual, norm: RMSNorm):
        if residual is None:
            return self.kernels.rms_norm(x, norm.weight, norm.eps), x
        return self.kernels.fused_add_rms_norm(x, residual, norm.weight, norm.eps)

    def qk_norm_rope(self, attn: SelfAttention, q, k, v, cos, sin, kv_layer, meta: AttentionMetadata):
        q_weight, k_weight = (None, None) if attn.q_norm is None else (attn.q_norm.weight, attn.k_norm.weight)
        return self.kernels.qk_norm_rope_write_kv(q, k, v, q_weight, k_weight, cos, sin, attn.rms_norm_eps,
                                                  kv_layer[0], kv_layer[1], meta.slot_blocks, meta.slot_offsets)

    def silu_and_mul(self, gate_up, intermediate_size: int):
        return self.kernels.silu_and_mul(gate_up)


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

    def query_key_value(self, x, cos, sin, kv_layer, meta: AttentionMetadata, ops):
        """-> q, k, v after q/k norm and RoPE (and k, v in the cache when ops.writes_kv)."""
        q, k, v = self.project_qkv(x)
        q, k = ops.qk_norm_rope(self, q, k, v, cos, sin, kv_layer, meta)
        return q, k, v

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

    def forward(self, x, ops=TorchOps):
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x), self.intermediate_size))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelArchConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SelfAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg)

    def attention_inputs(self, x, residual, cos, sin, kv_layer, meta, ops):
        """The layer up to attention -> (q, k, v, residual): the stream (x, residual) added up and normed."""
        hidden, residual = ops.add_rms_norm(x, residual, self.input_layernorm)
        q, k, v = self.self_attn.query_key_value(hidden, cos, sin, kv_layer, meta, ops)
        return q, k, v, residual

    def attention_output(self, attn_out, residual, ops):
        """The layer after attention -> the stream (x, residual) the next layer takes."""
        attn_out = self.self_attn.o_proj(attn_out.reshape(attn_out.shape[0], self.self_attn.q_size))
        hidden, residual = ops.add_rms_norm(attn_out, residual, self.post_attention_layernorm)
        return self.mlp(hidden, ops), residual


class DecoderLM(nn.Module):
    def __init__(self, cfg: ModelArchConfig, max_positions: int):
        super().__init__()
        self.cfg = cfg
        # NOTE: no initial draw: every loader fills the weights (a checkpoint's, or fill_random_). On the meta device
        # (load_model) nn.Embedding's own draw runs through torch's Python references, whose first call imports
        # torch._dynamo: 1.5 s of CPU, a third of a CPU node's start-up
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tied_matmul = F.linear
        self.ops = TorchOps
        """The glue between the GEMMs: TorchOps, or FusedOps when the fused Triton path is on (use_fused_kernels)."""
        with torch.device("cpu"):  # NOTE: real tables under any device (meta: as the embedding's draw above)
            cos, sin = cos_sin_table(cfg, max_positions)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, input_ids, positions, kv_layers, meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: [num_tokens]; kv_layers: per layer (k_cache, v_cache). -> [num_tokens, hidden].

        Written as the pieces around attention (embed, attention_inputs, attend, attention_output, final_norm), so
        that mixed-step modes can capture what lies between two attention calls as CUDA graphs
        (corun/piecewise_graphs.py)."""
        x, residual, cos, sin = self.embed(input_ids, positions)
        for i, kv_layer in enumerate(kv_layers):
            q, k, v, residual = self.layers[i].attention_inputs(x, residual, cos, sin, kv_layer, meta, self.ops)
            x, residual = self.layers[i].attention_output(self.attend(i, q, k, v, kv_layer, meta), residual, self.ops)
        return self.final_norm(x, residual)

    def embed(self, input_ids, positions):
        """-> the stream (x, residual None) and the rows' RoPE tables."""
        x = self.embed_tokens(input_ids)
        return x, None, self.rope_cos[positions].to(x.dtype), self.rope_sin[positions].to(x.dtype)

    def attend(self, i: int, q, k, v, kv_layer, meta: AttentionMetadata):
        return attention(q, k, v, kv_layer[0], kv_layer[1], meta, self.layers[i].self_attn.scale,
                         kv_written=self.ops.writes_kv)

    def final_norm(self, x, residual):
        return self.ops.add_rms_norm(x, residual, self.norm)[0]

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
            self.ops = TorchOps
            return
        from corun.kernels import fused_ops  # NOTE: Triton only on CUDA hosts (and in tests)

        self.ops = FusedOps(fused_ops)

    @property
    def fused_ops(self):
        """corun.kernels.fused_ops when the fused Triton path is on, else None."""
        return self.ops.kernels if isinstance(self.ops, FusedOps) else None
