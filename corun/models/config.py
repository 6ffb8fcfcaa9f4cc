"""Architecture of a dense decoder (Qwen3, Llama, ...) read from an HF config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

RANDOM_WEIGHTS_KEY = "corun_random_weights"
"""config.json key of a random-weight model directory (corun/models/presets.py): {"preset": name, "seed": s}."""


def random_weights_spec(model_dir: str | Path) -> dict | None:
    """{"preset", "seed"} when model_dir is a random-weight model directory (its weights drawn at load time, no
    weight file), else None."""
    config_file = Path(model_dir) / "config.json"
    return json.loads(config_file.read_text()).get(RANDOM_WEIGHTS_KEY) if config_file.is_file() else None


SUPPORTED_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelArchConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool
    """Qwen3 normalises q and k per head before RoPE."""
    attention_bias: bool
    rope_theta: float
    rope_type: str
    rope_scaling: tuple[tuple[str, float], ...]
    """Extra rope parameters (factor, low_freq_factor, ...) as sorted (name, value) pairs."""
    eos_token_ids: tuple[int, ...]

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not divisible by kv heads {self.num_kv_heads}")
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope type {self.rope_type!r} not supported (have {SUPPORTED_ROPE_TYPES})")

    @property
    def rope_params(self) -> dict[str, float]:
        return dict(self.rope_scaling)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelArchConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in {model_dir}")
        hf = json.loads(path.read_text())
        hf["eos_token_id"] = list(eos_token_ids_of(model_dir, hf.get("eos_token_id")))
        return cls.from_hf_dict(hf)

    @classmethod
    def from_hf_dict(cls, hf: dict) -> ModelArchConfig:
        architecture = (hf.get("architectures") or ["?"])[0]
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"architecture {architecture!r} not supported (have {list(SUPPORTED_ARCHITECTURES)})")
        num_heads = hf["num_attention_heads"]
        rope = _rope_settings(hf)
        return cls(
            architecture=architecture,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            qk_norm=SUPPORTED_ARCHITECTURES[architecture] == "qwen3",
            attention_bias=hf.get("attention_bias", False),
            rope_theta=float(rope.pop("rope_theta")),
            rope_type=rope.pop("rope_type"),
            rope_scaling=tuple(sorted((k, float(v)) for k, v in rope.items() if _is_number(v))),
            eos_token_ids=_as_tuple(hf.get("eos_token_id")),
        )


def _rope_settings(hf: dict) -> dict:
    """Merge transformers v5 `rope_parameters` and v4 `rope_theta` + `rope_scaling` into one dict."""
    rope = dict(hf.get("rope_parameters") or {})
    rope.update(hf.get("rope_scaling") or {})
    rope.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    rope["rope_type"] = rope.get("rope_type") or rope.get("type") or "default"
    rope.pop("type", None)
    return rope


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def checkpoint_dtype(model: str | Path) -> str | None:
    """The dtype a checkpoint's config.json names (torch_dtype, or dtype in newer transformers), as EngineConfig
    spells it; None where it names none or there is no such file (a random-weight preset)."""
    path = Path(model) / "config.json"
    if not path.is_file():
        return None
    hf = json.loads(path.read_text())
    named = hf.get("torch_dtype") or hf.get("dtype")
    return named.removeprefix("torch.") if isinstance(named, str) else None


ROPE_TYPES_SCALING_CONTEXT = ("linear",)
"""RoPE types whose `factor` stretches the positions config.json names (vLLM's rule: llama3's
max_position_embeddings is already the scaled one)."""


def context_length(model_dir: str | Path) -> tuple[int, str] | None:
    """The longest sequence a checkpoint is made for, as vLLM derives it, and where it was read: config.json's
    max_position_embeddings (times a linear RoPE's factor), or the tokenizer's model_max_length where that is less.
    None for a directory without config.json."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    hf = json.loads(path.read_text())
    rope = _rope_settings(hf)
    factor = rope.get("factor") if rope["rope_type"] in ROPE_TYPES_SCALING_CONTEXT else None
    positions = hf.get("max_position_embeddings", 2048) * (factor if _is_number(factor) else 1)
    found = int(positions), "max_position_embeddings in config.json" + (f" x RoPE factor {factor:g}" if factor else "")
    tokenizer_config = Path(model_dir) / "tokenizer_config.json"
    if tokenizer_config.is_file():
        most = json.loads(tokenizer_config.read_text()).get("model_max_length")
        if _is_number(most) and most < found[0]:
            found = int(most), "model_max_length in tokenizer_config.json"
    return found


def eos_token_ids_of(model_dir: str | Path, config_eos) -> tuple[int, ...]:
    """A checkpoint's EOS ids: config.json's (config_eos: an int, a list or None) and, like vLLM,
    generation_config.json's (often a list)."""
    generation = Path(model_dir) / "generation_config.json"
    if not generation.is_file():
        return _as_tuple(config_eos)
    extra = _as_tuple(json.loads(generation.read_text()).get("eos_token_id"))
    return tuple(sorted(set(_as_tuple(config_eos) + extra)))


def _as_tuple(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)
