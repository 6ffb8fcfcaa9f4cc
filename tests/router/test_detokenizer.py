"""Incremental detokenisation: equal to decoding at once, never showing half characters or half stop strings."""

import random

import pytest

from router.generation.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer

TEXT = "The café 🙂 sat on the mat, ok. Numbers 42 and ünïcödé."


def feed(tokenizer, token_ids, stop_strings=(), group=1):
    detokenizer = IncrementalDetokenizer(tokenizer, tuple(stop_strings))
    deltas = []
    for start in range(0, len(token_ids), group):
        chunk = token_ids[start:start + group]
        delta = detokenizer.add(chunk, finished=start + group >= len(token_ids))
        deltas.append(delta)
        if delta.stopped:
            break
    return deltas


def test_incremental_text_equals_the_whole_decode_without_half_characters(tokenizer):
    token_ids = tokenizer.encode(TEXT)
    assert any(REPLACEMENT_CHAR in tokenizer.decode([t]) for t in token_ids)
    deltas = feed(tokenizer, token_ids)
    assert "".join(d.text for d in deltas) == TEXT
    assert all(REPLACEMENT_CHAR not in d.text for d in deltas)


@pytest.mark.parametrize("group", [1, 2, 3, 100])
def test_a_stop_string_cuts_at_the_same_place_whatever_the_grouping(tokenizer, group):
    token_ids = tokenizer.encode(TEXT)
    deltas = feed(tokenizer, token_ids, stop_strings=["xyz", "mat,"], group=group)
    assert "".join(d.text for d in deltas) == "The café 🙂 sat on the "
    assert deltas[-1].stopped
    num_kept = sum(d.num_tokens for d in deltas)
    assert "mat," in tokenizer.decode(token_ids[:num_kept])
    assert "mat," not in tokenizer.decode(token_ids[:num_kept - 1])


def test_the_start_of_a_possible_stop_string_is_held_back(tokenizer):
    token_ids = tokenizer.encode("the cat sat")
    detokenizer = IncrementalDetokenizer(tokenizer, ("sat down",))
    shown = "".join(detokenizer.add([t], finished=False).text for t in token_ids)
    assert shown == "the "
    assert detokenizer.add(tokenizer.encode(" up"), finished=True).text == "cat sat up"


def test_a_stop_string_in_the_first_token_gives_empty_text(tokenizer):
    token_ids = tokenizer.encode("the end")
    deltas = feed(tokenizer, token_ids, stop_strings=[tokenizer.decode(token_ids[:1])])
    assert [d.text for d in deltas] == [""] and deltas[0].stopped and deltas[0].num_tokens == 1


def test_random_token_sequences_detokenise_like_the_whole_decode(tokenizer):
    rng = random.Random(0)
    for _ in range(100):
        token_ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(1, 200))]
        text = "".join(delta.text for delta in feed(tokenizer, token_ids, group=rng.randint(1, 3)))
        assert text == tokenizer.decode(token_ids)


@pytest.mark.parametrize("seed", range(5))
def test_random_token_streams_give_the_whole_decode_and_only_its_prefixes(tokenizer, seed):
    """Any ids (special ones and split characters included), in groups of any size: every delta extends a prefix
    of the whole decode, and the last leaves exactly the whole decode; inverse: an unfinished stream holds back."""
    rng = random.Random(seed)
    token_ids = [rng.randrange(tokenizer.vocab_size) for _ in range(200)]
    whole = tokenizer.decode(token_ids)
    detokenizer, shown, start = IncrementalDetokenizer(tokenizer), "", 0
    while start < len(token_ids):
        group = rng.randint(1, 4)
        shown += detokenizer.add(token_ids[start:start + group], finished=start + group >= len(token_ids)).text
        start += group
        assert whole.startswith(shown)
    assert shown == whole
    unfinished = IncrementalDetokenizer(tokenizer)
    split = tokenizer.encode("🙂")
    assert len(split) > 1 and unfinished.add(split[:1], finished=False).text == ""
