"""The per-token series counted in a tally and written once per loop turn (router/token_tally.py) expose what
Prometheus' own one-at-a-time updates expose, and are never stale when /metrics renders."""

import asyncio

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from router.metrics import GC_PAUSE_BUCKETS_S, INTER_TOKEN_LATENCY_BUCKETS_S, RouterMetrics
from router.token_tally import StreamedTokenTally

# NOTE: every bound itself (Prometheus' le: a gap equal to a bound counts in that bound's bucket), between bounds,
# below the first and past the last (+Inf)
GAPS = [*INTER_TOKEN_LATENCY_BUCKETS_S, 0.0, 0.003, 0.02, 0.0125, 0.6, 3.3, 95.0, 1e4]


def series(name: str):
    registry = CollectorRegistry()
    tokens = Counter(f"{name}_tokens", "tokens", ["model_name"], registry=registry).labels("m")
    gaps = Histogram(f"{name}_gaps", "gaps", ["model_name"], buckets=INTER_TOKEN_LATENCY_BUCKETS_S,
                     registry=registry).labels("m")
    return registry, tokens, gaps


def samples(registry: CollectorRegistry, name: str) -> dict:
    text = generate_latest(registry).decode()
    return {(s.name.removeprefix(name), s.labels.get("le")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if not s.name.endswith("_created")}


def test_a_flushed_tally_exposes_what_observing_each_token_exposes():
    reference, ref_tokens, ref_gaps = series("ref")
    tallied, tokens, gaps = series("tally")
    tally = StreamedTokenTally(tokens, gaps)
    tally.add(2, None)  # NOTE: a sample's first tokens: counted, no gap
    ref_tokens.inc(2)
    for gap in GAPS:
        ref_tokens.inc(1)
        ref_gaps.observe(gap)
    with_loop_turns = asyncio.run(add_in_one_turn(tally, GAPS))
    assert with_loop_turns == 0, "the tally wrote before its loop turn ended"
    expected, got = samples(reference, "ref"), samples(tallied, "tally")
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key  # NOTE: _sum adds in another order


async def add_in_one_turn(tally: StreamedTokenTally, gaps: list[float]) -> float:
    """Returns the tokens counted on the series before the loop turned."""
    for gap in gaps:
        tally.add(1, gap)
    before = tally._generated_tokens._value.get()
    await asyncio.sleep(0)  # NOTE: the flush runs as the next callback
    return before - 2


def test_every_turn_is_flushed_once_and_render_flushes_first():
    metrics = RouterMetrics(list, lambda: 0, model_name="m")

    async def stream() -> list[bytes]:
        rendered = []
        for turn in range(3):
            metrics.streamed_tokens.add(1, None if turn == 0 else 0.02)
            rendered.append(metrics.render())  # NOTE: in the same turn as the token
            await asyncio.sleep(0)
        metrics.streamed_tokens.add(5, 0.02)
        await asyncio.sleep(0)
        return rendered

    rendered = asyncio.run(stream())
    for turn, text in enumerate(rendered, start=1):
        assert f'vllm:generation_tokens_total{{model_name="m"}} {float(turn)}' in text.decode()
    final = metrics.render().decode()
    assert 'vllm:generation_tokens_total{model_name="m"} 8.0' in final
    assert 'vllm:inter_token_latency_seconds_count{model_name="m"} 3.0' in final


def test_outside_an_event_loop_each_add_is_written_at_once():
    _, tokens, gaps = series("sync")
    tally = StreamedTokenTally(tokens, gaps)
    tally.add(3, 0.5)
    assert tokens._value.get() == 3 and gaps._sum.get() == 0.5


def test_the_process_collections_reach_metrics_as_observing_each_would():
    metrics = RouterMetrics(list, lambda: 0, model_name="m")
    clock = iter([0.0, 0.0004, 1.0, 1.03, 2.0, 2.002])  # NOTE: pauses of 0.4, 30 and 2 ms
    metrics.collection_pauses._clock = lambda: next(clock)
    for generation in (0, 1, 0):
        metrics.collection_pauses._on_collection("start", {"generation": generation})
        metrics.collection_pauses._on_collection("stop", {"generation": generation})
    reference = CollectorRegistry()
    pauses = Histogram("ref", "pauses", ["generation"], buckets=GC_PAUSE_BUCKETS_S, registry=reference)
    for generation, seconds in ((0, 0.0004), (1, 0.03), (0, 0.002)):
        pauses.labels(str(generation)).observe(seconds)
    text = metrics.render().decode()
    got = {(s.name.removeprefix("corun_router_gc_pause_seconds"), s.labels["generation"], s.labels.get("le")):
           s.value for family in text_string_to_metric_families(text) for s in family.samples
           if s.name.startswith("corun_router_gc_pause_seconds") and not s.name.endswith("_created")}
    expected = {(s.name.removeprefix("ref"), s.labels["generation"], s.labels.get("le")): s.value
                for family in text_string_to_metric_families(generate_latest(reference).decode())
                for s in family.samples if not s.name.endswith("_created")}
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key
    assert got[("_count", "2", None)] == 0  # NOTE: a generation never collected shows, at zero
