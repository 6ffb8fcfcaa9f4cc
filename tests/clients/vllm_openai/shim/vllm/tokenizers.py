"""Shim: the test's model name resolves to CoRun's tiny model (the harness's HF cache maps every name to it)."""

from transformers import AutoTokenizer


def get_tokenizer(tokenizer_name, *args, tokenizer_mode: str = "auto", trust_remote_code: bool = False, **kwargs):
    return AutoTokenizer.from_pretrained(str(tokenizer_name))
