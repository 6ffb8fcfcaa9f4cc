import re

import msgspec
import pytest

from tests.router.fake_nodes import FakeBehaviour
from tests.router.harness import RouterHarness, model_facts
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


@pytest.fixture(scope="module")
def long_context(tiny_model_dir, word_token_ids):
    """Nodes that report a context of 2**19 tokens: a prompt of megabytes is encoded before it is refused."""
    facts = msgspec.structs.replace(model_facts(tiny_model_dir), max_model_len=2**19)
    nodes = FakeBehaviour(model_facts=facts)
    with RouterHarness(tiny_model_dir, word_token_ids, prefill=nodes, decode=nodes) as harness:
        harness.wait_until_healthy()
        yield harness
