"""A tiny random-weight Qwen3 checkpoint in Hugging Face format, built deterministically for tests and demos."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
from tokenizers.models import BPE

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
TARGET_VOCAB_SIZE = 2048
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Qwen2/Qwen3's pre-tokenizer split: contractions, letter runs, single digits, punctuation runs, whitespace.
QWEN_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# A few hundred common English words: the corpus is random sentences over them.
COMMON_WORDS_TEXT = """
the be to of and a in that have it for not on with he as you do at this but his by from they we say her she or
an will my one all would there their what so up out if about who get which go me when make can like time no just
him know take people into year your good some could them see other than then now look only come its over think
also back after use two how our work first well way even new want because any these give day most us is was are
were been has had did said made went found long down little very still own here where why ask need feel become
leave put mean keep let begin seem help talk turn start show hear play run move live believe hold bring happen
write provide sit stand lose pay meet include continue set learn change lead understand watch follow stop create
speak read allow add spend grow open walk win offer remember love consider appear buy wait serve die send expect
build stay fall cut reach kill remain suggest raise pass sell require report decide pull thing man woman child
world life hand part place case week company system program question government number night point home water
room mother area money story fact month lot right study book eye job word business issue side kind head house
service friend father power hour game line end member law car city community name president team minute idea kid
body information school face others level office door health person art war history party result morning reason
research girl guy moment air teacher force education foot boy age policy everything process music market sense
nation plan college interest death experience effect class control care field development role effort rate heart
drug leader light voice wife police mind price decision son view relationship town road arm difference value
building action model season society tax director position player record paper space ground form event official
matter center couple site project activity star table court oil situation cost industry figure street image phone
data picture practice piece land product doctor wall patient worker news test movie north support technology step
baby computer type attention film tree source organization hair window evidence population truth song garden
river mountain ocean island forest summer winter spring autumn weather great small large big old young important
few public bad same able early late human local sure free better best true whole real strong possible economic
military simple clear recent certain personal red white black blue green yellow dark short single medical current
wrong private past foreign fine common poor natural significant similar hot dead central happy serious ready left
physical general environmental financial cold quickly slowly always never often sometimes usually really almost
already again together however perhaps
"""
WORDS = tuple(COMMON_WORDS_TEXT.split())
SUFFIXES = ("s", "ed", "ing", "er", "ly")
END_PUNCTUATION = (".", ".", ".", "!", "?")
NUM_CORPUS_PARAGRAPHS = 1500

DEFAULT_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "max_position_embeddings": 2048,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "use_cache": True,
    "use_sliding_window": False,
    "sliding_window": None,
}

# With random weights the final hidden state (RMS-normed, norm of about sqrt(hidden_size)) is unrelated to the
# output embeddings, so the logit spread is sqrt(hidden_size) * std. A spread of ~3 over ~2k tokens gives a
# top-1 probability of roughly 0.1, peaked enough for sampling tests; HF's std 0.02 would give ~0.3 (uniform).
TARGET_LOGIT_STD = 3.0
NORM_WEIGHT_NOISE_STD = 0.05


def make_tiny_model(out_dir, *, seed: int = 0, dtype: str = "float32", **config_overrides) -> Path:
    """Write config, weights, tokenizer and generation config of a random Qwen3 model into out_dir."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(seed)
    config = build_config(tokenizer, dtype, config_overrides)
    tokenizer.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", tokenizer_config(config))
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", generation_config(config))
    weights = random_weights(config, seed)
    save_file({name: t.to(DTYPES[dtype]) for name, t in weights.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out


def train_tokenizer(seed: int) -> Tokenizer:
    """Byte-level BPE (Qwen-style pre-tokenizer) trained on the embedded corpus; specials get the last ids."""
    tokenizer = Tokenizer(BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB_SIZE - len(SPECIAL_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_paragraphs(seed), trainer=trainer)
    # NOTE: added after training so that, as in Qwen, the special tokens sit after the BPE vocabulary.
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def corpus_paragraphs(seed: int):
    """Paragraphs of random sentences over WORDS; the same seed always yields the same text."""
    rng = random.Random(seed)
    for _ in range(NUM_CORPUS_PARAGRAPHS):
        sentences = [random_sentence(rng) for _ in range(rng.randint(1, 5))]
        yield " ".join(sentences) + "\n" * rng.randint(1, 2)


def random_sentence(rng: random.Random) -> str:
    words = [random_word(rng) for _ in range(rng.randint(3, 14))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(1, len(words)), str(rng.randint(0, 9999)))
    if rng.random() < 0.3:
        words[rng.randrange(0, len(words) - 1)] += ","
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice(END_PUNCTUATION)


def random_word(rng: random.Random) -> str:
    word = rng.choice(WORDS)
    # Inflections give BPE enough distinct material to fill the target vocabulary.
    return word + rng.choice(SUFFIXES) if rng.random() < 0.2 else word


def build_config(tokenizer: Tokenizer, dtype: str, overrides: dict) -> dict:
    """config.json as transformers 5 writes it, plus v4-style keys that older readers (vLLM, v4) look for."""
    ids = tokenizer.get_vocab()
    config = {**DEFAULT_CONFIG, "vocab_size": round_up(len(ids), 64),
              "bos_token_id": ids[ENDOFTEXT], "eos_token_id": ids[IM_END], **overrides}
    if config["vocab_size"] < len(ids):
        raise ValueError(f"vocab_size {config['vocab_size']} is smaller than the tokenizer's {len(ids)} tokens")
    config.setdefault("max_window_layers", config["num_hidden_layers"])
    # transformers 5 reads rope settings from `rope_parameters` (it wins over a top-level rope_theta) and
    # serialises only that; the top-level rope_theta is kept, equal, for v4-era readers.
    rope = {"rope_theta": config["rope_theta"], "rope_type": "default", **overrides.get("rope_parameters", {})}
    config["rope_parameters"], config["rope_theta"] = rope, rope["rope_theta"]
    config["dtype"] = config["torch_dtype"] = dtype
    return dict(sorted(config.items()))


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def tokenizer_config(config: dict) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": CHATML_TEMPLATE,
    }


def generation_config(config: dict) -> dict:
    # No sampling defaults on purpose: servers (vLLM) would silently apply them to every request.
    return {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": [config["eos_token_id"], config["bos_token_id"]],
        "pad_token_id": config["bos_token_id"],
    }


def random_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """float32 tensors under HF Qwen3 names, drawn in a fixed order from one seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    output_std = TARGET_LOGIT_STD / math.sqrt(hidden)
    weights = {"model.embed_tokens.weight": normal((vocab, hidden), output_std, generator)}
    for layer in range(config["num_hidden_layers"]):
        weights.update(layer_weights(config, f"model.layers.{layer}.", generator))
    weights["model.norm.weight"] = norm_weight(hidden, generator)
    if not config["tie_word_embeddings"]:
        weights["lm_head.weight"] = normal((vocab, hidden), output_std, generator)
    return weights


def layer_weights(config: dict, prefix: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    q_dim = config["num_attention_heads"] * head_dim
    kv_dim = config["num_key_value_heads"] * head_dim
    shapes = {
        "self_attn.q_proj.weight": (q_dim, hidden),
        "self_attn.k_proj.weight": (kv_dim, hidden),
        "self_attn.v_proj.weight": (kv_dim, hidden),
        "self_attn.o_proj.weight": (hidden, q_dim),
        "mlp.gate_proj.weight": (config["intermediate_size"], hidden),
        "mlp.up_proj.weight": (config["intermediate_size"], hidden),
        "mlp.down_proj.weight": (hidden, config["intermediate_size"]),
    }
    weights = {prefix + name: linear_weight(shape, generator) for name, shape in shapes.items()}
    weights[prefix + "self_attn.q_norm.weight"] = norm_weight(head_dim, generator)
    weights[prefix + "self_attn.k_norm.weight"] = norm_weight(head_dim, generator)
    weights[prefix + "input_layernorm.weight"] = norm_weight(hidden, generator)
    weights[prefix + "post_attention_layernorm.weight"] = norm_weight(hidden, generator)
    return weights


def linear_weight(shape: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
    # std 1/sqrt(fan_in) keeps activations at unit scale, so every layer visibly changes the residual stream.
    return normal(shape, 1.0 / math.sqrt(shape[1]), generator)


def norm_weight(size: int, generator: torch.Generator) -> torch.Tensor:
    # Not all ones, so that a loader which drops or misplaces a norm weight changes the output.
    return 1.0 + normal((size,), NORM_WEIGHT_NOISE_STD, generator)


def normal(shape: tuple[int, ...], std: float, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator, dtype=torch.float32) * std


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
