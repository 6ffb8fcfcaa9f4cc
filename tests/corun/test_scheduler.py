"""Schedulers without a model: fixed_shape (paper Algorithms 1 and 2) and mixed (vLLM-style mixed batches).

The helper `run` plays the model runner and the engine's postprocess: it advances num_computed_tokens, appends
a token after a prompt's last chunk and after every decode, and finishes requests at max_tokens.
"""

import pytest

from corun.block_manager import NULL_BLOCK, BlockManager
from corun.request import Request, RequestStatus
from corun.scheduler import FixedShapeScheduler, MixedScheduler, RequestRejected, ScheduledBatch, make_scheduler
from wire.config import SchedulerConfig, resolve_shape_defaults
from wire.sampling_params import SamplingParams

BLOCK_SIZE = 4


def make_request(request_id: str, num_prompt_tokens: int, max_tokens: int = 4) -> Request:
    return Request(request_id, list(range(1, num_prompt_tokens + 1)), SamplingParams(max_tokens=max_tokens),
                   seed=0, stop_token_ids=frozenset())


def make(mode="fixed_shape", num_blocks=1000, **cfg):
    cfg = {"max_num_seqs": 4, "max_model_len": 256, "prefill_chunk_size": 8, **cfg}
    # NOTE: resolved as an engine on the CPU resolves it (an engine's scheduler never sees 'auto')
    sched = resolve_shape_defaults(SchedulerConfig(mode=mode, **cfg), "cpu", False, "native")
    return make_scheduler(sched, BlockManager(num_blocks, BLOCK_SIZE))


def run(scheduler, batch: ScheduledBatch) -> None:
    """What the runner + engine postprocess do with a batch (every sampled token is token 7)."""
    sampled = list(batch.decode_requests)
    for chunk in batch.prefill_chunks:
        assert chunk.start == chunk.request.num_computed_tokens
        chunk.request.num_computed_tokens = chunk.start + chunk.num_tokens
        if chunk.is_last:
            sampled.append(chunk.request)
    for request in sampled:
        request.output_token_ids.append(7)
        request.num_computed_tokens = request.num_tokens - 1
        if len(request.output_token_ids) >= request.params.max_tokens:
            scheduler.finish(request, "length")


def step(scheduler) -> ScheduledBatch | None:
    batch = scheduler.schedule()
    if batch is not None:
        run(scheduler, batch)
    return batch


def run_to_completion(scheduler, max_steps=10_000) -> list[ScheduledBatch]:
    batches = []
    while scheduler.has_unfinished():
        batch = step(scheduler)
        assert batch is not None, "requests left but nothing scheduled: a deadlock"
        batches.append(batch)
        assert len(batches) < max_steps
    return batches


def chunk_spans(batches, request) -> list[tuple[int, int]]:
    return [(c.start, c.num_tokens) for b in batches for c in b.prefill_chunks if c.request is request]


# ---------------------------------------------------------------------------------------------- corun


def test_make_scheduler_picks_the_mode():
    assert isinstance(make("fixed_shape"), FixedShapeScheduler)
    assert isinstance(make("mixed"), MixedScheduler)


def test_nothing_to_do_schedules_nothing():
    assert make().schedule() is None


def test_one_prefill_chunk_per_batch_never_mixed_with_decodes():
    scheduler = make(max_num_seqs=3, prefill_chunk_size=8)
    requests = [make_request(f"r{i}", n, max_tokens=m) for i, (n, m) in
                enumerate([(3, 5), (20, 3), (8, 1), (17, 6), (1, 2), (9, 4)])]
    for r in requests:
        scheduler.add(r)
    batches = run_to_completion(scheduler)
    for batch in batches:
        if batch.prefill_chunks:
            assert len(batch.prefill_chunks) == 1 and not batch.decode_requests
            assert 0 < batch.prefill_chunks[0].num_tokens <= 8
        else:
            assert 0 < len(batch.decode_requests) <= 3
    assert all(r.status == RequestStatus.FINISHED and len(r.output_token_ids) == r.params.max_tokens
               for r in requests)
    # every prompt token prefilled exactly once, in order
    for r in requests:
        spans = chunk_spans(batches, r)
        assert sum(n for _, n in spans) == r.num_prompt_tokens
        assert [s for s, _ in spans] == sorted(s for s, _ in spans)
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_usable_blocks


@pytest.mark.parametrize("num_prompt_tokens, chunk, expected", [
    (1, 8, [(0, 1)]),
    (8, 8, [(0, 8)]),
    (9, 8, [(0, 8), (8, 1)]),
    (30, 8, [(0, 8), (8, 8), (16, 8), (24, 6)]),
    (130, 32, [(0, 32), (32, 32), (64, 32), (96, 32), (128, 2)]),
])
def test_chunk_boundaries_are_fixed_multiples_of_the_chunk_size(num_prompt_tokens, chunk, expected):
    scheduler = make(prefill_chunk_size=chunk, max_model_len=512)
    request = make_request("r", num_prompt_tokens, max_tokens=2)
    scheduler.add(request)
    assert chunk_spans(run_to_completion(scheduler), request) == expected


def test_chunk_boundaries_do_not_depend_on_co_runners():
    """The same prompt, alone vs admitted behind others that are decoding: the same chunks."""
    alone = make(prefill_chunk_size=8)
    target = make_request("t", 27, max_tokens=3)
    alone.add(target)
    expected = chunk_spans(run_to_completion(alone), target)

    busy = make(prefill_chunk_size=8, max_num_seqs=4)
    others = [make_request(f"o{i}", n, max_tokens=m) for i, (n, m) in enumerate([(5, 9), (13, 2), (3, 20)])]
    for r in others:
        busy.add(r)
    step(busy)
    step(busy)  # o0 prefilled and o1 half-way: boundaries of others are in flight
    target = make_request("t", 27, max_tokens=3)
    busy.add(target)
    assert chunk_spans(run_to_completion(busy), target) == expected == [(0, 8), (8, 8), (16, 8), (24, 3)]


def test_chunked_prefill_is_continued_before_any_new_admission():
    scheduler = make(prefill_chunk_size=8, max_num_seqs=4)
    long, short = make_request("long", 20), make_request("short", 2)
    scheduler.add(long)
    scheduler.add(short)
    seen = []
    for _ in range(3):
        batch = step(scheduler)
        (chunk,) = batch.prefill_chunks
        seen.append((chunk.request.request_id, chunk.start, chunk.num_tokens))
        if chunk.request is long and not chunk.is_last:
            assert list(scheduler.waiting) == [short]
            assert scheduler.running == [long]
    assert seen == [("long", 0, 8), ("long", 8, 8), ("long", 16, 4)]
    batch = step(scheduler)
    assert batch.prefill_chunks[0].request is short and batch.prefill_chunks[0].num_tokens == 2
    assert scheduler.running == [long, short]


def test_a_prefill_in_progress_is_found_even_behind_decoding_requests():
    scheduler = make(prefill_chunk_size=4, max_num_seqs=4)
    a, b, c = make_request("a", 3, 10), make_request("b", 10, 10), make_request("c", 2, 10)
    for r in (a, b, c):
        scheduler.add(r)
    step(scheduler)  # a prefilled
    batch = step(scheduler)  # b chunk 1
    assert batch.prefill_chunks[0].request is b and not batch.prefill_chunks[0].is_last
    batch = step(scheduler)  # b chunk 2, not c, and not a decode of a
    chunk = batch.prefill_chunks[0]
    assert chunk.request is b and (chunk.start, chunk.num_tokens) == (4, 4)
    batch = step(scheduler)
    assert batch.prefill_chunks[0].request is b and batch.prefill_chunks[0].is_last
    batch = step(scheduler)
    assert batch.prefill_chunks[0].request is c


def test_admission_stops_at_max_num_seqs():
    scheduler = make(max_num_seqs=2)
    requests = [make_request(f"r{i}", 3, max_tokens=5) for i in range(3)]
    for r in requests:
        scheduler.add(r)
    assert step(scheduler).prefill_chunks[0].request is requests[0]
    assert step(scheduler).prefill_chunks[0].request is requests[1]
    for _ in range(3):
        batch = step(scheduler)
        assert not batch.prefill_chunks
        assert batch.decode_requests == requests[:2]
        assert list(scheduler.waiting) == [requests[2]]
        assert requests[2].block_ids == [] and requests[2].status == RequestStatus.WAITING
    # r0 and r1 have 4 tokens now; the next decode finishes both, then r2 is admitted
    assert step(scheduler).decode_requests == requests[:2]
    assert scheduler.running == []
    batch = step(scheduler)
    assert batch.prefill_chunks[0].request is requests[2]


def test_admission_reserves_blocks_for_prompt_plus_max_tokens():
    scheduler = make(num_blocks=100)
    request = make_request("r", 10, max_tokens=7)  # 17 tokens -> 5 blocks of 4
    scheduler.add(request)
    assert scheduler.block_manager.num_free_blocks == 99
    scheduler.schedule()
    assert len(request.block_ids) == 5 and NULL_BLOCK not in request.block_ids
    assert scheduler.block_manager.num_free_blocks == 94
    assert request.status == RequestStatus.RUNNING


def test_head_of_line_blocking_and_admission_after_finish():
    # 10 usable blocks of 4 tokens
    scheduler = make(num_blocks=11, max_num_seqs=8)
    first = make_request("first", 20, max_tokens=4)  # 24 tokens = 6 blocks
    head = make_request("head", 16, max_tokens=4)  # 20 tokens = 5 blocks: does not fit next to first
    small = make_request("small", 2, max_tokens=2)  # 1 block: would fit, but must not pass the head
    for r in (first, head, small):
        scheduler.add(r)
    batches = [step(scheduler) for _ in range(3)]  # first: chunks 0-8, 8-16, 16-20
    assert all(b.prefill_chunks[0].request is first for b in batches)
    assert scheduler.block_manager.num_free_blocks == 4
    for _ in range(2):  # first decodes; nobody is admitted past the head
        batch = step(scheduler)
        assert batch.decode_requests == [first] and not batch.prefill_chunks
        assert list(scheduler.waiting) == [head, small]
        assert scheduler.block_manager.num_free_blocks == 4
    assert step(scheduler).decode_requests == [first]  # its 4th token: finished
    assert first.status == RequestStatus.FINISHED and first.block_ids == []
    assert scheduler.block_manager.num_free_blocks == 10
    batch = step(scheduler)
    assert batch.prefill_chunks[0].request is head
    assert len(head.block_ids) == 5 and list(scheduler.waiting) == [small]


def test_head_waits_for_blocks_then_is_admitted():
    scheduler = make(num_blocks=5, max_num_seqs=8)  # 4 usable blocks
    a = make_request("a", 8, max_tokens=4)  # 3 blocks
    b = make_request("b", 4, max_tokens=4)  # 2 blocks
    scheduler.add(a)
    scheduler.add(b)
    step(scheduler)
    assert scheduler.running == [a] and list(scheduler.waiting) == [b]
    free_before = scheduler.block_manager.num_free_blocks
    assert scheduler.admit_head() is None
    assert scheduler.block_manager.num_free_blocks == free_before == 1
    scheduler.finish(a, "stop")
    assert a.finish_reason == "stop" and scheduler.block_manager.num_free_blocks == 4
    assert step(scheduler).prefill_chunks[0].request is b


def test_decode_batch_is_every_running_request_in_running_order():
    scheduler = make(max_num_seqs=4)
    requests = [make_request(f"r{i}", 2 + i, max_tokens=3 + i) for i in range(4)]
    for r in requests:
        scheduler.add(r)
    for _ in range(4):
        step(scheduler)
    assert scheduler.running == requests and not any(r.is_prefilling for r in requests)
    batch = step(scheduler)
    assert batch.decode_requests == requests and batch.prefill_chunks == []
    batch = step(scheduler)  # r0 finishes (max_tokens 3)
    assert batch.decode_requests == requests
    assert scheduler.running == requests[1:]
    assert step(scheduler).decode_requests == requests[1:]


def test_finish_returns_the_blocks():
    scheduler = make(num_blocks=20)
    request = make_request("r", 9, max_tokens=3)
    scheduler.add(request)
    step(scheduler)
    blocks = list(request.block_ids)
    assert len(blocks) == 3
    scheduler.finish(request, "stop")
    assert request.block_ids == [] and request.status == RequestStatus.FINISHED
    assert scheduler.running == [] and not scheduler.has_unfinished()
    assert set(blocks) <= set(scheduler.block_manager.free_block_ids)
    assert scheduler.block_manager.num_free_blocks == 19


# ------------------------------------------------------------------------------------------ rejection


def test_reject_prompt_plus_max_tokens_over_max_model_len():
    scheduler = make(max_model_len=64)
    scheduler.add(make_request("fits", 60, max_tokens=4))  # exactly max_model_len is fine
    with pytest.raises(RequestRejected) as info:
        scheduler.add(make_request("too-long", 60, max_tokens=5))
    message = str(info.value)
    assert "too-long" in message and "60" in message and "5" in message and "65" in message and "64" in message
    assert [r.request_id for r in scheduler.waiting] == ["fits"]


def test_reject_more_blocks_than_the_cache_has():
    scheduler = make(num_blocks=4, max_model_len=256)  # 3 usable blocks = 12 tokens
    scheduler.add(make_request("fits", 10, max_tokens=2))
    with pytest.raises(RequestRejected) as info:
        scheduler.add(make_request("huge", 10, max_tokens=3))  # 13 tokens = 4 blocks
    message = str(info.value)
    assert "huge" in message and "4" in message and "3" in message
    assert [r.request_id for r in scheduler.waiting] == ["fits"]


def test_reject_empty_prompt():
    scheduler = make()
    with pytest.raises(RequestRejected, match="empty") as info:
        scheduler.add(make_request("nothing", 0))
    assert "nothing" in str(info.value)
    assert not scheduler.has_unfinished()


def test_request_rejected_is_a_value_error():
    assert issubclass(RequestRejected, ValueError)


# ---------------------------------------------------------------------------------------------- mixed


def test_standard_mixes_decodes_and_several_prompts_under_the_token_budget():
    scheduler = make("mixed", max_num_seqs=8, max_num_batched_tokens=20)
    a, b = make_request("a", 3, max_tokens=10), make_request("b", 4, max_tokens=10)
    scheduler.add(a)
    scheduler.add(b)
    batch = step(scheduler)  # both prompts in one batch
    assert [(c.request, c.start, c.num_tokens) for c in batch.prefill_chunks] == [(a, 0, 3), (b, 0, 4)]
    c, d, e = make_request("c", 5, 10), make_request("d", 8, 10), make_request("e", 10, 10)
    for r in (c, d, e):
        scheduler.add(r)
    batch = step(scheduler)
    assert batch.decode_requests == [a, b]
    assert [(x.request, x.start, x.num_tokens) for x in batch.prefill_chunks] == [(c, 0, 5), (d, 0, 8), (e, 0, 5)]
    assert len(batch.decode_requests) + sum(x.num_tokens for x in batch.prefill_chunks) == 20
    batch = step(scheduler)  # running decodes first, then the unfinished prefill continues
    assert batch.decode_requests == [a, b, c, d]
    assert [(x.request, x.start, x.num_tokens) for x in batch.prefill_chunks] == [(e, 5, 5)]


def test_standard_budget_limits_decodes_too():
    scheduler = make("mixed", max_num_seqs=8, max_num_batched_tokens=3)
    requests = [make_request(f"r{i}", 1, max_tokens=5) for i in range(5)]
    for r in requests:
        scheduler.add(r)
    batch = step(scheduler)
    assert [c.request for c in batch.prefill_chunks] == requests[:3]
    batch = step(scheduler)
    assert batch.decode_requests == requests[:3] and batch.prefill_chunks == []
    assert sum(len(b.decode_requests) + sum(c.num_tokens for c in b.prefill_chunks)
               for b in run_to_completion(scheduler)) > 0
    assert all(r.status == RequestStatus.FINISHED for r in requests)


def kinds(batches) -> str:
    """'P' for a prefill forward, 'D' for a decode step."""
    return "".join("P" if b.prefill_chunks else "D" for b in batches)


def test_corun_algorithm_1_prefills_everything_admissible_before_decoding():
    scheduler = make(max_num_seqs=8)
    for i in range(6):
        scheduler.add(make_request(f"r{i}", 8, max_tokens=3))
    assert kinds(run_to_completion(scheduler)).startswith("PPPPPPD")


def test_corun_prefill_token_budget_interleaves_decode_steps():
    scheduler = make(max_num_seqs=8, prefill_token_budget=16)
    for i in range(6):
        scheduler.add(make_request(f"r{i}", 8, max_tokens=10))
    batches = run_to_completion(scheduler)
    # NOTE: two 8-token prefills spend the budget; a decode step of the requests decoding by then follows
    assert kinds(batches).startswith("PPDPPDPPD")
    assert [len(b.decode_requests) for b in batches[:9] if b.decode_requests] == [2, 4, 6]


def test_corun_budget_decode_skips_a_request_mid_chunked_prefill():
    scheduler = make(max_num_seqs=8, prefill_token_budget=8)
    scheduler.add(make_request("short", 4, max_tokens=5))
    scheduler.add(make_request("long", 24, max_tokens=2))
    batches = [step(scheduler) for _ in range(4)]
    assert kinds(batches) == "PPDP"
    assert [r.request_id for r in batches[2].decode_requests] == ["short"]
    assert batches[3].prefill_chunks[0].start == 8


def test_corun_packed_prefill_fills_rows_with_whole_chunks_in_fifo_order():
    scheduler = make(max_num_seqs=8, prefill_pack_tokens=18, prefill_pack_seqs=3)
    for i, length in enumerate([5, 12, 6, 3, 2]):
        scheduler.add(make_request(f"r{i}", length, max_tokens=2))
    first = step(scheduler)
    # NOTE: r1's 12 tokens are cut at 8 (prefill_chunk_size), whatever the pack holds; r2's 6 would not fit
    assert [(c.request.request_id, c.start, c.num_tokens) for c in first.prefill_chunks] == [("r0", 0, 5),
                                                                                             ("r1", 0, 8)]
    second = step(scheduler)
    assert [(c.request.request_id, c.start, c.num_tokens) for c in second.prefill_chunks] == [
        ("r1", 8, 4), ("r2", 0, 6), ("r3", 0, 3)]
    assert all(b.prefill_chunks or b.decode_requests for b in run_to_completion(scheduler))


def test_corun_pack_holds_what_is_left_of_the_budget_while_requests_decode():
    """A large T must not stall decoding: with requests decoding, a pack holds at most the budget's remainder (a
    whole chunk at least); with none decoding it fills T."""
    scheduler = make(max_num_seqs=20, prefill_pack_tokens=64, prefill_pack_seqs=16, prefill_token_budget=20)
    for i in range(20):
        scheduler.add(make_request(f"r{i}", 6, max_tokens=8))
    batches = [step(scheduler) for _ in range(3)]
    assert kinds(batches) == "PDP"
    assert sum(c.num_tokens for c in batches[0].prefill_chunks) == 60  # NOTE: nobody decodes yet: up to T
    assert sum(c.num_tokens for c in batches[2].prefill_chunks) == 18  # NOTE: 3 prompts fit the budget's 20


@pytest.mark.parametrize("budget, second_pack", [(20, 18), (0, 60)])
def test_a_pack_that_carries_the_decode_step_holds_at_most_the_budget(budget, second_pack):
    """Riding the prefill forward, the decode step waits for the whole pack: the budget caps it (a running request
    waits at most a budget-sized forward for its next token); the inverse, budget 0 (Algorithm 1), fills T."""
    scheduler = make(max_num_seqs=20, prefill_pack_tokens=64, prefill_pack_seqs=16, prefill_token_budget=budget)
    scheduler.decode_rides_prefill = True
    for i in range(20):
        scheduler.add(make_request(f"r{i}", 6, max_tokens=8))
    first, second = step(scheduler), step(scheduler)
    assert sum(c.num_tokens for c in first.prefill_chunks) == 60 and not first.decode_requests  # NOTE: up to T
    assert len(second.decode_requests) == 10
    assert sum(c.num_tokens for c in second.prefill_chunks) == second_pack


def test_a_scheduler_refuses_a_config_not_resolved_on_its_device():
    with pytest.raises(ValueError, match="resolved"):
        make_scheduler(SchedulerConfig(prefill_chunk_size=8), BlockManager(100, BLOCK_SIZE))
