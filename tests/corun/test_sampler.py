"""Sampler: request-keyed noise, batch invariance, greedy/top-k/top-p semantics, request seeds."""

from __future__ import annotations

import struct
import warnings

import pytest
import torch

from corun.sampler import (
    Sampler,
    SamplerOutput,
    SamplingBatch,
    noise_hash,
    request_noise,
    top_k_top_p_mask,
)
from wire.sampling_params import SamplingParams
from wire.seeding import seed_from_request_id

pytestmark = pytest.mark.numerics

VOCAB = 1009  # NOTE: not a multiple of any SIMD width, so row tails hit the vector remainder paths
MASK32 = 0xFFFFFFFF


# ---- reference hash ----------------------------------------------------------------------------------------


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & MASK32


def murmur3_16_bytes(key: bytes) -> int:
    """MurmurHash3_x86_32 with seed 0 of a 16-byte key (no tail), in plain Python ints."""
    h = 0
    for (k,) in struct.iter_unpack("<I", key):
        k = _rotl32((k * 0xCC9E2D51) & MASK32, 15) * 0x1B873593 & MASK32
        h = (_rotl32(h ^ k, 13) * 5 + 0xE6546B64) & MASK32
    h ^= len(key)
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) & MASK32
    h = ((h ^ (h >> 13)) * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


def reference_hash(seed: int, position: int, vocab_id: int) -> int:
    return murmur3_16_bytes(struct.pack("<IIII", seed & MASK32, seed >> 32, position, vocab_id))


# ---- helpers -----------------------------------------------------------------------------------------------


def random_params(generator: torch.Generator) -> SamplingParams:
    choice = int(torch.randint(0, 4, (1,), generator=generator))
    return [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=20),
        SamplingParams(temperature=1.3, top_p=0.8),
    ][choice]


def sample_in_batch(logits_row, params, seed, position, num_rows, at_row, num_logprobs=5) -> SamplerOutput:
    """Sample one row placed at `at_row` of a batch whose other rows are random requests."""
    generator = torch.Generator().manual_seed(1000 * num_rows + at_row)
    logits = torch.randn(num_rows, logits_row.shape[0], generator=generator) * 4  # [rows, vocab]
    logits[at_row] = logits_row
    all_params = [random_params(generator) for _ in range(num_rows)]
    seeds = torch.randint(0, 2**62, (num_rows,), generator=generator).tolist()
    positions = torch.randint(0, 5000, (num_rows,), generator=generator).tolist()
    all_params[at_row], seeds[at_row], positions[at_row] = params, seed, position
    batch = SamplingBatch.build(all_params, seeds, positions, num_rows, "cpu")
    return select_rows(Sampler()(logits, batch, num_logprobs), at_row)


def select_rows(output: SamplerOutput, rows: int | slice) -> SamplerOutput:
    return SamplerOutput(*(getattr(output, name)[rows] for name in SamplerOutput.__dataclass_fields__))


def sample_rows(logits, params_list, seeds, positions, num_logprobs=0) -> SamplerOutput:
    batch = SamplingBatch.build(params_list, seeds, positions, len(params_list), "cpu")
    return Sampler()(logits, batch, num_logprobs)


def assert_outputs_equal(a: SamplerOutput, b: SamplerOutput) -> None:
    for name in SamplerOutput.__dataclass_fields__:
        assert torch.equal(getattr(a, name), getattr(b, name)), name


# ---- noise -------------------------------------------------------------------------------------------------


def test_noise_hash_matches_pure_python_murmur3():
    seeds = [0, 1, 2**32 - 1, 2**32, 123456789012345, 2**63 - 1]
    positions = [0, 5, 77, 4095, 2**31, 2**32 - 1]
    hashes = noise_hash(torch.tensor(seeds), torch.tensor(positions), VOCAB)  # [rows, vocab]
    for row, (seed, position) in enumerate(zip(seeds, positions, strict=True)):
        for vocab_id in (0, 1, 2, 500, VOCAB - 1):
            assert hashes[row, vocab_id].item() == reference_hash(seed, position, vocab_id)


def test_noise_hash_is_pinned():
    # NOTE: changing these changes every seeded completion ever served: bump a protocol version if you must.
    hashes = noise_hash(torch.tensor([0, 2**63 - 1]), torch.tensor([0, 4095]), 3)
    assert hashes.tolist() == [[2167721464, 10027521, 2423355346], [30303077, 4174752314, 94231705]]


def test_noise_is_the_same_in_any_row_and_batch_size():
    alone = request_noise(torch.tensor([42]), torch.tensor([17]), VOCAB)[0]  # [vocab]
    for num_rows, at_row in [(2, 1), (5, 3), (32, 0), (32, 17)]:
        seeds = torch.randint(0, 2**62, (num_rows,))
        positions = torch.randint(0, 5000, (num_rows,))
        seeds[at_row], positions[at_row] = 42, 17
        assert torch.equal(request_noise(seeds, positions, VOCAB)[at_row], alone)


def test_noise_differs_across_seeds_and_positions():
    noise = request_noise(torch.tensor([7, 7, 8, 2**32 + 7]), torch.tensor([100, 101, 100, 100]), VOCAB)
    for a in range(4):
        for b in range(a + 1, 4):
            assert (noise[a] != noise[b]).float().mean() > 0.99


def test_noise_is_open_unit_interval_exact_and_roughly_uniform():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        noise = request_noise(torch.arange(64) * (2**57), torch.arange(64) * 65537, 4096)  # [64, 4096]
    assert noise.dtype == torch.float32
    assert noise.min() > 0 and noise.max() < 1
    numerators = noise.double() * 2**24
    assert torch.equal(numerators, numerators.round()) and bool((numerators % 2 == 1).all())
    assert abs(noise.double().mean().item() - 0.5) < 0.005
    histogram = torch.histc(noise, bins=10, min=0, max=1) / noise.numel()
    assert (histogram - 0.1).abs().max() < 0.005


# ---- batch invariance ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.8, top_k=50, top_p=0.9),
        SamplingParams(temperature=0.6, top_p=0.5),
    ],
)
def test_row_output_is_independent_of_batch_and_slot(params):
    logits_row = torch.randn(VOCAB, generator=torch.Generator().manual_seed(3)) * 3  # [vocab]
    alone = sample_in_batch(logits_row, params, seed=99, position=1234, num_rows=1, at_row=0)
    for num_rows, at_row in [(2, 1), (5, 2), (32, 0), (32, 17), (32, 31)]:
        other = sample_in_batch(logits_row, params, seed=99, position=1234, num_rows=num_rows, at_row=at_row)
        assert_outputs_equal(other, alone)


def test_padding_rows_do_not_change_real_rows():
    logits = torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(4))  # [8, vocab]
    params = [
        SamplingParams(temperature=0.9, top_p=0.95),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.0),
    ]
    seeds, positions = [11, 12, 13], [5, 6, 7]
    unpadded = Sampler()(logits[:3], SamplingBatch.build(params, seeds, positions, 3, "cpu"), 4)
    padded_batch = SamplingBatch.build(params, seeds, positions, 8, "cpu")
    padded = Sampler()(logits, padded_batch, 4)
    assert padded_batch.temperatures[3:].eq(0).all() and padded_batch.seeds[3:].eq(0).all()
    assert_outputs_equal(select_rows(padded, slice(0, 3)), unpadded)


def test_build_rejects_more_requests_than_rows():
    with pytest.raises(ValueError):
        SamplingBatch.build([SamplingParams()] * 3, [1, 2, 3], [0, 0, 0], 2, "cpu")


# ---- semantics ---------------------------------------------------------------------------------------------


def test_greedy_and_top_k_1_are_argmax_of_raw_logits():
    logits = torch.randn(64, VOCAB, generator=torch.Generator().manual_seed(5)) * 2  # [64, vocab]
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=1.5, top_k=1)):
        output = sample_rows(logits, [params] * 64, list(range(64)), [10] * 64, num_logprobs=3)
        assert torch.equal(output.token_ids, logits.argmax(dim=-1))
        assert torch.equal(output.logprobs, torch.log_softmax(logits, -1).max(dim=-1).values)
        assert torch.equal(output.topk_ids[:, 0], output.token_ids)


def test_top_k_never_samples_outside_the_k_largest():
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(6)).expand(500, VOCAB)
    allowed = set(logits[0].topk(5).indices.tolist())
    output = sample_rows(
        logits, [SamplingParams(temperature=2.0, top_k=5)] * 500, list(range(500)), [3] * 500
    )
    sampled = set(output.token_ids.tolist())
    assert sampled <= allowed and len(sampled) > 1


def test_top_p_keeps_exactly_the_nucleus():
    # probs by vocab id: 0.15, 0.5, 0.05, 0.3; sorted 0.5, 0.3 | 0.15, 0.05; mass before 0.15 is 0.8 >= 0.75
    logits = torch.tensor([0.15, 0.5, 0.05, 0.3]).log()[None, :].expand(400, 4)  # [400, 4]
    mask = top_k_top_p_mask(logits[:1], torch.tensor([0]), torch.tensor([0.75]))
    assert mask.tolist() == [[False, True, False, True]]
    output = sample_rows(logits, [SamplingParams(top_p=0.75)] * 400, list(range(400)), [0] * 400)
    assert set(output.token_ids.tolist()) == {1, 3}


def test_top_p_and_top_k_ties_prefer_the_lower_index():
    logits = torch.tensor(
        [[0.0, 5.0, 5.0, 1.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0]]
    )  # 10 tied at the top
    # NOTE: the tied tokens hold almost all the mass, about 0.1 each: mass before the 4th tied one is ~0.3.
    mask = top_k_top_p_mask(logits, torch.tensor([0]), torch.tensor([0.25]))
    assert mask[0].nonzero().flatten().tolist() == [1, 2, 4]
    mask = top_k_top_p_mask(logits, torch.tensor([2]), torch.tensor([1.0]))
    assert mask[0].nonzero().flatten().tolist() == [1, 2]


def test_tied_row_samples_the_same_token_in_any_slot():
    logits_row = torch.full((VOCAB,), 2.0)
    logits_row[::7] = 3.0  # [vocab], many ties at the top
    params = SamplingParams(temperature=0.9, top_p=0.3)
    alone = sample_in_batch(logits_row, params, seed=5, position=50, num_rows=1, at_row=0)
    kept = top_k_top_p_mask(logits_row[None, :] / 0.9, torch.tensor([0]), torch.tensor([0.3]))[0]
    assert kept.nonzero().flatten().tolist() == list(range(0, 7 * int(kept.sum()), 7))
    assert kept[alone.token_ids].item()
    for num_rows, at_row in [(2, 0), (5, 4), (32, 17)]:
        assert_outputs_equal(sample_in_batch(logits_row, params, 5, 50, num_rows, at_row), alone)


def test_empirical_frequencies_match_softmax():
    probs = torch.tensor([0.4, 0.25, 0.15, 0.12, 0.08])
    logits = probs.log()[None, :].expand(4000, 5)  # [4000, 5]
    seeds, positions = [i // 100 for i in range(4000)], [i % 100 for i in range(4000)]
    output = sample_rows(logits, [SamplingParams(temperature=1.0)] * 4000, seeds, positions)
    frequencies = torch.bincount(output.token_ids, minlength=5).float() / 4000
    assert (frequencies - probs).abs().max() < 0.03


# ---- request seeds -----------------------------------------------------------------------------------------


def test_seed_from_request_id_is_stable_and_spread():
    assert seed_from_request_id("req-0") == 5633629080992189509
    assert seed_from_request_id("req-0", base_seed=1) == 105861785912007719
    seeds = {seed_from_request_id(f"req-{i}") for i in range(1000)}
    assert len(seeds) == 1000 and all(0 <= seed < 2**63 for seed in seeds)
    assert max(seeds) > 2**62  # NOTE: the top bits are used too
    assert seed_from_request_id("req-0", base_seed=-1) != seed_from_request_id("req-0")
