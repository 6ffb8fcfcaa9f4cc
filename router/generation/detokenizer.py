"""Incremental detokenisation with stop strings, one token at a time.

NOTE: one token at a time, so that where a stop string cuts the output does not depend on how the decode node
grouped tokens into events: streaming and non-streaming, fast and slow nodes, all give the same text and ids.
"""

from __future__ import annotations

import msgspec

from wire.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
"""What decoding yields for an incomplete UTF-8 sequence: the next token may complete it."""


class TextDelta(msgspec.Struct, frozen=True):  # NOTE: one per streamed token: built in C
    text: str
    """Newly visible text (may be empty while an incomplete character or a possible stop string is held back)."""
    num_tokens: int
    """How many of the offered tokens belong to the output (fewer when a stop string ended it)."""
    stopped: bool
    """A stop string matched: the output ends before it, and generation must be aborted."""


class IncrementalDetokenizer:
    """The output's text as tokens arrive, holding back what may still change.

    Equal to decoding the whole output at once, but each token decodes only a short window (tokenizers'
    DecodeStream: the text of tokens[prefix:] minus that of tokens[prefix:read], vLLM's prefix/read offsets).
    NOTE: decoding the window with a little context, not the lone new token, keeps tokenizers that strip a
    leading space or merge bytes across tokens right; decoding everything each time would cost O(length). The
    last token decodes the whole output once, so the final text is exactly its decode, an unfinished character's
    replacement included.
    """

    def __init__(self, tokenizer: Tokenizer, stop_strings: tuple[str, ...] = (), include_stop_string: bool = False,
                 skip_special_tokens: bool = True, min_tokens: int = 0):
        """min_tokens: stop strings match only once the output has this many tokens (vLLM's rule)."""
        self._tokenizer = tokenizer
        self._min_tokens = min_tokens
        self._stop_strings = stop_strings
        self._include_stop_string = include_stop_string
        self._skip_special_tokens = skip_special_tokens
        self.matched_stop_string: str | None = None
        """The stop string that ended the output (vLLM's stop_reason)."""
        # NOTE: a possible stop string's beginning is held back, or it could be streamed before it matched.
        self._hold_back = max((len(s) for s in stop_strings), default=1) - 1
        self._token_ids: list[int] = []
        self._step = tokenizer.decode_stream(skip_special_tokens)
        self._text = ""
        """With stop strings: the output's text so far, and what of it is shown (_emitted)."""
        self._emitted = ""
        self._num_emitted_chars = 0
        """Without stop strings: how many characters the deltas have shown."""
        self.stopped = False

    @property
    def num_tokens(self) -> int:
        return len(self._token_ids)

    def add(self, token_ids: list[int], finished: bool) -> TextDelta:
        """Offer new tokens; finished means the node ended the output after them (flush everything)."""
        if not self._stop_strings:
            if finished:
                return self._finish_without_stop_strings(token_ids)
            return TextDelta(self.add_running(token_ids), len(token_ids), stopped=False)
        start = len(self._emitted)
        for count, token_id in enumerate(token_ids, start=1):
            self._token_ids.append(token_id)
            is_last = finished and count == len(token_ids)
            if self._advance(is_last):
                return TextDelta(self._emitted[start:], count, stopped=True)
        return TextDelta(self._emitted[start:], len(token_ids), stopped=False)

    def add_running(self, token_ids: list[int]) -> str:
        """The text of tokens that do not end the output, of a detokenizer without stop strings (nothing can cut
        it: every token's text is visible at once). NOTE: the router's per-token path (router/generation/deltas.py,
        delta_push): one call, no stop check, no TextDelta; and the text so far is counted, not kept, since
        growing a string attribute copies it whole per token."""
        self._token_ids += token_ids
        if len(token_ids) == 1:  # NOTE: a streamed token's (a router keeping up gets them one by one)
            text = self._step(token_ids[0]) or ""
        else:
            text = "".join(filter(None, map(self._step, token_ids)))
        self._num_emitted_chars += len(text)
        return text

    def _finish_without_stop_strings(self, token_ids: list[int]) -> TextDelta:
        """The last tokens: the whole output decoded once, so that the text is exactly its decode (an unfinished
        character's replacement included); the delta is what the streamed steps had not shown."""
        self._token_ids += token_ids
        text = self._tokenizer.decode(self._token_ids, skip_special_tokens=self._skip_special_tokens)
        delta = TextDelta(text[self._num_emitted_chars:], len(token_ids), stopped=False)
        self._num_emitted_chars = len(text)
        return delta

    def _advance(self, is_last: bool) -> bool:
        """Take in the newest token; True when a stop string matched."""
        self._decode_window(is_last)
        stop = self._find_stop(self._text) if len(self._token_ids) >= self._min_tokens else None
        if stop is not None:
            stop_at, self.matched_stop_string = stop
            end = stop_at + len(self.matched_stop_string) if self._include_stop_string else stop_at
            self._emitted, self.stopped = self._text[:end], True
            return True
        visible_len = len(self._text) if is_last else max(len(self._emitted), len(self._text) - self._hold_back)
        self._emitted = self._text[:visible_len]
        return False

    def _decode_window(self, is_last: bool) -> None:
        if is_last:
            self._text = self._tokenizer.decode(self._token_ids, skip_special_tokens=self._skip_special_tokens)
            return
        new_text = self._step(self._token_ids[-1])  # NOTE: None: an incomplete UTF-8 sequence, wait for more
        if new_text:
            self._text += new_text

    def _find_stop(self, text: str) -> tuple[int, str] | None:
        """(where the first stop string starts, which one), or None."""
        # NOTE: earlier text held no match (we would have stopped), so only its last few characters can start one.
        search_from = max(0, len(self._emitted) - self._hold_back)
        found = [(p, s) for p, s in ((text.find(s, search_from), s) for s in self._stop_strings) if p >= 0]
        return min(found, default=None)
