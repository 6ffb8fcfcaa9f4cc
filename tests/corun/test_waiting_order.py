"""Waiting prompts the prefix cache serves at least half of start first (corun/waiting_order.py): a multiple-choice
burst whose questions' choices arrive scattered prefills each question's choices after its context, not behind every
other context; the order bounds how long a prompt the cache does not serve may wait; and the outputs are those of
arrival order and of the cache off."""

import pytest

from corun import LLM, SamplingParams, waiting_order
from corun.block_manager import BlockManager
from corun.prefix_cache import PrefixCache
from corun.request import Request
from corun.waiting_order import CachedFirst
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

CHUNK = 16
PARAMS = SamplingParams(temperature=0.8, seed=7, max_tokens=4, logprobs=3, ignore_eos=True)


def request(request_id: str, prompt: list[int]) -> Request:
    return Request.create(request_id, prompt, PARAMS, seed=0, eos_token_ids=frozenset())


def cache_prompt(blocks: BlockManager, prompt: list[int]) -> None:
    """The prompt's full chunks in the cache, held by nobody."""
    writer = request("writer", prompt)
    assert blocks.allocate_request(writer, len(prompt))
    blocks.cache_scheduled(writer, len(prompt))
    blocks.release(writer)


def test_prompts_the_cache_serves_half_of_go_first_each_group_in_arrival_order():
    blocks = BlockManager(64, CHUNK, PrefixCache(CHUNK, salt=b"test"))
    context = list(range(100, 164))  # NOTE: 4 whole chunks
    cache_prompt(blocks, context)
    cold = request("cold", list(range(500, 560)))
    quarter = request("quarter", context[:CHUNK] + list(range(600, 648)))  # NOTE: 16 of 64 tokens cached
    half = request("half", context[:2 * CHUNK] + list(range(700, 732)))  # NOTE: 32 of 64
    most = request("most", context + [1, 2])  # NOTE: 64 of 66
    also_cold = request("also-cold", list(range(800, 820)))
    order = CachedFirst(blocks).order([cold, quarter, half, most, also_cold])
    assert [r.request_id for r in order] == ["half", "most", "cold", "quarter", "also-cold"]
    assert CachedFirst(BlockManager(64, CHUNK)).order([cold, most]) == [cold, most]  # NOTE: no cache: arrival order


def test_a_prompt_the_cache_does_not_serve_goes_by_arrival_once_it_waited_long_enough():
    blocks = BlockManager(64, CHUNK, PrefixCache(CHUNK, salt=b"test"))
    context = list(range(100, 164))
    cache_prompt(blocks, context)
    cold, cached = request("cold", list(range(500, 560))), request("cached", context + [1])
    order = CachedFirst(blocks)
    assert order.order([cold, cached]) == [cached, cold]
    for _ in range(waiting_order.MAX_WAIT_FORWARDS - 1):
        order.forward_ran()
    assert order.order([cold, cached]) == [cached, cold]
    order.forward_ran()
    assert order.order([cold, cached]) == [cold, cached]
    assert order.order([request("new-cold", list(range(900, 960))), cached])[0] is cached


def engine(model: str, enable_prefix_caching: bool) -> LLM:
    """Packed prefill, two prompts per forward: a queue of prompts waits behind the two in flight."""
    return LLM.from_config(EngineConfig(model=model, num_threads=1, scheduler=SchedulerConfig(
        max_model_len=256, max_num_seqs=16, prefill_chunk_size=CHUNK, prefill_pack_tokens=64, prefill_pack_seqs=2),
        cache=CacheConfig(num_blocks=256, enable_prefix_caching=enable_prefix_caching)))


def scattered_choices() -> list[tuple[str, list[int]]]:
    """Question a's first choice, then three other questions' first choices (contexts the cache does not hold),
    then a's other three choices."""
    def question(name: str, start: int, count: int) -> list[tuple[str, list[int]]]:
        context = list(range(start, start + 50))  # NOTE: 3 whole chunks, then 2 tokens
        return [(f"{name}{i}", context + [7 + i, 8 + i]) for i in range(count)]

    return question("a", 400, 1) + question("b", 500, 1) + question("c", 600, 1) + question("d", 700, 1) + \
        question("a", 400, 4)[1:]


def run_burst(llm: LLM, prompts) -> tuple[dict[str, int], dict[str, tuple]]:
    """Every prompt added at once: each one's step of its first token, and its (token ids, logprobs)."""
    requests = [llm.engine.add_request(request_id, prompt, PARAMS) for request_id, prompt in prompts]
    first_step, step = {}, 0
    while llm.engine.has_unfinished():
        step += 1
        for item in llm.engine.step():
            first_step.setdefault(item.request.request_id, step)
    return first_step, {r.request_id: (r.output_token_ids, r.output_logprobs) for r in requests}


@pytest.mark.numerics
@pytest.mark.parametrize("max_wait_forwards", [None, 0, 2], ids=["cached-first", "arrival-order", "waited-long-enough"])
def test_choices_whose_context_is_cached_pass_contexts_that_arrived_before_them(tiny_model_dir, monkeypatch,
                                                                                max_wait_forwards):
    """With the cached first, a's later choices start once a's context is cached, before c's and d's contexts
    that arrived before them. The inverses: in arrival order (every prompt past its wait) they start after d's;
    with a wait of 2 forwards, c and d (waiting since the first forward) go by arrival again before a's choices
    are cached. Each prompt's outputs are the cache-off outputs in every order."""
    if max_wait_forwards is not None:
        monkeypatch.setattr(waiting_order, "MAX_WAIT_FORWARDS", max_wait_forwards)
    prompts = scattered_choices()
    _, expected = run_burst(engine(tiny_model_dir, False), prompts)
    steps, served = run_burst(engine(tiny_model_dir, True), prompts)
    later_choices = [steps[f"a{i}"] for i in (1, 2, 3)]
    if max_wait_forwards is None:
        assert max(later_choices) < steps["c0"]
    else:
        assert steps["d0"] < min(later_choices)
    assert served == expected


def test_only_the_first_scan_limit_waiting_prompts_are_reordered(monkeypatch):
    """Past SCAN_LIMIT the queue keeps arrival order and is not looked at (a long queue costs a forward nothing
    more); within it, the cached prompt goes first. Inverse: with a larger limit, the last prompt moves too."""
    blocks = BlockManager(64, CHUNK, PrefixCache(CHUNK, salt=b"test"))
    context = list(range(100, 164))
    cache_prompt(blocks, context)
    waiting = [request("cold0", list(range(500, 560))), request("cached1", context + [1]),
               request("cold2", list(range(600, 660))), request("cached3", context + [3])]
    monkeypatch.setattr(waiting_order, "SCAN_LIMIT", 2)
    assert [r.request_id for r in CachedFirst(blocks).order(waiting)] == ["cached1", "cold0", "cold2", "cached3"]
    assert waiting[3].first_seen_forward is None
    monkeypatch.setattr(waiting_order, "SCAN_LIMIT", 4)
    assert [r.request_id for r in CachedFirst(blocks).order(waiting)] == ["cached1", "cached3", "cold0", "cold2"]


def test_a_prompt_s_first_chunk_key_alone_is_its_chain_s_first():
    """The order hashes a waiting prompt's first chunk alone (BlockManager.first_chunk_key); a cached prompt is found
    by the same key its chain starts with. Inverse: another salt (another model or chunk rule) gives another key."""
    prompt = list(range(100, 140))
    blocks = BlockManager(64, CHUNK, PrefixCache(CHUNK, salt=b"test"))
    alone = request("alone", prompt)
    assert blocks.first_chunk_key(alone) == blocks.chunk_keys(request("chained", prompt))[0]
    assert alone.chunk_keys is None  # NOTE: the chain is not hashed for the order
    other = BlockManager(64, CHUNK, PrefixCache(CHUNK, salt=b"other"))
    assert other.first_chunk_key(request("salted", prompt)) != blocks.first_chunk_key(alone)


def test_prompts_sharing_a_first_chunk_wait_next_to_the_first_of_them():
    """Among the prompts the cache does not serve, those with the same first chunk follow the first of them to
    arrive (so one forward can compute their context once for all: corun/scheduler.py pack_prefill_chunks); a prompt
    without a full chunk keeps its place. Inverse: prompts that share nothing keep arrival order."""
    blocks = BlockManager(64, CHUNK, PrefixCache(CHUNK, salt=b"test"))
    a, b = list(range(100, 150)), list(range(200, 250))
    waiting = [request("a0", a + [1]), request("b0", b + [1]), request("short", [5, 6, 7]),
               request("c0", list(range(300, 350))), request("a1", a + [2]), request("b1", b + [2]),
               request("a2", a + [3])]
    order = CachedFirst(blocks).order(waiting)
    assert [r.request_id for r in order] == ["a0", "a1", "a2", "b0", "b1", "short", "c0"]
    apart = [request(f"p{i}", list(range(100 * i, 100 * i + 40))) for i in range(1, 5)]
    assert CachedFirst(blocks).order(apart) == apart


@pytest.mark.numerics
@pytest.mark.parametrize("max_wait_forwards", [None, 0], ids=["grouped", "arrival-order"])
def test_a_question_s_scattered_choice_rides_its_context_s_forward(tiny_model_dir, monkeypatch, max_wait_forwards):
    """Contexts of one chunk, two prompts per forward, a's second choice arriving after b's, c's and d's contexts: it
    is packed beside a's first, served the context chunk that forward computes, and has its first token before a's
    first and b's. The inverse: in arrival order (every prompt past its wait) it starts after b's. Each prompt's
    outputs are the cache-off outputs either way."""
    if max_wait_forwards is not None:
        monkeypatch.setattr(waiting_order, "MAX_WAIT_FORWARDS", max_wait_forwards)
    contexts = {name: list(range(start, start + CHUNK)) for name, start in zip("abcd", (400, 500, 600, 700))}
    prompts = [(f"{name}0", contexts[name] + [7, 8]) for name in "abcd"] + [("a1", contexts["a"] + [9, 10])]
    _, expected = run_burst(engine(tiny_model_dir, False), prompts)
    steps, served = run_burst(engine(tiny_model_dir, True), prompts)
    if max_wait_forwards is None:
        assert steps["a1"] < min(steps["a0"], steps["b0"])
    else:
        assert steps["b0"] < steps["a1"]
    assert served == expected
