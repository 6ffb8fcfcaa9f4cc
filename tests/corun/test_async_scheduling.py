"""Async scheduling (corun/decode_ahead.py): decode steps launched before the host reads the previous step's tokens
give exactly the synchronous engine's tokens, logprobs and finish reasons; the inverse shows the comparison can fail.

On CPU there is nothing to overlap (the forward is synchronous), but every piece of the path runs: inputs taken
from the previous step's sampled tensor, positions one ahead, rows that learn late that they ended, aborts while a
step is in flight, and the synchronous fallback for rows whose logits depend on their history.
"""

import dataclasses
import random
import types

import pytest

import corun.model_runner
from corun import LLM, SamplingParams
from node_core.server import NodeServer
from tests.conftest import varied_prompts

pytestmark = pytest.mark.numerics

ENGINE = dict(max_num_seqs=8, max_model_len=512, prefill_chunk_size=64, dtype="float32")


def mixed_params(count: int, seed: int, penalties: bool = False) -> list[SamplingParams]:
    """Greedy and sampled rows of several lengths (some with penalties)."""
    rng = random.Random(seed)
    return [SamplingParams(temperature=rng.choice([0.0, 0.8]), seed=rng.randrange(1000),
                           max_tokens=rng.randint(1, 20), logprobs=2, ignore_eos=True,
                           frequency_penalty=0.5 if penalties and rng.random() < 0.3 else 0.0)
            for _ in range(count)]


def with_stops(llm: LLM, prompts, params: list[SamplingParams]) -> list[SamplingParams]:
    """Every other request stops at a token it samples mid-way (known from a run without stops), so rows end by a
    stop token (learnt one step late when ahead) as well as by length."""
    runs = outputs(llm, prompts, params)
    stopping = []
    for i, (p, (token_ids, _, _)) in enumerate(zip(params, runs, strict=True)):
        stop = (token_ids[len(token_ids) // 2],) if i % 2 and len(token_ids) > 2 else ()
        stopping.append(dataclasses.replace(p, stop_token_ids=stop))
    return stopping


def outputs(llm: LLM, prompts, params) -> list:
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs, o.outputs[0].finish_reason)
            for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    return {on: LLM(tiny_model_dir, async_scheduling=on, **ENGINE) for on in (True, False)}


@pytest.mark.parametrize("batched_rows", [False, True], ids=["per-request-attention", "batched-decode-rows"])
def test_async_scheduling_gives_the_synchronous_outputs(engines, batched_rows):
    for llm in engines.values():
        llm.engine.runner.batched_decode_rows = batched_rows  # NOTE: the CUDA path's step building, torch kernels
    prompts = varied_prompts(20, seed=0)
    params = with_stops(engines[False], prompts, mixed_params(20, seed=3))
    ahead_before = engines[True].engine.runner.num_forwards_ahead
    overlapped, synchronous = (outputs(engines[on], prompts, params) for on in (True, False))
    assert engines[True].engine.runner.num_forwards_ahead > ahead_before
    assert engines[False].engine.runner.num_forwards_ahead == 0
    assert {reason for _, _, reason in synchronous} == {"stop", "length"}  # NOTE: both endings were exercised
    assert overlapped == synchronous
    assert not engines[True].engine.has_unfinished()


def test_inverse_inputs_not_taken_from_the_step_in_flight_change_outputs(engines, monkeypatch):
    """If the step ahead used the host's stale state (last known token, its position) the outputs would change:
    the equality above can fail."""
    prompts = varied_prompts(20, seed=0)
    params = with_stops(engines[False], prompts, mixed_params(20, seed=3))
    reference = outputs(engines[False], prompts, params)
    monkeypatch.setattr(corun.model_runner, "tokens_ahead", lambda requests, previous: [0] * len(requests))
    assert outputs(engines[True], prompts, params) != reference


def adjusting_params(count: int, seed: int) -> list[SamplingParams]:
    """Rows whose logits depend on their history: penalties (counts of each token so far), min_tokens (how many),
    logit bias; the rest plain."""
    rng = random.Random(seed)
    params = []
    for p in mixed_params(count, seed):
        kind = rng.choice(["penalties", "min_tokens", "bias", "plain"])
        if kind == "penalties":
            p = dataclasses.replace(p, frequency_penalty=0.8, presence_penalty=0.5, repetition_penalty=1.3)
        elif kind == "min_tokens":
            p = dataclasses.replace(p, min_tokens=min(p.max_tokens, 4), ignore_eos=False)
        elif kind == "bias":
            p = dataclasses.replace(p, logit_bias=((rng.randrange(200), 3.0),))
        params.append(p)
    return params


def test_rows_with_logit_adjustments_run_ahead_with_the_same_outputs(engines):
    """Penalties count the token in flight on the device, min_tokens its place; the outputs agree."""
    prompts, params = varied_prompts(16, seed=5), adjusting_params(16, seed=8)
    assert any(p.uses_penalties for p in params) and any(p.min_tokens for p in params)
    ahead_before = engines[True].engine.runner.num_forwards_ahead
    assert outputs(engines[True], prompts, params) == outputs(engines[False], prompts, params)
    assert engines[True].engine.runner.num_forwards_ahead > ahead_before


def test_inverse_penalties_without_the_token_in_flight_change_outputs(engines, monkeypatch):
    prompts = varied_prompts(16, seed=5)
    params = [dataclasses.replace(p, frequency_penalty=1.0, repetition_penalty=1.5, ignore_eos=True)
              for p in mixed_params(16, seed=8)]
    reference = outputs(engines[False], prompts, params)
    monkeypatch.setattr(corun.model_runner, "fill_penalty_tokens", lambda *args: None)
    assert outputs(engines[True], prompts, params) != reference


def test_bad_words_make_the_step_synchronous(engines):
    """A bad word's ban depends on the values of the row's last tokens, which only the host has read."""
    params = SamplingParams(max_tokens=4, seed=3, bad_words_token_ids=((5, 6),))
    runner = engines[True].engine.runner
    assert not runner.overlaps([types.SimpleNamespace(params=params)])
    assert runner.overlaps([types.SimpleNamespace(params=dataclasses.replace(params, bad_words_token_ids=()))])
    prompts = varied_prompts(6, seed=9)
    assert outputs(engines[True], prompts, params) == outputs(engines[False], prompts, params)


def test_abort_while_a_step_is_in_flight(engines):
    """A request aborted while its step runs ahead gets no token from it; the others are unchanged."""
    prompts = varied_prompts(6, seed=11)
    params = SamplingParams(temperature=0.7, seed=1, max_tokens=12, logprobs=1, ignore_eos=True)
    results = {}
    for on, llm in engines.items():
        engine = llm.engine
        requests = [engine.add_request(f"abort-{on}-{i}", list(range(5 + i, 40 + i)), params)
                    for i in range(len(prompts))]
        while not all(len(r.output_token_ids) >= 3 for r in requests):
            engine.step()
        assert not on or engine.runner.decode_in_flight is not None
        engine.abort_request(requests[0])
        num_aborted_tokens = len(requests[0].output_token_ids)
        while engine.has_unfinished():
            engine.step()
        assert len(requests[0].output_token_ids) == num_aborted_tokens
        results[on] = [(r.output_token_ids, r.output_logprobs) for r in requests[1:]]
    assert results[True] == results[False]


def test_a_node_frees_blocks_only_after_the_step_in_flight_is_read():
    """A decode node's freed blocks may be written at once by another process's KV transfer: a request's blocks wait
    until no step in flight writes them."""
    request, released = types.SimpleNamespace(block_ids=[3, 4]), []
    in_flight = types.SimpleNamespace(holds=lambda r: r is request)
    node = types.SimpleNamespace(runner=types.SimpleNamespace(decode_in_flight=in_flight), frees_after_step=[],
                                 block_manager=types.SimpleNamespace(release=released.append))
    node.free = lambda r: NodeServer.free(node, r)
    NodeServer.free(node, request)
    assert released == [] and node.frees_after_step == [request]
    NodeServer.free_settled(node)  # NOTE: still in flight: waits again
    assert released == []
    node.runner.decode_in_flight = None
    NodeServer.free_settled(node)
    assert released == [request] and node.frees_after_step == []


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fixed_shape", "mixed"])
def test_async_scheduling_on_cuda_graphs_gives_the_synchronous_outputs(mode):
    """On CUDA the step ahead replays the captured decode graph with its input tokens (and the penalties' count of
    them) gathered on the device, while the host reads the step before; both modes (mixed: its decode-only steps)."""
    from wire.config import CacheConfig, EngineConfig, SchedulerConfig

    runs = {}
    for on in (False, True):
        config = EngineConfig(model="random:qwen3-tiny", dtype="bfloat16", device="cuda", cache=CacheConfig(
            num_blocks=2048), scheduler=SchedulerConfig(mode=mode, max_num_seqs=16, max_model_len=512,
                                                         prefill_chunk_size=64, async_scheduling=on))
        llm = LLM.from_config(config)
        assert llm.engine.runner.decode_graph is not None
        prompts = [list(range(3 + i, 40 + 7 * i)) for i in range(24)]
        if not on:  # NOTE: first, to choose the stop tokens the requests reach
            runs["params"] = with_stops(llm, prompts, adjusting_params(24, seed=4))
        runs[on] = outputs(llm, prompts, runs["params"])
        if on:
            assert llm.engine.runner.num_forwards_ahead > 0
        del llm
    assert runs[True] == runs[False]
