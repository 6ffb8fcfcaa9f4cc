from vllm.tokenizers import get_tokenizer  # noqa: F401
