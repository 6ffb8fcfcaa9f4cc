"""Stateless sampler: allowed_token_ids, bad_words, logit bias, min_tokens and penalties, then greedy or
temperature, min-p, top-k, top-p and Gumbel-max with request-keyed noise.

The noise of a token is a pure function of (request seed, absolute token position, vocab index), computed
with integer tensor ops: no torch.Generator, no global RNG state. A request therefore samples the same token
whichever node, slot (row) or batch samples it, and a failover re-run continues exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from corun.device_copies import to_device
from corun.structured import apply_token_bitmask
from wire.sampling_params import SamplingParams

MASK32 = 0xFFFFFFFF
NOISE_BITS = 23
"""Uniform noise has 23 random bits: (2 * bits + 1) / 2**24 is then exact in float32 and lies in (0, 1)."""

# NOTE: MurmurHash3_x86_32 constants; the hash is exactly murmur3 of the 16-byte little-endian key
# (seed_lo, seed_hi, position, vocab_index) with murmur seed 0, so a pure-Python reference can pin it.
_C1, _C2 = 0xCC9E2D51, 0x1B873593
_FMIX1, _FMIX2 = 0x85EBCA6B, 0xC2B2AE35
_KEY_BYTES = 16


def _mul32(x: Tensor, constant: int) -> Tensor:
    """(x * constant) mod 2**32 for int64 x in [0, 2**32).

    NOTE: a full 32x32-bit product overflows int64, so the constant is split into 16-bit halves; every
    partial product stays below 2**48.
    """
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & MASK32


def _rotl32(x: Tensor, r: int) -> Tensor:
    return ((x << r) | (x >> (32 - r))) & MASK32


def _scramble(word: Tensor) -> Tensor:
    return _mul32(_rotl32(_mul32(word, _C1), 15), _C2)


def _absorb(h: Tensor, word: Tensor) -> Tensor:
    h = _rotl32(h ^ _scramble(word), 13)
    return (h * 5 + 0xE6546B64) & MASK32


def _fmix32(h: Tensor) -> Tensor:
    h = _mul32(h ^ (h >> 16), _FMIX1)
    h = _mul32(h ^ (h >> 13), _FMIX2)
    return h ^ (h >> 16)


def noise_hash(seeds: Tensor, positions: Tensor, vocab_size: int) -> Tensor:
    """32-bit hash of (seed, position, vocab index) in an int64 tensor [rows, vocab], values in [0, 2**32).

    seeds, positions: int64 [rows]. Only exact integer ops, so the bits are the same on CPU and CUDA.
    """
    seeds = seeds.to(torch.int64)[:, None]  # [rows, 1]
    vocab_ids = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)[None, :]  # [1, vocab]
    h = torch.zeros_like(seeds)  # [rows, 1]
    # NOTE: the per-row words are absorbed on [rows, 1] and the vocab word is scrambled on [1, vocab];
    # only the last absorb and the finaliser run on the full [rows, vocab].
    for word in (seeds & MASK32, (seeds >> 32) & MASK32, positions.to(torch.int64)[:, None] & MASK32):
        h = _absorb(h, word)
    h = _absorb(h, vocab_ids)  # [rows, vocab]
    return _fmix32(h ^ _KEY_BYTES)


def request_noise(seeds: Tensor, positions: Tensor, vocab_size: int) -> Tensor:
    """Uniform noise in (0, 1), float32 [rows, vocab]: a pure function of (seed, position, vocab index)."""
    bits = noise_hash(seeds, positions, vocab_size) >> (32 - NOISE_BITS)  # [rows, vocab]
    # NOTE: 2 * bits + 1 < 2**24 converts to float32 exactly; scaling by a power of two is exact too.
    return (bits * 2 + 1).to(torch.float32) * 2.0 ** -(NOISE_BITS + 1)


class TokenHistory(Protocol):
    """What logit adjustments read of a request (corun.request.Request has it)."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]
    stop_token_ids: frozenset[int]


@dataclass(frozen=True)
class LogitAdjustments:
    """Per-row changes to the logits before sampling: allowed_token_ids, bad_words, logit_bias, min_tokens and the
    penalties.

    NOTE: every operation is elementwise on a row, and a row without adjustments goes through exact identities
    (x / 1, x * 1, x - 0): its bits do not depend on whether a co-row made this run.
    """

    bias_rows: Tensor  # [entries] int64
    bias_ids: Tensor  # [entries] int64
    bias_values: Tensor  # [entries] float32
    banned_rows: Tensor  # [entries] int64
    """(row, token) pairs that cannot be sampled: stop tokens before min_tokens, bad words' last tokens."""
    banned_ids: Tensor  # [entries] int64
    allowed: tuple[Tensor, Tensor, Tensor] | None
    """allowed_token_ids: (restricted rows [r], (row, token) pairs allowed [entries] twice); None when no row
    restricts (a row without them allows all)."""
    penalties: tuple[Tensor, Tensor, Tensor] | None
    """(presence, frequency, repetition) [rows] float32, or None when no row uses a penalty."""
    prompt_ids: Tensor  # [rows, max prompt len] int64, padded with -1
    output_ids: Tensor  # [rows, max output len] int64, padded with -1

    @classmethod
    def build(cls, params: Sequence[SamplingParams], histories: Sequence[TokenHistory], num_rows: int,
              device) -> LogitAdjustments:
        bias = [(row, t, b) for row, p in enumerate(params) for t, b in p.logit_bias]
        banned = [(row, t) for row, (p, h) in enumerate(zip(params, histories, strict=True))
                  for t in banned_token_ids(p, h)]
        penalized = any(p.uses_penalties for p in params)

        def ids(rows: list[list[int]]) -> Tensor:
            rows = rows + [[]] * (num_rows - len(rows))
            width = max(map(len, rows), default=0)
            padded = torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.int64)
            return to_device(padded.reshape(num_rows, width), device)

        def per_row(values: list[float], pad: float) -> Tensor:
            return to_device(torch.tensor(values + [pad] * (num_rows - len(values)), dtype=torch.float32), device)

        penalties = None
        if penalized:
            penalties = (per_row([p.presence_penalty for p in params], 0.0),
                         per_row([p.frequency_penalty for p in params], 0.0),
                         per_row([p.repetition_penalty for p in params], 1.0))
        empty_rows = [[] for _ in params]
        return cls(
            bias_rows=to_device(torch.tensor([r for r, _, _ in bias], dtype=torch.int64), device),
            bias_ids=to_device(torch.tensor([t for _, t, _ in bias], dtype=torch.int64), device),
            bias_values=to_device(torch.tensor([b for _, _, b in bias], dtype=torch.float32), device),
            banned_rows=to_device(torch.tensor([r for r, _ in banned], dtype=torch.int64), device),
            banned_ids=to_device(torch.tensor([t for _, t in banned], dtype=torch.int64), device),
            allowed=allowed_entries(params, device),
            penalties=penalties,
            prompt_ids=ids([list(h.prompt_token_ids) for h in histories] if penalized else empty_rows),
            output_ids=ids([list(h.output_token_ids) for h in histories] if penalized else empty_rows),
        )

    def apply(self, logits: Tensor) -> Tensor:
        """[rows, vocab] float32 -> the adjusted logits (a new tensor)."""
        if self.allowed is not None:
            logits = logits.masked_fill(~allowed_mask(self.allowed, logits), float("-inf"))
        logits = logits.index_put((self.bias_rows, self.bias_ids), self.bias_values, accumulate=True)
        if self.penalties is not None:
            logits = self.apply_penalties(logits)
        return logits.index_put((self.banned_rows, self.banned_ids), logits.new_tensor(float("-inf")))

    def apply_penalties(self, logits: Tensor) -> Tensor:
        """vLLM's (and HF's) formulas: repetition over prompt and output, presence and frequency over output."""
        presence, frequency, repetition = (t[:, None] for t in self.penalties)  # [rows, 1]
        output_counts = token_counts(self.output_ids, logits.shape[-1])  # [rows, vocab]
        seen = (token_counts(self.prompt_ids, logits.shape[-1]) > 0) | (output_counts > 0)
        factor = torch.where(seen, repetition, 1.0)  # [rows, vocab]
        logits = torch.where(logits > 0, logits / factor, logits * factor)
        return logits - frequency * output_counts - presence * (output_counts > 0).float()


def banned_token_ids(params: SamplingParams, history: TokenHistory) -> list[int]:
    """The tokens this row cannot sample now: its stop tokens before min_tokens; each bad word's last token where
    the output so far ends with the rest of it (vLLM's rule: over the output only, not the prompt)."""
    output = history.output_token_ids
    banned = sorted(history.stop_token_ids) if len(output) < params.min_tokens else []
    for word in params.bad_words_token_ids:
        prefix = list(word[:-1])
        if len(prefix) <= len(output) and (not prefix or list(output[len(output) - len(prefix):]) == prefix):
            banned.append(word[-1])
    return sorted(set(banned))


def allowed_entries(params: Sequence[SamplingParams], device) -> tuple[Tensor, Tensor, Tensor] | None:
    """LogitAdjustments.allowed: the rows with allowed_token_ids and their (row, token) pairs."""
    restricted = [row for row, p in enumerate(params) if p.allowed_token_ids is not None]
    if not restricted:
        return None
    pairs = [(row, t) for row in restricted for t in params[row].allowed_token_ids]
    return (to_device(torch.tensor(restricted, dtype=torch.int64), device),
            to_device(torch.tensor([r for r, _ in pairs], dtype=torch.int64), device),
            to_device(torch.tensor([t for _, t in pairs], dtype=torch.int64), device))


def allowed_mask(allowed: tuple[Tensor, Tensor, Tensor], logits: Tensor) -> Tensor:
    """Bool [rows, vocab]: True where a token may be sampled; rows without allowed_token_ids (padding included)
    allow all."""
    restricted, rows, token_ids = allowed
    mask = torch.ones_like(logits, dtype=torch.bool)
    mask[restricted] = False
    return mask.index_put((rows, token_ids), torch.ones_like(rows, dtype=torch.bool))


def token_counts(token_ids: Tensor, vocab_size: int) -> Tensor:
    """[rows, width] ids padded with -1 -> float32 [rows, vocab]: how often each token occurs in the row."""
    counts = torch.zeros(token_ids.shape[0], vocab_size + 1, dtype=torch.float32, device=token_ids.device)
    index = torch.where(token_ids >= 0, token_ids, vocab_size)  # NOTE: padding counts in a column dropped below
    counts.scatter_add_(1, index, torch.ones_like(index, dtype=torch.float32))
    return counts[:, :vocab_size]


@dataclass(frozen=True)
class SamplingBatch:
    """Per-row sampling inputs of one step; padding rows are greedy and their outputs are ignored."""

    temperatures: Tensor  # [rows] float32
    """0 means greedy."""
    top_ks: Tensor  # [rows] int64
    """0 disables top-k."""
    top_ps: Tensor  # [rows] float32
    """1 disables top-p."""
    seeds: Tensor  # [rows] int64
    positions: Tensor  # [rows] int64
    """Absolute position of the token being sampled (= number of tokens in the sequence before it)."""
    min_ps: Tensor | None = None  # [rows] float32
    """None when no sampled row uses min_p."""
    adjustments: LogitAdjustments | None = None
    """None when no row has allowed_token_ids, bad words, logit_bias, min_tokens or a penalty."""
    chosen_logprobs: tuple[Tensor, Tensor, Tensor] | None = None
    """logprob_token_ids: (rows, ranks, token ids) [entries] int64: these rows report these tokens' logprobs
    instead of the most likely ones; None when no row names any."""
    all_greedy: bool = False
    """Host-side hint: skip the noise entirely (no device sync needed to know it)."""
    needs_top_k_top_p: bool = True
    """Host-side hint: some sampled row uses top-k or top-p, so the sort is needed."""
    token_bitmask: Tensor | None = None  # [rows, ceil(vocab / 32)] int32
    """Structured outputs: each row's allowed tokens (corun/structured.py); None when no row is constrained."""

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        seeds: Sequence[int],
        positions: Sequence[int],
        num_rows: int,
        device: torch.device | str,
        histories: Sequence[TokenHistory] | None = None,
        token_bitmask: Tensor | None = None,
    ) -> SamplingBatch:
        """histories: each row's tokens so far; needed when some row adjusts its logits (bias, penalties,
        min_tokens)."""
        if not len(params) == len(seeds) == len(positions) <= num_rows:
            raise ValueError(
                f"{len(params)} params, {len(seeds)} seeds, {len(positions)} positions, "
                f"{num_rows} rows: need equal lengths of at most num_rows"
            )
        num_padding = num_rows - len(params)
        sampled = [p for p in params if not p.is_greedy]

        def column(values: list, dtype: torch.dtype, pad_value) -> Tensor:
            return to_device(torch.tensor(values + [pad_value] * num_padding, dtype=dtype), device)

        adjustments = None
        if any(p.adjusts_logits for p in params):
            if histories is None:
                raise ValueError("logit_bias, penalties and min_tokens need each row's token history")
            adjustments = LogitAdjustments.build(params, histories, num_rows, device)
        uses_min_p = any(p.min_p > 0.0 for p in sampled)
        return cls(
            temperatures=column([p.temperature for p in params], torch.float32, 0.0),
            top_ks=column([p.top_k for p in params], torch.int64, 0),
            top_ps=column([p.top_p for p in params], torch.float32, 1.0),
            seeds=column(list(seeds), torch.int64, 0),
            positions=column(list(positions), torch.int64, 0),
            min_ps=column([p.min_p for p in params], torch.float32, 0.0) if uses_min_p else None,
            adjustments=adjustments,
            chosen_logprobs=chosen_logprob_entries(params, device),
            all_greedy=not sampled,
            needs_top_k_top_p=any(p.top_k > 0 or p.top_p < 1.0 for p in sampled),
            token_bitmask=token_bitmask,
        )


def chosen_logprob_entries(params: Sequence[SamplingParams], device) -> tuple[Tensor, Tensor, Tensor] | None:
    """SamplingBatch.chosen_logprobs: each (row, rank, token id) of the rows with logprob_token_ids."""
    entries = [(row, rank, t) for row, p in enumerate(params) for rank, t in enumerate(p.logprob_token_ids or ())]
    if not entries:
        return None
    return tuple(to_device(torch.tensor([e[i] for e in entries], dtype=torch.int64), device) for i in range(3))


@dataclass(frozen=True)
class SamplerOutput:
    token_ids: Tensor  # [rows] int64
    logprobs: Tensor  # [rows] float32
    """Raw logprob (before temperature, top-k, top-p) of the sampled token."""
    topk_ids: Tensor  # [rows, num_logprobs] int64
    topk_logprobs: Tensor  # [rows, num_logprobs] float32


def top_k_top_p_mask(logits: Tensor, top_ks: Tensor, top_ps: Tensor) -> Tensor:
    """Bool [rows, vocab]: the tokens that survive top-k then top-p; ties go to the lower vocab index.

    NOTE: the stable sort makes the kept set a function of the row alone, ties included; the most likely
    token is always kept. A row with top_k = 0 and top_p = 1 keeps every token, so its result does not
    depend on whether a co-row made this function run.
    """
    vocab_size = logits.shape[-1]
    sorted_logits, sorted_ids = torch.sort(logits, dim=-1, descending=True, stable=True)  # [rows, vocab]
    ranks = torch.arange(vocab_size, device=logits.device)[None, :]  # [1, vocab]
    top_ks = torch.where(top_ks > 0, top_ks, vocab_size)[:, None]  # [rows, 1]
    keep = ranks < top_ks  # [rows, vocab], in sorted order
    probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
    mass_before = F.pad(probs.cumsum(dim=-1)[:, :-1], (1, 0))  # [rows, vocab], exclusive prefix sum
    top_ps = top_ps[:, None]  # [rows, 1]
    # NOTE: top_p = 1 keeps all explicitly: a float32 cumsum can reach 1 before the tail of tiny probs.
    keep &= (mass_before < top_ps) | (top_ps >= 1.0) | (ranks == 0)
    return torch.zeros_like(keep).scatter(1, sorted_ids, keep)


def gumbel_noise(seeds: Tensor, positions: Tensor, vocab_size: int) -> Tensor:
    """Standard Gumbel noise, float32 [rows, vocab]."""
    return -torch.log(-torch.log(request_noise(seeds, positions, vocab_size)))


def min_p_mask(scaled: Tensor, min_ps: Tensor) -> Tensor:
    """Bool [rows, vocab]: p >= min_p * p_max, computed as logit - max logit >= log(min_p).

    NOTE: in logit space there is no softmax sum, only a max and a subtraction, both exact; min_p = 0 keeps all.
    """
    return scaled - scaled.amax(dim=-1, keepdim=True) >= torch.log(min_ps)[:, None]


def sample_token_ids(logits: Tensor, batch: SamplingBatch) -> Tensor:
    """int64 [rows]: argmax for greedy rows, Gumbel-max over the scaled, masked logits for the others."""
    if batch.adjustments is not None:
        logits = batch.adjustments.apply(logits)
    greedy_ids = logits.argmax(dim=-1)  # [rows]
    if batch.all_greedy:
        return greedy_ids
    is_greedy = batch.temperatures == 0.0  # [rows]
    # NOTE: greedy rows divide by 1 (not 0) and their sampled id is discarded below.
    temperatures = torch.where(is_greedy, 1.0, batch.temperatures)[:, None]  # [rows, 1]
    scaled = logits / temperatures  # [rows, vocab]
    if batch.min_ps is not None:
        scaled = scaled.masked_fill(~min_p_mask(scaled, batch.min_ps), float("-inf"))
    if batch.needs_top_k_top_p:
        keep = top_k_top_p_mask(scaled, batch.top_ks, batch.top_ps)
        scaled = scaled.masked_fill(~keep, float("-inf"))
    if scaled.is_cuda:  # NOTE: the same noise bits, generated in registers by one fused kernel per row
        from corun.kernels.sampling import gumbel_argmax

        sampled_ids = gumbel_argmax(scaled.contiguous(), batch.seeds, batch.positions)
    else:
        noise = gumbel_noise(batch.seeds, batch.positions, logits.shape[-1])  # [rows, vocab]
        sampled_ids = (scaled + noise).argmax(dim=-1)  # [rows]
    return torch.where(is_greedy, greedy_ids, sampled_ids)


class Sampler:
    """Stateless: the same (logits row, seed, position, params) always gives the same output row."""

    log_softmax = staticmethod(lambda logits: torch.log_softmax(logits, dim=-1))
    """Swapped for a batch-invariant kernel in batch_invariant mode."""
    grammars = None
    """corun.structured.Grammars of the served model: set by the runner that owns the sampler."""

    def __call__(self, logits: Tensor, batch: SamplingBatch, num_logprobs: int | None) -> SamplerOutput:
        """num_logprobs None: no row wants logprobs, skip computing them (the logprob fields are empty)."""
        logits = logits.float()  # [rows, vocab]
        if batch.token_bitmask is not None:  # NOTE: before logprobs, as vLLM: they are the constrained ones
            logits = apply_token_bitmask(logits, batch.token_bitmask)
        token_ids = sample_token_ids(logits, batch)  # [rows]
        if num_logprobs is None:
            empty = logits.new_empty(logits.shape[0], 0)
            return SamplerOutput(token_ids, logits.new_zeros(logits.shape[0]), empty.long(), empty)
        # NOTE: logprobs are of the raw logits (vLLM's default "raw_logprobs"), not the sampling distribution.
        raw_logprobs = self.log_softmax(logits)  # [rows, vocab]
        # NOTE: a stable sort, not topk: ties (frequent with bf16 logits) come out in vocab order, so the list
        # is one well-defined answer whatever kernel or batch shape computed it.
        sorted_logprobs, sorted_ids = torch.sort(raw_logprobs, dim=-1, descending=True, stable=True)
        topk_logprobs, topk_ids = sorted_logprobs[:, :num_logprobs], sorted_ids[:, :num_logprobs]
        if batch.chosen_logprobs is not None:
            rows, ranks, chosen_ids = batch.chosen_logprobs
            topk_ids = topk_ids.index_put((rows, ranks), chosen_ids)
            topk_logprobs = topk_logprobs.index_put((rows, ranks), raw_logprobs[rows, chosen_ids])
        return SamplerOutput(
            token_ids=token_ids,
            logprobs=raw_logprobs.gather(1, token_ids[:, None]).squeeze(1),
            topk_ids=topk_ids,
            topk_logprobs=topk_logprobs,
        )
