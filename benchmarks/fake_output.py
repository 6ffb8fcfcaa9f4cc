"""What the benchmark's fake nodes generate, shared with the client that checks every stream against it.

A sample's output token at position k (0: the token the prefill node samples) depends on k alone: the client
knows each stream's exact expected ids without asking anyone, and the decode node can pack every id once.
"""

from __future__ import annotations

from wire.outputs import TokenLogprobs

FIRST_TOKEN_ID = 256
"""Above the byte-level pieces of a byte-BPE vocabulary: multi-character word pieces, so the router's detokenizer
does the work it does for ordinary text."""
TOKEN_PERIOD = 1024
"""The output repeats with this period; it needs a vocabulary of FIRST_TOKEN_ID + TOKEN_PERIOD ids."""
STRIDE = 389
"""Odd, so that positions 0 .. TOKEN_PERIOD - 1 visit every id of the range once (neighbours differ: no
run of one repeated piece, which a tokenizer might merge)."""
MIN_VOCAB_SIZE = FIRST_TOKEN_ID + TOKEN_PERIOD


def output_token_id(position: int) -> int:
    return FIRST_TOKEN_ID + (position * STRIDE) % TOKEN_PERIOD


def expected_output(max_tokens: int) -> list[int]:
    """A whole sample: max_tokens ids (the fakes never stop early: finish_reason "length")."""
    return [output_token_id(position) for position in range(max_tokens)]


def output_logprobs(position: int, num_top: int) -> TokenLogprobs:
    """The logprobs the fakes report for the token at position, with num_top alternatives (values exact in binary,
    so that the client can compare what it reads with ==)."""
    return TokenLogprobs(output_token_id(position), -0.5 - (position % 8) / 8,
                         tuple((output_token_id(position + 1 + j), -2.0 - j) for j in range(num_top)))
