"""Load an HF-format checkpoint (config.json + *.safetensors) into a DecoderLM, fusing projections."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors import safe_open

from corun.models.config import ModelArchConfig, random_weights_spec
from corun.models.decoder import DecoderLM
from corun.models.presets import is_random_spec, preset_config, preset_digest
from corun.models.rope import cos_sin_table

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def safetensors_files(model_dir: str | Path) -> list[Path]:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    return files


def read_checkpoint(model_dir: str | Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


def fuse_projections(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF names -> DecoderLM names: q/k/v and gate/up concatenated along the output dimension."""
    fused = dict(tensors)
    for name in list(tensors):
        for target, parts in FUSED.items():
            for suffix in ("weight", "bias"):
                if name.endswith(f"{parts[0]}.{suffix}"):
                    prefix = name[: -len(f"{parts[0]}.{suffix}")]
                    pieces = [fused.pop(f"{prefix}{p}.{suffix}") for p in parts]
                    fused[f"{prefix}{target}.{suffix}"] = torch.cat(pieces, dim=0)
    return {name.removeprefix("model."): t for name, t in fused.items()}


def load_model(model_dir: str | Path, dtype: str, device: str, max_positions: int) -> DecoderLM:
    if is_random_spec(str(model_dir)):
        return random_model(preset_config(str(model_dir)), dtype, device, max_positions)
    cfg = ModelArchConfig.from_dir(model_dir)
    if (spec := random_weights_spec(model_dir)) is not None:
        return random_model(cfg, dtype, device, max_positions, seed=spec["seed"])
    with torch.device("meta"):
        model = DecoderLM(cfg, max_positions)
    state = fuse_projections(read_checkpoint(model_dir))
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {n for n, _ in model.named_parameters()}
    missing, unexpected = expected - state.keys(), state.keys() - expected
    if missing or unexpected:
        raise ValueError(f"checkpoint mismatch in {model_dir}: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
    model.load_state_dict(state, assign=True, strict=False)
    model = model.to(device=device, dtype=DTYPES[dtype])
    # NOTE: the rope tables stay float32 (the forward casts the rows it uses), as transformers keeps them
    model.rope_cos, model.rope_sin = cos_sin_table(cfg, max_positions)
    model.rope_cos, model.rope_sin = model.rope_cos.to(device), model.rope_sin.to(device)
    return model.eval().requires_grad_(False)


def model_arch(model_dir: str | Path) -> ModelArchConfig:
    return preset_config(str(model_dir)) if is_random_spec(str(model_dir)) else ModelArchConfig.from_dir(model_dir)


def empty_model(model_dir: str | Path, dtype: str, device: str, max_positions: int) -> DecoderLM:
    """The model's modules with no weights (meta tensors of its dtype) and its RoPE tables on device: what a node
    that maps another node's weights fills (corun/shared_weights.py import_weights)."""
    cfg = model_arch(model_dir)
    with torch.device("meta"):
        model = DecoderLM(cfg, max_positions).to(DTYPES[dtype])
    model.rope_cos, model.rope_sin = (t.to(device) for t in cos_sin_table(cfg, max_positions))
    return model.eval().requires_grad_(False)


def random_model(cfg: ModelArchConfig, dtype: str, device: str, max_positions: int, seed: int = 0) -> DecoderLM:
    with torch.device(device):
        model = DecoderLM(cfg, max_positions).to(DTYPES[dtype])
    fill_random_(model, seed)
    model.rope_cos, model.rope_sin = (t.to(device) for t in cos_sin_table(cfg, max_positions))
    return model.eval().requires_grad_(False)


@torch.no_grad()
def fill_random_(model: torch.nn.Module, seed: int = 0) -> None:
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.fill_(1.0)
        else:
            fan_in = param.shape[-1]
            std = 3.0 / fan_in ** 0.5 if "embed" in name or "lm_head" in name else 1.0 / fan_in ** 0.5
            param.normal_(0.0, std, generator=generator)


def model_digest(model_dir: str | Path) -> str:
    """sha256 over config.json and the weight files: part of every compatibility hash and fingerprint."""
    if is_random_spec(str(model_dir)):
        return preset_digest(str(model_dir))
    digest = hashlib.sha256()
    # NOTE: a random-weight directory's weights are a function of its config.json (preset and seed) alone
    weights = [] if random_weights_spec(model_dir) is not None else safetensors_files(model_dir)
    for path in [Path(model_dir) / "config.json", *weights]:
        digest.update(path.name.encode())
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()
