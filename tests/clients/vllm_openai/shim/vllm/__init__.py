"""Shim for the few vllm names vLLM's OpenAI tests import (not vLLM: the harness's .venv has no vllm)."""
