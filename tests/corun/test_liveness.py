"""Liveness of the colocated engine (fixed_shape mode): prompts arriving faster than they are prefilled must not
starve the requests already decoding.

Time is counted in forwards, not seconds: each engine step is one forward, whose cost does not depend on how
loaded the host is, so the bound is a property and not a timing. One prompt arrives before every step, and a
prefill forward takes one prompt, so the waiting queue never empties while arrivals last (prefill saturated).
A request's inter-token gap is the number of forwards between two of its tokens (TPOT in forwards).
"""

import statistics

import pytest

from corun.engine import LLMEngine
from wire.config import CacheConfig, EngineConfig, SchedulerConfig
from wire.sampling_params import SamplingParams

PROMPT_TOKENS = 200
N = 128
PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def p99(values: list[int]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def inter_token_gaps(engine: LLMEngine, num_arrivals: int) -> list[int]:
    """Arrivals at one prompt per step for num_arrivals steps, then run to completion: every gap of every
    request, in forwards."""
    last_token_step: dict[str, int] = {}
    gaps: list[int] = []
    step = 0
    while step < num_arrivals or engine.has_unfinished():
        if step < num_arrivals:
            prompt = [(7 * step + i) % 1000 + 10 for i in range(PROMPT_TOKENS)]
            engine.add_request(f"r{step}", prompt, PARAMS)
        for sampled in engine.step():
            request_id = sampled.request.request_id
            if request_id in last_token_step:
                gaps.append(step - last_token_step[request_id])
            last_token_step[request_id] = step
        step += 1
    return gaps


def make_engine(model_dir: str, **scheduler) -> LLMEngine:
    return LLMEngine(EngineConfig(model=model_dir, num_threads=1, scheduler=SchedulerConfig(
        max_num_seqs=N, max_model_len=256, prefill_chunk_size=256, **scheduler), cache=CacheConfig(num_blocks=2400)))


@pytest.fixture(scope="module")
def default_engine(tiny_model_dir):
    return make_engine(tiny_model_dir)


def test_default_budget_bounds_the_wait_of_decoding_requests(default_engine):
    budget = default_engine.config.scheduler.prefill_token_budget
    assert budget > 0, "the default must bound prefill between decode steps"
    # NOTE: at most budget/PROMPT_TOKENS prefills (+1: the one crossing the budget runs whole), then the decode step
    bound = -(-budget // PROMPT_TOKENS) + 1 + 1
    short, long = inter_token_gaps(default_engine, 40), inter_token_gaps(default_engine, 80)
    assert max(short) <= bound and max(long) <= bound, (max(short), max(long), bound)
    assert p99(long) <= p99(short) + 1  # NOTE: a longer stretch of arrivals makes nobody wait longer


def test_inverse_budget_zero_starves_decoding_while_prompts_arrive(tiny_model_dir):
    """Algorithm 1 (budget 0): no decode step while a prompt waits, so TPOT grows with the arrival period."""
    engine = make_engine(tiny_model_dir, prefill_token_budget=0)
    short, long = inter_token_gaps(engine, 40), inter_token_gaps(engine, 80)
    assert max(short) >= 40 - 1 and max(long) >= 80 - 1, (max(short), max(long))
    assert p99(long) >= 1.8 * p99(short), (p99(short), p99(long))
