import re

import pytest

from tests.router.harness import RouterHarness
from wire.tokenizer import load_tokenizer

WORD_TOKEN = re.compile(r"^ ?[a-z]{2,}$")


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="session")
def word_token_ids(tokenizer) -> list[int]:
    """Token ids whose text is a lowercase word piece: fake outputs read like text and decode unambiguously."""
    ids = [i for i in range(tokenizer.vocab_size) if WORD_TOKEN.match(tokenizer.decode([i]))]
    assert len(ids) > 200
    return ids


@pytest.fixture(scope="module")
def router(tiny_model_dir, word_token_ids):
    """Two fake prefill and two fake decode nodes behind a router with the default config."""
    with RouterHarness(tiny_model_dir, word_token_ids) as harness:
        harness.wait_until_healthy()
        yield harness
