import random

import pytest

from corun.models.tiny import make_tiny_model

WORDS = ("the a cat dog sat ran on under mat house river quickly slowly green blue seven numbers people "
         "city morning night light sound water reads writes model token answer question because and or").split()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The built-in tiny float32 Qwen3 (random weights, BPE tokenizer), made once per test session."""
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-model")))


def varied_prompts(num: int, seed: int, min_words: int = 3, max_words: int = 120) -> list[str]:
    """Prompts of very different lengths (some longer than the tests' prefill chunk)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))) for _ in range(num)]


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (pytest -m gpu on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    # NOTE: without a GPU, Triton kernels run in Triton's CPU interpreter (set before anything imports triton).
    import os

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
