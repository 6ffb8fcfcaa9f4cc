"""fixed_shape's bucketed and packed prefill on CPU float32: bitwise the same alone, batched, and packed in other
company, position and order; the inverse: the same comparisons at the packs' natural token counts find differences.

On this CPU a float32 GEMM row's bits depend on the row count only below 4 rows (measured: every M >= 4 gives row
0 the same bits here), so the inverse checks use prompts of 1-3 tokens, whose natural forwards have 1-3 rows.
"""

import dataclasses

import pytest
import torch

from corun import LLM, SamplingParams
from corun.model_runner import ModelRunner
from corun.request import Request
from corun.scheduler import PrefillChunk
from corun.step_inputs import build_prefill_pack
from node_core.serving import engine_fingerprint
from tests.conftest import varied_prompts
from tests.corun.test_determinism import PARAMS, completions, first_difference
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

pytestmark = pytest.mark.numerics

N = 16
BUCKETS = (4, 8, 16, 32, 64)
PACK = dict(prefill_pack_tokens=96, prefill_pack_seqs=6)


def engine_config(model: str, **scheduler) -> EngineConfig:
    return EngineConfig(model=model, num_threads=1, scheduler=SchedulerConfig(
        max_num_seqs=N, max_model_len=256, prefill_chunk_size=32, **scheduler), cache=CacheConfig(num_blocks=600))


def short_and_varied_prompts(num: int, seed: int) -> list[list[int] | str]:
    """Prompts of 1-3 tokens (where the CPU GEMM's bits depend on the row count) among longer ones (several
    chunks of 32)."""
    return [[7], [11, 12], [3, 4, 5]] + varied_prompts(num - 3, seed=seed, max_words=60)


@pytest.fixture(scope="module", params=["buckets", "packed"])
def padded_llm(request, tiny_model_dir):
    options = {"buckets": dict(prefill_buckets=BUCKETS), "packed": PACK}[request.param]
    return LLM.from_config(engine_config(tiny_model_dir, **options))


def test_alone_vs_batched_bitwise_identical(padded_llm):
    prompts = short_and_varied_prompts(12, seed=5)
    alone = [completions(padded_llm.generate([p], PARAMS))[0] for p in prompts]
    together = completions(padded_llm.generate(prompts, PARAMS))
    assert first_difference(alone, together) is None
    if padded_llm.config.scheduler.prefill_pack_tokens:
        assert padded_llm.engine.stats.max_prefill_batch > 1  # NOTE: the prompts really shared forwards


def test_packed_in_other_company_and_order_bitwise_identical(tiny_model_dir):
    llm = LLM.from_config(engine_config(tiny_model_dir, **PACK))
    prompts = short_and_varied_prompts(10, seed=8)
    reference = completions(llm.generate(prompts, PARAMS))
    order = [9, 2, 5, 0, 7, 1, 8, 3, 6, 4]
    reordered = completions(llm.generate([prompts[i] for i in order], PARAMS))
    assert first_difference(reference, [reordered[order.index(i)] for i in range(10)]) is None
    others = varied_prompts(7, seed=99, max_words=40)
    mixed = completions(llm.generate(others[:3] + prompts[:2] + others[3:], PARAMS))
    assert first_difference(reference[:2], mixed[3:5]) is None


@pytest.fixture(scope="module")
def pack_runner(tiny_model_dir):
    return ModelRunner(engine_config(tiny_model_dir, **PACK))


def pack_logits(runner: ModelRunner, prompts: list[list[int]], num_rows: int | None, first_block: int = 1):
    """Prefill each prompt as one chunk, all in one forward of num_rows rows (None: their natural count);
    -> [prompts, vocab] logits of each prompt's last token."""
    chunks, block = [], first_block
    for i, prompt in enumerate(prompts):
        request = Request(f"r{i}", prompt, PARAMS, 0, frozenset())
        num_blocks = -(-len(prompt) // runner.block_size)
        request.block_ids, block = list(range(block, block + num_blocks)), block + num_blocks
        chunks.append(PrefillChunk(request, 0, len(prompt)))
    rows = num_rows or sum(len(p) for p in prompts)
    inputs = build_prefill_pack(chunks, rows, runner.config.scheduler.prefill_pack_seqs, runner.block_size,
                                runner.table_rows)
    return runner.padded_prefill_logits(inputs)[: len(prompts)]


PROMPTS = [[5], [9, 2, 33], list(range(40, 60)), [8, 8]]


@pytest.mark.parametrize("num_rows", [96, pytest.param(None, marks=pytest.mark.mkl_default_mode)],
                         ids=["fixed-T", "inverse-natural-count"])
def test_a_prompts_logits_do_not_depend_on_its_pack_at_fixed_rows(pack_runner, num_rows):
    alone = [pack_logits(pack_runner, [p], num_rows)[0] for p in PROMPTS]
    packed = pack_logits(pack_runner, PROMPTS, num_rows)
    reversed_pack = pack_logits(pack_runner, PROMPTS[::-1], num_rows, first_block=20).flip(0)
    same = [torch.equal(a, p) and torch.equal(a, r) for a, p, r in zip(alone, packed, reversed_pack, strict=True)]
    if num_rows is None:  # NOTE: proves the comparison can fail here: the row count changes a short prompt's bits
        assert not all(same)
    else:
        assert all(same)


def test_packed_kernel_path_is_pack_invariant_and_matches_sdpa(pack_runner):
    """The CUDA path's attention (the packed Triton kernel, here in Triton's interpreter) gives a prompt the same
    bits in any pack, and the same values as the per-chunk SDPA path."""
    sdpa = pack_logits(pack_runner, PROMPTS, 96)
    pack_runner.packed_prefill_kernel = True
    try:
        alone = [pack_logits(pack_runner, [p], 96)[0] for p in PROMPTS]
        packed = pack_logits(pack_runner, PROMPTS[::-1], 96, first_block=20).flip(0)
    finally:
        pack_runner.packed_prefill_kernel = False
    assert all(torch.equal(a, p) for a, p in zip(alone, packed, strict=True))
    torch.testing.assert_close(packed, sdpa, rtol=1e-4, atol=1e-4)


def test_bucket_padding_is_part_of_the_bits(tiny_model_dir):
    """A 2-token prompt prefilled at its natural 2 rows and padded to a bucket of 4 rows differ on this CPU: which
    is why the buckets are part of the contract (and of the fingerprint)."""
    natural = LLM.from_config(engine_config(tiny_model_dir))
    bucketed = LLM.from_config(engine_config(tiny_model_dir, prefill_buckets=BUCKETS))
    assert completions(natural.generate([[11, 12]], PARAMS)) != completions(bucketed.generate([[11, 12]], PARAMS))
    assert natural.engine.runner.forward_counts()["num_padded_prefill_forwards"] == 0


def test_every_chunk_up_to_the_largest_bucket_takes_the_padded_path(tiny_model_dir):
    """A chunk exactly a bucket long runs padded too (on CUDA: its graph); only longer ones run natural."""
    llm = LLM.from_config(engine_config(tiny_model_dir, prefill_buckets=(4, 8, 16)))
    llm.generate([[1] * 8, [2] * 16, [3] * 5, [4] * 17], SamplingParams(max_tokens=1))
    counts = llm.engine.runner.forward_counts()
    # NOTE: 17 tokens are one chunk (prefill_chunk_size 32) longer than the largest bucket: natural length
    assert (counts["num_prefill_forwards"], counts["num_padded_prefill_forwards"]) == (4, 3)


def test_only_a_prompts_first_chunk_takes_a_bucket(tiny_model_dir):
    """Later chunks attend to KV in the cache: they run at natural length (a function of the prompt too)."""
    llm = LLM.from_config(EngineConfig(model=tiny_model_dir, num_threads=1, scheduler=SchedulerConfig(
        max_num_seqs=4, max_model_len=64, prefill_chunk_size=8, prefill_buckets=(4, 8, 16)),
        cache=CacheConfig(num_blocks=64)))
    llm.generate([[5] * 12], SamplingParams(max_tokens=1))
    counts = llm.engine.runner.forward_counts()
    assert (counts["num_prefill_forwards"], counts["num_padded_prefill_forwards"]) == (2, 1)


@pytest.mark.parametrize("options", [dict(prefill_buckets=BUCKETS), dict(prefill_buckets=(4, 8)), PACK,
                                     dict(prefill_pack_tokens=96, prefill_pack_seqs=5),
                                     dict(prefill_pack_tokens=64, prefill_pack_seqs=6),
                                     dict(decode_step_sizes=(4, 8))])
def test_prefill_shape_settings_are_in_the_fingerprint(tiny_model_dir, options):
    base = engine_config(tiny_model_dir)
    other = dataclasses.replace(base, scheduler=dataclasses.replace(base.scheduler, **options))
    assert engine_fingerprint(base, "digest") != engine_fingerprint(other, "digest")


def test_config_refuses_contradictory_prefill_shapes(tiny_model_dir):
    with pytest.raises(ValueError, match="exclude each other"):
        SchedulerConfig(prefill_buckets=(16,), prefill_pack_tokens=64, prefill_chunk_size=32)
    with pytest.raises(ValueError, match="prefill_chunk_size"):
        SchedulerConfig(prefill_pack_tokens=64, prefill_chunk_size=128)
    with pytest.raises(ValueError, match="increasing"):
        SchedulerConfig(prefill_buckets=(32, 16))


def test_padding_rows_write_only_the_null_block(pack_runner):
    for layer in pack_runner.kv_cache.layers:
        layer[0][1:].zero_(), layer[1][1:].zero_()
    pack_logits(pack_runner, [[5, 6, 7]], 96, first_block=3)
    written = {b for layer in pack_runner.kv_cache.layers for b in range(1, pack_runner.kv_cache.num_blocks)
               if layer[0][b].abs().sum() > 0}
    assert written == {3}


def test_a_node_s_kv_budget_is_not_in_the_fingerprint_but_its_block_size_is():
    """Prefill and decode nodes of one pool hold different amounts of KV (one GPU shared by both)."""
    base = EngineConfig(model="m")
    budgets = [dataclasses.replace(base, cache=CacheConfig(memory_budget_bytes=mib * 2**20)) for mib in (64, 60000)]
    assert engine_fingerprint(budgets[0], "d") == engine_fingerprint(budgets[1], "d") == engine_fingerprint(
        dataclasses.replace(base, cache=CacheConfig(num_blocks=99)), "d")
    assert engine_fingerprint(base, "d") != engine_fingerprint(
        dataclasses.replace(base, cache=CacheConfig(block_size=32)), "d")
