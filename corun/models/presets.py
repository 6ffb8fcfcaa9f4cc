"""Random-weight models by name (`random:qwen3-8b`): benchmark shapes without a checkpoint on disk.

Weights are drawn on the target device from a seeded generator (corun/models/loader.py fill_random_), so a 16 GB
model needs no file and no copy. The shape is the real model's; the values are noise scaled like the tiny model's
(peaked enough to sample).

Imports no torch: the launcher reads a preset's context here (corun/models/context.py) before any node starts.
"""

from __future__ import annotations

import hashlib
import json

from corun.models.config import RANDOM_WEIGHTS_KEY, ModelArchConfig

RANDOM_PREFIX = "random:"
PRESETS = {
    "qwen3-8b": {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 4096,
                 "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
                 "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False},
    "qwen3-tiny": {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 2048, "hidden_size": 256,
                   "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 8,
                   "num_key_value_heads": 4, "head_dim": 32, "max_position_embeddings": 2048,
                   "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True},
}


def is_random_spec(model: str) -> bool:
    return model.startswith(RANDOM_PREFIX)


def preset_config(model: str) -> ModelArchConfig:
    name = model.removeprefix(RANDOM_PREFIX)
    if name not in PRESETS:
        raise ValueError(f"unknown random model {name!r} (have {sorted(PRESETS)})")
    return ModelArchConfig.from_hf_dict(PRESETS[name])


def preset_digest(model: str) -> str:
    return hashlib.sha256(json.dumps(PRESETS[model.removeprefix(RANDOM_PREFIX)], sort_keys=True).encode()).hexdigest()


END_OF_TEXT = "<|endoftext|>"


def make_random_model_dir(preset: str, out_dir, seed: int = 0):
    """config.json, tokenizer files and generation_config.json of preset; -> the directory. Its weights are drawn
    at load time (no weight file: a 16 GB model in a few KB), so it is served like a checkpoint: the router reads
    its tokenizer, the nodes its config.

    The tokenizer is one word per id ("t0" ... "t{vocab-2}", then <|endoftext|>): it covers the whole vocabulary,
    so every sampled id detokenizes, and token-id prompts (what benchmarks send) need nothing else."""
    from pathlib import Path

    import tokenizers

    if preset not in PRESETS:
        raise ValueError(f"unknown random model {preset!r} (have {sorted(PRESETS)})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = PRESETS[preset]["vocab_size"]
    eos_id = vocab_size - 1
    vocab = {f"t{i}": i for i in range(eos_id)} | {END_OF_TEXT: eos_id}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token=END_OF_TEXT))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([END_OF_TEXT])
    tokenizer.save(str(out / "tokenizer.json"))
    config = {**PRESETS[preset], "eos_token_id": eos_id, "bos_token_id": eos_id,
              RANDOM_WEIGHTS_KEY: {"preset": preset, "seed": seed}}
    files = {"config.json": config, "generation_config.json": {"eos_token_id": [eos_id]},
             "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": END_OF_TEXT,
                                       "bos_token": None, "model_max_length": config["max_position_embeddings"]}}
    for name, data in files.items():
        (out / name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return out
