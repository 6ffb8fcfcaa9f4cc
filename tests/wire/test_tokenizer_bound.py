"""Tokenizer.max_text_chars is a bound, never a guess: no text of at most k tokens is longer than it."""

import random
import sys
import unicodedata

import pytest

from wire.tokenizer import COMPOSITION_SHRINK, load_tokenizer, normalizer_shrink


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def test_unicode_composition_shrinks_a_text_at_most_composition_shrink_fold():
    longest = max(len(unicodedata.normalize(form, chr(c))) for form in ("NFD", "NFC")
                  for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000)
    assert longest == COMPOSITION_SHRINK


def texts(tokenizer) -> list[str]:
    """Texts made to be few tokens for their length: the longest vocabulary strings, decomposed characters that
    the normalizer composes, special tokens, long runs of one character."""
    rng = random.Random(0)
    vocab = sorted(tokenizer._backend.get_vocab(with_added_tokens=True), key=len)
    words = [tokenizer.decode([tokenizer._backend.token_to_id(t)]) for t in vocab[-50:]]
    decomposed = unicodedata.normalize("NFD", "\u1f8f\u1eadé") * 200
    return ["".join(rng.choice(words) for _ in range(300)), decomposed, "<|im_start|>" * 100, "a" * 5000,
            " " * 5000, "\n" * 5000, "ab" * 3000]


def test_no_text_is_longer_than_the_bound_for_its_token_count(tokenizer):
    for text in texts(tokenizer):
        num_tokens = len(tokenizer.encode(text))
        assert len(text) <= tokenizer.max_text_chars(num_tokens), text[:40]


def test_a_normalizer_that_may_delete_text_gives_no_bound():
    assert normalizer_shrink(None) == 1
    assert normalizer_shrink({"type": "NFC"}) == COMPOSITION_SHRINK
    assert normalizer_shrink({"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}) == 4
    assert normalizer_shrink({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Strip"}]}) is None
    assert normalizer_shrink({"type": "Replace", "pattern": {"String": "x"}, "content": ""}) is None
