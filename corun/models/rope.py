"""Rotary position embedding tables, following the HF rope types we support."""

from __future__ import annotations

import math

import torch

from corun.models.config import ModelArchConfig


def inverse_frequencies(cfg: ModelArchConfig) -> torch.Tensor:
    """[head_dim // 2] float32, as transformers' ROPE_INIT_FUNCTIONS compute them."""
    exponents = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** exponents)
    params = cfg.rope_params
    if cfg.rope_type == "linear":
        return inv_freq / params["factor"]
    if cfg.rope_type == "llama3":
        return _llama3_scaling(inv_freq, params)
    return inv_freq


def _llama3_scaling(inv_freq: torch.Tensor, params: dict[str, float]) -> torch.Tensor:
    factor = params["factor"]
    low_freq_factor, high_freq_factor = params["low_freq_factor"], params["high_freq_factor"]
    old_context_len = params["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def cos_sin_table(cfg: ModelArchConfig, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two [max_positions, head_dim] float32 tables (frequencies repeated twice, HF's rotate_half layout)."""
    positions = torch.arange(max_positions, dtype=torch.int64).float()
    freqs = torch.outer(positions, inverse_frequencies(cfg))  # [max_positions, head_dim // 2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim]; cos, sin: [tokens, head_dim] in x's dtype."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
