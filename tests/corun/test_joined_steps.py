"""A prefill forward that carries the decode step (SchedulerConfig.decode_rides_prefill) on CPU float32.

Whether a (decode rows, pack rows) pair may run as one forward is a fact of the CPU and its kernels, so these tests
assert the property wherever they run: every pair the probe kept leaves every request's tokens and logprobs bitwise
as with the two forwards apart, alone and batched, and joined forwards really ran; the inverse, the pairs joined
the probe rejects on this machine (decode steps of 2 rows, where a CPU GEMM row's bits follow the row count), changes
them; where this machine rejects none, that half is skipped, saying why.
"""

from types import SimpleNamespace

import pytest
import torch

from corun import LLM, SamplingParams
from corun.joined_steps import (
    MIN_PACK_ROWS_OVER_A_GRAPH,
    joinable,
    joined_matches_apart,
    most_rows_through_pieces,
    runs_through_pieces,
    verified_joined_shapes,
)
from corun.piecewise_graphs import PiecewiseForward
from tests.conftest import varied_prompts
from tests.corun.test_determinism import completions, first_difference
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

pytestmark = pytest.mark.numerics

N, T = 8, 96
PARAMS = SamplingParams(temperature=0.7, top_p=0.9, seed=5, max_tokens=8, logprobs=3, ignore_eos=True)


def make_llm(model: str, rides: bool, num_seqs: int = N, budget: int | None = None) -> LLM:
    return LLM.from_config(EngineConfig(model=model, num_threads=1, scheduler=SchedulerConfig(
        max_num_seqs=num_seqs, max_model_len=256, prefill_chunk_size=32, prefill_pack_tokens=T, prefill_pack_seqs=4,
        decode_rides_prefill=rides, prefill_token_budget=budget), cache=CacheConfig(num_blocks=600)))


def completions_and_joined_packs(llm: LLM, prompt_list, params) -> tuple[list, list[int]]:
    """The completions, and the prompt rows of every forward that carried a decode step."""
    scheduler, rows = llm.engine.scheduler, []
    schedule = scheduler.schedule

    def recording_schedule():
        batch = schedule()
        if batch is not None and batch.decode_requests and batch.prefill_chunks:
            rows.append(sum(chunk.num_tokens for chunk in batch.prefill_chunks))
        return batch
    scheduler.schedule = recording_schedule
    try:
        return completions(llm.generate(prompt_list, params)), rows
    finally:
        del scheduler.schedule


def prompts() -> list[list[int] | str]:
    """More prompts than a pack holds, some longer than a chunk: packs run while earlier prompts decode."""
    return [[7], [11, 12]] + varied_prompts(12, seed=23, max_words=60)


@pytest.fixture(scope="module")
def joined(tiny_model_dir):
    return make_llm(tiny_model_dir, rides=True)


def test_the_probe_keeps_exactly_the_pairs_that_match_apart(joined):
    runner = joined.engine.runner
    pairs = {(d, p) for d in runner.decode_sizes for p in runner.pack_sizes}
    assert runner.joined_shapes == {pair for pair in pairs if joined_matches_apart(runner, *pair)}
    assert joined.engine.scheduler.decode_rides_prefill == bool(runner.joined_shapes)


def test_joined_forwards_keep_every_output_bitwise(tiny_model_dir, joined):
    if not joined.engine.runner.joined_shapes:
        pytest.skip("no (decode, pack) pair matched the forwards apart on this CPU: nothing runs joined")
    apart = completions(make_llm(tiny_model_dir, rides=False).generate(prompts(), PARAMS))
    together = completions(joined.generate(prompts(), PARAMS))
    alone = [completions(joined.generate([p], PARAMS))[0] for p in prompts()[:4]]
    assert first_difference(apart, together) is None
    assert first_difference(apart[:4], alone) is None
    # NOTE: without this the comparisons could pass with every decode step apart
    assert joined.engine.runner.num_joined_forwards > 0


def test_the_prefill_token_budget_caps_a_pack_that_carries_the_decode_step(tiny_model_dir, joined):
    """A decoding request waits through the whole joined forward for its next token: the budget caps its pack, and
    the outputs stay those of the forwards apart. Inverse: at the default budget (T) the same prompts join larger
    packs, so the cap is what kept them small."""
    if not joined.engine.runner.joined_shapes:
        pytest.skip("no (decode, pack) pair matched the forwards apart on this CPU: nothing runs joined")
    apart = completions(make_llm(tiny_model_dir, rides=False).generate(prompts(), PARAMS))
    capped_llm = make_llm(tiny_model_dir, rides=True, budget=32)
    capped, capped_rows = completions_and_joined_packs(capped_llm, prompts(), PARAMS)
    _, default_rows = completions_and_joined_packs(joined, prompts(), PARAMS)
    assert first_difference(apart, capped) is None
    assert capped_rows and max(capped_rows) <= 32
    assert max(default_rows) > 32


def test_a_prompt_that_asks_for_prompt_logprobs_runs_apart_and_gets_them(joined):
    runner = joined.engine.runner
    before = runner.num_joined_forwards
    params = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=2, ignore_eos=True)
    outputs = joined.generate(prompts()[:6], params)
    assert all(len(o.prompt_logprobs) == len(o.prompt_token_ids) for o in outputs)
    assert runner.num_joined_forwards == before or runner.joined_shapes == set()


def test_inverse_a_pair_the_probe_rejects_changes_the_bits(tiny_model_dir):
    """Proves the comparison above can fail here: decode steps of 2 rows (a CPU GEMM row's bits follow the row count
    below 4 rows) joined to packs anyway, which the probe rejects, change some request's outputs."""
    apart_llm = make_llm(tiny_model_dir, rides=False, num_seqs=2)
    runner = apart_llm.engine.runner
    pairs = {(d, p) for d in runner.decode_sizes for p in runner.pack_sizes}
    rejected = {pair for pair in pairs if not joined_matches_apart(runner, *pair)}
    if not rejected:
        pytest.skip(f"every pair {sorted(pairs)} matched the forwards apart on this CPU: none to force")
    apart = completions(apart_llm.generate(prompts(), PARAMS))
    llm = make_llm(tiny_model_dir, rides=False, num_seqs=2)
    llm.engine.runner.joined_shapes = rejected
    llm.engine.scheduler.decode_rides_prefill = True
    forced = completions(llm.generate(prompts(), PARAMS))
    assert llm.engine.runner.num_joined_forwards > 0
    assert first_difference(apart, forced) is not None, f"pairs the probe rejects ({sorted(rejected)}) gave the bits"


def test_captured_packs_are_joined_eagerly_only_from_the_size_where_eager_costs_nothing():
    graphs = SimpleNamespace(graphs={192: None, 512: None, 1024: None, 2048: None})
    runner = SimpleNamespace(pack_sizes=[192, 512, 1024, 2048, 8192], prefill_graph=graphs, piecewise_forward=None)
    assert [p for p in runner.pack_sizes if joinable(runner, 16, p)] == [1024, 2048, 8192]  # NOTE: 8192: no graph
    uncaptured = SimpleNamespace(pack_sizes=[192, 512], prefill_graph=None, piecewise_forward=None)
    assert [p for p in uncaptured.pack_sizes if joinable(uncaptured, 16, p)] == [192, 512]


def test_small_captured_packs_join_through_the_pieces_and_large_ones_eagerly():
    graphs = SimpleNamespace(graphs={192: None, 512: None, 1024: None, 2048: None})
    pieces = SimpleNamespace(size_for=lambda rows: next((s for s in (256, 512, 1024, 2048) if s >= rows), None))
    runner = SimpleNamespace(prefill_graph=graphs, piecewise_forward=pieces)
    assert joinable(runner, 16, 192) and joinable(runner, 256, 512)  # NOTE: 208 and 768 rows: pieces of 256, 1024
    assert runs_through_pieces(runner, 16, 192) and runs_through_pieces(runner, 256, 512)
    assert not joinable(runner, 1600, 512)  # NOTE: 2,112 rows: no piece holds them, and a captured 512 is too small
    # NOTE: a piece would pad 1,040 rows to 2,048; eagerly, from MIN_PACK_ROWS_OVER_A_GRAPH, the GEMMs hide the launches
    assert joinable(runner, 16, 1024) and not runs_through_pieces(runner, 16, 1024)


def test_the_pieces_captured_for_joins_stop_at_the_largest_pair_that_rides_through_them():
    """N decode rows and the largest pack below MIN_PACK_ROWS_OVER_A_GRAPH: larger pieces would never replay."""
    cuda = SimpleNamespace(max_num_seqs=256, prefill_pack_tokens=8192,
                           prefill_pack_sizes=(32, 64, 192, 512, 768, 1024, 1536, 2048, 4096))
    assert most_rows_through_pieces(cuda) == 256 + 768
    small_t = SimpleNamespace(max_num_seqs=8, prefill_pack_tokens=96, prefill_pack_sizes=())
    assert most_rows_through_pieces(small_t) == 8 + 96
    only_large = SimpleNamespace(max_num_seqs=256, prefill_pack_tokens=8192, prefill_pack_sizes=(1024, 2048))
    assert most_rows_through_pieces(only_large) == 0  # NOTE: every pack rides eagerly: no pieces at all


def test_the_probe_runs_each_pack_apart_once_for_all_its_decode_sizes(tiny_model_dir, monkeypatch):
    """A pack's forward apart serves every decode size tried with it; each pair keeps its own decode step apart and
    its own joined forward (and the verdicts are those of each pair probed alone: the test above)."""
    import corun.joined_steps as joined_steps

    llm = LLM.from_config(EngineConfig(model=tiny_model_dir, num_threads=1, scheduler=SchedulerConfig(
        max_num_seqs=N, max_model_len=256, prefill_chunk_size=32, prefill_pack_tokens=T, prefill_pack_seqs=4,
        prefill_pack_sizes=(32, 64), decode_step_sizes=(4,)), cache=CacheConfig(num_blocks=600)))
    runner = llm.engine.runner
    # NOTE: the decode sizes tried, whichever this host's numerics verify (under ATEN_CPU_CAPABILITY=default the size
    # 4 does not): what is counted is the probe's calls per pair, not which pairs hold
    runner.decode_sizes = [4, N]
    calls = {"pack": 0, "decode": 0, "joined": 0}

    def counted(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(joined_steps.pack_sizes, "probe_outputs",
                        counted("pack", joined_steps.pack_sizes.probe_outputs))
    monkeypatch.setattr(joined_steps.decode_sizes, "probe_outputs",
                        counted("decode", joined_steps.decode_sizes.probe_outputs))
    monkeypatch.setattr(joined_steps, "joined_outputs", counted("joined", joined_steps.joined_outputs))
    kept = verified_joined_shapes(runner)
    pairs = len(runner.pack_sizes) * len(runner.decode_sizes)
    assert pairs > len(runner.pack_sizes)  # NOTE: else there would be nothing to spare
    assert calls == {"pack": len(runner.pack_sizes), "decode": pairs, "joined": pairs}
    assert kept == runner.joined_shapes


def through_pieces(llm: LLM) -> LLM:
    """llm's runner with piecewise forwards (run eagerly through their buffers: capture is CUDA-only) holding every
    joined forward, its pairs tried again through them, as a CUDA runner tries its captured pieces."""
    runner = llm.engine.runner
    runner.piecewise_forward = PiecewiseForward(runner.model, runner.kv_cache.layers, [32, 64, 128], torch.float32,
                                                runner.device, capture=False)
    runner.joined_shapes = verified_joined_shapes(runner)
    llm.engine.scheduler.decode_rides_prefill = bool(runner.joined_shapes)
    return llm


def test_joined_forwards_through_the_pieces_keep_every_output_bitwise(tiny_model_dir):
    """The joined forward padded to a piece's size (8 decode rows + a 96-row pack = 104 rows, run at 128): where the
    probe keeps the pair through the pieces, every output is as with the two forwards apart."""
    llm = through_pieces(make_llm(tiny_model_dir, rides=True))
    runner = llm.engine.runner
    if not runner.joined_shapes:
        pytest.skip("no (decode, pack) pair matched the forwards apart through the pieces on this CPU")
    apart = completions(make_llm(tiny_model_dir, rides=False).generate(prompts(), PARAMS))
    probed = runner.num_piecewise_forwards  # NOTE: the probe's joined forwards
    assert first_difference(apart, completions(llm.generate(prompts(), PARAMS))) is None
    # NOTE: without these the comparison could pass with every forward apart, or joined eagerly
    assert runner.num_joined_forwards > 0 and runner.num_piecewise_forwards - probed == runner.num_joined_forwards


def test_inverse_through_the_pieces_a_pair_the_probe_rejects_changes_the_bits(tiny_model_dir):
    """Proves the comparison above can fail through the pieces: decode steps of 2 rows joined to a pack, padded to
    128 rows, which the probe rejects where a CPU GEMM row's bits follow the row count, change some outputs."""
    llm = through_pieces(make_llm(tiny_model_dir, rides=False, num_seqs=2))
    runner = llm.engine.runner
    rejected = {(d, p) for d in runner.decode_sizes for p in runner.pack_sizes} - runner.joined_shapes
    if not rejected:
        pytest.skip("every pair matched the forwards apart through the pieces on this CPU: none to force")
    apart = completions(make_llm(tiny_model_dir, rides=False, num_seqs=2).generate(prompts(), PARAMS))
    runner.joined_shapes = rejected
    llm.engine.scheduler.decode_rides_prefill = True
    forced = completions(llm.generate(prompts(), PARAMS))
    assert runner.num_piecewise_forwards > 0
    assert first_difference(apart, forced) is not None, f"pairs the probe rejects ({sorted(rejected)}) gave the bits"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_the_gpu_joined_forwards_keep_every_output_bitwise(dtype):
    """The CUDA defaults (packed prefill in graphs, decode graphs at verified sizes, async scheduling): more prompts
    than a pack holds, so later packs carry the decode steps of earlier prompts (captured packs from
    MIN_PACK_ROWS_OVER_A_GRAPH rows eagerly, smaller ones through the piecewise graphs)."""
    def make(rides: bool) -> LLM:
        sched = SchedulerConfig(max_num_seqs=16, max_model_len=2048, prefill_chunk_size=64, max_num_batched_tokens=2048,
                                prefill_pack_seqs=4, decode_rides_prefill=rides)
        return LLM.from_config(EngineConfig(model="random:qwen3-tiny", dtype=dtype, device="cuda", scheduler=sched,
                                            cache=CacheConfig(num_blocks=2048)))

    gen = torch.Generator().manual_seed(3)
    lengths = (1, 3, 17, 64, 65, 130, 200, 300, 5, 90, 1100, 1500)  # NOTE: the last pack holds >= 1024 rows
    batch = [torch.randint(0, 2000, (n,), generator=gen).tolist() for n in lengths]
    joined = make(rides=True)
    if not joined.engine.runner.joined_shapes:  # NOTE: the H200 in float32: every pair rejected (stop 38)
        pytest.skip(f"no (decode, pack) pair matched the forwards apart on this GPU in {dtype}: nothing runs joined")
    runner = joined.engine.runner
    assert all(pack >= MIN_PACK_ROWS_OVER_A_GRAPH or runner.piecewise_forward.size_for(rows + pack)
               for rows, pack in runner.joined_shapes)
    apart = completions(make(rides=False).generate(batch, PARAMS))
    together = completions(joined.generate(batch, PARAMS))
    alone = [completions(joined.generate([p], PARAMS))[0] for p in batch[:3]]
    assert first_difference(apart, together) is None
    assert first_difference(apart[:3], alone) is None
    assert runner.num_joined_forwards > 0 and runner.num_piecewise_forwards > 0
