"""The tiny random Qwen3 checkpoint: deterministic, loadable by transformers, and its torch-free tokenizer."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from corun.models.tiny import make_tiny_model
from wire.tokenizer import load_tokenizer

# Loading from a local directory must never need the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[2]
EXPECTED_FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                  "tokenizer_config.json"]
LAYER_TENSORS = [
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight", "input_layernorm.weight",
    "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
]
SENTENCE = "The people of the city often walk by the river, and 42 children played there!"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def file_digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def tensor_names(model_dir: Path) -> set[str]:
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


def expected_tensor_names(num_layers: int, tied: bool) -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    names |= {f"model.layers.{i}.{name}" for i in range(num_layers) for name in LAYER_TENSORS}
    return names if tied else names | {"lm_head.weight"}


def test_same_seed_gives_identical_files(model_dir, tmp_path):
    again = make_tiny_model(tmp_path / "again")
    assert list(file_digests(model_dir)) == EXPECTED_FILES
    assert file_digests(again) == file_digests(model_dir)


def test_other_seed_gives_other_weights(model_dir, tmp_path):
    other = make_tiny_model(tmp_path / "other", seed=1)
    assert file_digests(other)["model.safetensors"] != file_digests(model_dir)["model.safetensors"]


def test_config_and_tensor_names(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = load_tokenizer(model_dir)
    assert config["vocab_size"] % 64 == 0 and config["vocab_size"] >= tokenizer.vocab_size
    assert config["eos_token_id"] == tokenizer.eos_token_id
    assert tensor_names(model_dir) == expected_tensor_names(4, tied=True)


def test_overrides_untie_and_change_dtype(tmp_path):
    model_dir = make_tiny_model(tmp_path, dtype="bfloat16", num_hidden_layers=2, tie_word_embeddings=False)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["dtype"] == "bfloat16"
    assert tensor_names(model_dir) == expected_tensor_names(2, tied=False)
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        assert str(f.get_tensor("lm_head.weight").dtype) == "torch.bfloat16"


def test_transformers_reads_rope_theta(model_dir):
    from transformers import Qwen3Config

    config = Qwen3Config.from_pretrained(model_dir)
    assert config.rope_parameters["rope_theta"] == 1e6
    assert config.num_key_value_heads == 4 and config.head_dim == 32


def test_transformers_logits_are_finite_and_peaked(model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([load_tokenizer(model_dir).encode(SENTENCE)])
    with torch.no_grad():
        logits = model(ids).logits[0]
    assert torch.isfinite(logits).all()
    top1 = logits.softmax(-1).max(-1).values
    # Uniform over the vocabulary would be 1/2048; random weights must still give a clear favourite.
    assert top1.mean() > 0.05


def test_encode_decode_round_trip(model_dir):
    tokenizer = load_tokenizer(model_dir)
    ids = tokenizer.encode(SENTENCE)
    assert len(ids) < len(SENTENCE) / 2, "BPE should merge the corpus words"
    assert tokenizer.decode(ids) == SENTENCE


def test_chat_template_renders_chatml(model_dir):
    tokenizer = load_tokenizer(model_dir)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hello there"}])
    assert prompt == "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode(prompt)
    assert tokenizer.decode(ids) == "user\nHello there\nassistant\n"
    assert tokenizer.decode(ids, skip_special_tokens=False) == prompt


def test_stop_tokens(model_dir):
    tokenizer = load_tokenizer(model_dir)
    special_ids = [tokenizer.encode(token)[0] for token in ("<|im_end|>", "<|endoftext|>")]
    assert tokenizer.eos_token_id == special_ids[0]
    assert tokenizer.stop_token_ids == tuple(special_ids)


def test_matches_transformers_tokenizer(model_dir):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(model_dir)
    tokenizer = load_tokenizer(model_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": SENTENCE}]
    prompt = tokenizer.apply_chat_template(messages)
    assert prompt == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.encode(prompt) == reference.encode(prompt, add_special_tokens=False)
    assert tokenizer.eos_token_id == reference.eos_token_id


def test_tokenizer_does_not_import_torch(model_dir):
    script = ("import sys; from wire.tokenizer import load_tokenizer; "
              f"load_tokenizer({str(model_dir)!r}).encode('hi'); print('torch' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                            cwd=REPO_ROOT, check=True)
    assert result.stdout.strip() == "False"


def test_loading_it_leaves_torch_dynamo_unimported(model_dir):
    """A node's start-up loads the model and nothing else needs torch._dynamo (~1.5 s of CPU to import): built on
    the meta device, the model must run no op through torch's Python references (their first call imports it)."""
    script = ("import sys; from corun.models.loader import load_model; "
              f"model = load_model({str(model_dir)!r}, 'float32', 'cpu', 64); "
              "print(model.rope_cos.device, model.embed_tokens.weight.device, 'torch._dynamo' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                            cwd=REPO_ROOT, check=True)
    assert result.stdout.split() == ["cpu", "cpu", "False"]
