"""A decode node that admits more than its KV cache holds at full length (CacheConfig.swap_space_bytes): blocks as
tokens need them, the newest samples paused to host memory when the cache runs out and copied back, bit for bit
(corun/kv_swap.py). In-process, on the fake KV transport, beside a real prefill node (tests/decode_node/
test_decode_server.py's Bench)."""

import dataclasses
import random
import types

import pytest
import torch

from corun.kv_cache import PagedKVCache
from corun.kv_swap import HostCopy, HostSwap
from tests.decode_node.test_decode_server import PARAMS, Bench, finished
from wire import protocol
from wire.config import MIB, CacheConfig

LONG = dataclasses.replace(PARAMS, max_tokens=100)
"""20-token prompts + 100 tokens: 8 blocks of 16 tokens each at full length."""
SMALL_CACHE = 17
"""16 usable blocks: two such sequences at full length."""
REQUESTS = {f"r{i}": dataclasses.replace(LONG, seed=100 + i) for i in range(4)}
FIRST_PROMPT_TOKEN = {**{f"r{i}": 30 + 7 * i for i in range(4)}, "pair": 90}
"""Each request's prompt: 20 tokens from this id on."""


def decode_all(bench: Bench, requests: dict) -> tuple[dict, int]:
    """Every request through the bench at once -> ({id: [(token ids, logprobs)...]}, most samples held at once)."""
    for request_id, params in requests.items():
        result, prompt = bench.prefilled(request_id, params=params, first_id=FIRST_PROMPT_TOKEN[request_id])
        bench.send_decode(result, prompt, params=params)
    outputs = {request_id: [] for request_id in requests}
    most_admitted = 0

    def all_finished(replies):
        nonlocal most_admitted
        most_admitted = max(most_admitted, bench.decode.num_seqs_admitted)
        return sum(bool(isinstance(r, protocol.TokenEvent) and r.finish_reason) for r in replies) == len(requests)

    for event in bench.until(all_finished, max_turns=2000):
        assert isinstance(event, protocol.TokenEvent), event
        outputs[event.request_id].append((event.token_ids, event.logprobs))
    return outputs, most_admitted


def alone(model_dir: str, requests: dict) -> dict:
    """Each request decoded by itself on a cache that holds it whole."""
    bench = Bench(model_dir)
    try:
        return {request_id: decode_all(bench, {request_id: params})[0][request_id]
                for request_id, params in requests.items()}
    finally:
        bench.close()


@pytest.fixture(scope="module")
def outputs_alone(tiny_model_dir):
    return alone(tiny_model_dir, REQUESTS)


def test_samples_beyond_the_cache_are_paused_to_host_memory_and_continue_bit_for_bit(tiny_model_dir, outputs_alone):
    """Four sequences that take twice the cache at full length run together; the newest are paused and copied back,
    and every token and logprob is what the request gives alone."""
    bench = Bench(tiny_model_dir, decode_cache=CacheConfig(num_blocks=SMALL_CACHE, swap_space_bytes=64 * MIB))
    try:
        outputs, most_admitted = decode_all(bench, REQUESTS)
        decode = bench.decode
        assert most_admitted == 4 and decode.num_preemptions > 0
        assert decode.swap.num_blocks_out > 0 and decode.swap.num_blocks_in > 0 and decode.swap.used_blocks == 0
        assert all(sum(len(ids) for ids, _ in outputs[r]) == LONG.max_tokens for r in REQUESTS)
        assert outputs == outputs_alone
        bench.step(3)
        bench.assert_idle()
    finally:
        bench.close()


def test_inverse_blocks_copied_back_out_of_order_change_the_outputs(tiny_model_dir, outputs_alone, monkeypatch):
    """The comparison above can fail: a paused sample whose blocks come back in the wrong places continues on other
    KV, and its tokens or logprobs differ from its outputs alone."""
    swap_in = HostSwap.swap_in
    monkeypatch.setattr(HostSwap, "swap_in", lambda self, swapped, block_ids: swap_in(self, swapped, block_ids[::-1]))
    bench = Bench(tiny_model_dir, decode_cache=CacheConfig(num_blocks=SMALL_CACHE, swap_space_bytes=64 * MIB))
    try:
        outputs, _ = decode_all(bench, REQUESTS)
        assert bench.decode.swap.num_blocks_in > 1
        assert outputs != outputs_alone
    finally:
        bench.close()


def test_samples_short_of_blocks_wait_a_step_and_exactly_they_do(tiny_model_dir, outputs_alone, monkeypatch):
    """With copies to host memory seen done late (as on CUDA; here on their 21st look), a sample may find no block
    free while a copy is under way and waits. ready_to_step's cheap check (corun/swap_preemption.may_need_blocks
    before the exact bound) gives exactly the samples whose blocks hold their next step's position, at every call,
    and the outputs stay bitwise what each request gives alone."""
    done = HostCopy.done

    def late(part):
        part.looks = getattr(part, "looks", 0) + 1
        return part.looks > 20 and done(part)
    monkeypatch.setattr(HostCopy, "done", late)
    bench = Bench(tiny_model_dir, decode_cache=CacheConfig(num_blocks=SMALL_CACHE, swap_space_bytes=64 * MIB))
    decode, waited = bench.decode, []
    ready = decode.ready_to_step

    def checked():
        stepping = ready()
        assert stepping == [s.request for s in decode.running
                            if len(s.request.block_ids) >= decode.blocks_for_next_step(s.request)]
        waited.append(len(decode.running) - len(stepping))
        return stepping
    decode.ready_to_step = checked
    try:
        outputs, _ = decode_all(bench, REQUESTS)
        assert outputs == outputs_alone
        assert max(waited) > 0  # NOTE: the comparison above met samples short of blocks
    finally:
        bench.close()


def test_without_swap_space_the_whole_sequences_fit_the_cache_and_nothing_is_paused(tiny_model_dir, outputs_alone):
    """swap_space_bytes 0: admission keeps the whole sequences within the cache (two of these at once), so no sample
    ever waits for blocks; the outputs are the same."""
    bench = Bench(tiny_model_dir, decode_cache=CacheConfig(num_blocks=SMALL_CACHE, swap_space_bytes=0))
    try:
        outputs, most_admitted = decode_all(bench, REQUESTS)
        assert most_admitted == 2 and bench.decode.num_preemptions == 0 and bench.decode.swap.num_blocks_out == 0
        assert outputs == outputs_alone
        bench.step(3)
        bench.assert_idle()
    finally:
        bench.close()


def test_an_abort_of_a_paused_sample_frees_its_host_copy_and_its_blocks(tiny_model_dir):
    bench = Bench(tiny_model_dir, decode_cache=CacheConfig(num_blocks=SMALL_CACHE, swap_space_bytes=64 * MIB))
    try:
        for request_id, params in REQUESTS.items():
            result, prompt = bench.prefilled(request_id, params=params, first_id=FIRST_PROMPT_TOKEN[request_id])
            bench.send_decode(result, prompt, params=params)
        bench.until(lambda replies: bench.decode.paused, max_turns=2000)
        paused = bench.decode.paused[0].job.request_id
        bench.to_decode.send(protocol.encode(protocol.Abort(paused)))
        bench.until(lambda replies: not bench.decode.holds(paused), max_turns=50)
        assert bench.decode.swap.used_blocks == sum(s.swapped.num_blocks for s in bench.decode.paused)
        bench.until(lambda replies: not (bench.decode.running or bench.decode.paused), max_turns=2000)
        assert bench.decode.swap.used_blocks == 0
        bench.step(3)
        bench.assert_idle()
    finally:
        bench.close()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_blocks_swapped_out_come_back_byte_for_byte_in_other_places(device):
    """HostSwap alone: blocks copied out (a kernel still queued when the copy is asked for, on CUDA), overwritten
    once the copy says they are free, then copied back into other block ids hold the same bytes; the swap space counts
    them while out; a swap that does not fit is refused."""
    arch = types.SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=8)  # NOTE: what the cache's shape takes
    cache = PagedKVCache(arch, CacheConfig(num_blocks=8), torch.float32, device)
    cache.data.normal_()
    expected = cache.data[[2, 3, 5]].clone()
    swap = HostSwap(cache, capacity_blocks=4)
    cache.data.mul_(1.0)  # NOTE: on CUDA, queued before the copy out: swap_out must wait for it
    swapped = swap.swap_out([2, 3, 5])
    assert swap.used_blocks == 3 and swap.room == 1 and swapped.parts[0].data.device.type == "cpu"
    with pytest.raises(ValueError, match="do not fit"):
        swap.swap_out([1, 4])
    freed = []
    while not freed:  # NOTE: at once on CPU; on CUDA once the copy's event fired
        freed = swap.copied_blocks()
    assert freed == [2, 3, 5] and swap.blocks_in_copy == 0 and swap.copied_blocks() == []
    cache.data[[2, 3, 5]] = 0
    swap.swap_in(swapped, [6, 7, 1])
    assert torch.equal(cache.data[[6, 7, 1]], expected) and swap.used_blocks == 0 and swap.num_blocks_in == 3


def test_the_swap_space_is_as_given_none_on_cpu_and_on_cuda_a_share_of_the_host_split_among_all_its_gpus(
        monkeypatch):
    """auto on CUDA: GPU_SWAP_SHARE_OF_HOST_MEMORY of the available memory over every GPU of the host, not over the
    one a node's CUDA_VISIBLE_DEVICES shows it (eight decode nodes would otherwise take twice the host's memory)."""
    from corun import kv_swap
    from wire.config import GPU_SWAP_SHARE_OF_HOST_MEMORY

    assert kv_swap.swap_space_bytes(CacheConfig(), "cpu") == 0
    assert kv_swap.swap_space_bytes(CacheConfig(swap_space_bytes=5 * MIB), "cuda") == 5 * MIB
    pages = {"SC_AVPHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(kv_swap.os, "sysconf", pages.__getitem__)
    monkeypatch.setattr(kv_swap.os.path, "isdir", lambda path: path == "/proc/driver/nvidia/gpus")
    monkeypatch.setattr(kv_swap.os, "listdir", lambda path: [f"0000:{i}" for i in range(8)])
    monkeypatch.setattr(kv_swap.torch.cuda, "device_count", lambda: 1)
    assert kv_swap.host_gpu_count() == 8
    assert kv_swap.swap_space_bytes(CacheConfig(), "cuda") == int(4096 * 1000 * GPU_SWAP_SHARE_OF_HOST_MEMORY) // 8


def test_samples_of_one_request_are_paused_and_resumed_as_requests_of_their_own(tiny_model_dir):
    """n = 2: each sample has its own blocks (the prompt's copied from the first's before they run), so pausing one
    leaves the other running; both give what they give alone (on a cache that holds them whole)."""
    requests = {"pair": dataclasses.replace(LONG, n=2, seed=7), **{r: REQUESTS[r] for r in ("r1", "r2")}}

    def outputs_by_sample(bench):
        outputs, _ = decode_all_samples(bench, requests)
        return outputs

    bench = Bench(tiny_model_dir, decode_cache=CacheConfig(num_blocks=SMALL_CACHE + 8, swap_space_bytes=64 * MIB))
    try:
        together = outputs_by_sample(bench)
        assert bench.decode.num_preemptions > 0
        bench.step(3)
        bench.assert_idle()
    finally:
        bench.close()
    bench = Bench(tiny_model_dir)
    try:
        apart = {}
        for request_id in requests:
            apart.update(decode_all_samples(bench, {request_id: requests[request_id]})[0])
    finally:
        bench.close()
    assert together == apart and len(together) == 4


def decode_all_samples(bench: Bench, requests: dict) -> tuple[dict, int]:
    """decode_all by (request id, sample index)."""
    for request_id, params in requests.items():
        result, prompt = bench.prefilled(request_id, params=params, first_id=FIRST_PROMPT_TOKEN[request_id])
        bench.send_decode(result, prompt, params=params)
    outputs: dict = {}
    num_samples = sum(params.n for params in requests.values())
    events = bench.until(lambda replies: sum(bool(isinstance(r, protocol.TokenEvent) and r.finish_reason)
                                             for r in replies) == num_samples, max_turns=3000)
    for event in events:
        assert isinstance(event, protocol.TokenEvent), event
        outputs.setdefault((event.request_id, event.index), []).append((event.token_ids, event.logprobs))
    return outputs, num_samples


def test_a_mixed_load_with_aborts_on_a_small_cache_loses_nothing_and_leaks_nothing(tiny_model_dir):
    """Requests of random lengths, some aborted mid-way, through a cache a quarter of their whole sequences: every
    request not aborted finishes with the outputs it gives alone; at the end every block, slot and host copy is back."""
    rng = random.Random(52)
    requests = {f"m{i}": dataclasses.replace(PARAMS, max_tokens=rng.randint(20, 100), seed=200 + i) for i in range(10)}
    prompts = {request_id: rng.randint(5, 28) for request_id in requests}
    aborted = {"m3", "m7"}
    bench = Bench(tiny_model_dir, decode_cache=CacheConfig(num_blocks=13, swap_space_bytes=64 * MIB))
    try:
        for request_id, params in requests.items():
            result, prompt = bench.prefilled(request_id, prompts[request_id], params, first_id=40 + prompts[request_id])
            bench.send_decode(result, prompt, params=params)
        events = []
        for turn in range(3000):
            events += bench.step()
            if turn == 40:
                for request_id in aborted:
                    bench.to_decode.send(protocol.encode(protocol.Abort(request_id)))
            assert bench.decode.num_seqs_admitted <= bench.decode.max_num_seqs
            # NOTE: a step's tokens may reach the socket a turn after the node is idle (a loaded host)
            ended = {e.request_id for e in events if isinstance(e, protocol.TokenEvent) and e.finish_reason}
            if not (bench.decode.waiting or bench.decode.claiming or bench.decode.transferring or bench.decode.running
                    or bench.decode.paused) and turn > 40 and set(requests) - aborted <= ended:
                break
        assert bench.decode.num_preemptions > 0
        bench.step(3)
        bench.assert_idle()
        assert bench.decode.swap.used_blocks == 0
    finally:
        bench.close()
    together = {}
    for event in events:
        assert isinstance(event, protocol.TokenEvent), event
        together.setdefault(event.request_id, []).append((event.token_ids, event.logprobs))
    bench = Bench(tiny_model_dir)
    try:
        for request_id in sorted(set(requests) - aborted):
            params = requests[request_id]
            result, prompt = bench.prefilled(request_id, prompts[request_id], params, first_id=40 + prompts[request_id])
            bench.send_decode(result, prompt, params=params)
            alone = [(e.token_ids, e.logprobs) for e in bench.until(finished)]
            assert together[request_id] == alone, request_id
    finally:
        bench.close()


def test_blocks_whose_copy_has_not_ended_are_given_to_nobody_and_outputs_hold(tiny_model_dir, outputs_alone,
                                                                              monkeypatch):
    """As on a GPU, where a copy out ends a while after it is asked for (here: a part reports done at its third
    look): until it ends its blocks are neither free nor any sample's, the samples that need blocks meanwhile wait a
    step or take the reserve, and every output is still the one given alone."""
    from corun.kv_swap import HostCopy

    looks: dict[int, int] = {}

    def done_at_third_look(part):
        looks[id(part)] = looks.get(id(part), 0) + 1
        return looks[id(part)] >= 3

    monkeypatch.setattr(HostCopy, "done", done_at_third_look)
    bench = Bench(tiny_model_dir, decode_cache=CacheConfig(num_blocks=SMALL_CACHE, swap_space_bytes=64 * MIB))
    decode = bench.decode
    step = bench.step
    seen_copying = []

    def checked_step(turns: int = 1):
        replies = step(turns)
        for part in decode.swap.copying:
            seen_copying.append(part)
            held = {b for s in [*decode.running, *decode.paused] for b in s.request.block_ids}
            assert not set(part.block_ids) & (set(decode.block_manager.free_block_ids) | held)
        return replies

    bench.step = checked_step
    try:
        outputs, most_admitted = decode_all(bench, REQUESTS)
        assert seen_copying and decode.num_preemptions > 0 and most_admitted == 4
        assert outputs == outputs_alone
        step(3)
        bench.assert_idle()
    finally:
        bench.close()


def test_the_newest_sample_short_of_a_block_in_a_full_cache_pauses_itself_and_takes_none(tiny_model_dir,
                                                                                        outputs_alone, monkeypatch):
    """The cache full (every free block taken) when the newest running sample needs one more: it is the one paused,
    all its blocks copied out in order, and it takes no block while paused; resumed, it gives its outputs alone."""
    bench = Bench(tiny_model_dir, decode_cache=CacheConfig(num_blocks=SMALL_CACHE, swap_space_bytes=64 * MIB))
    decode = bench.decode
    requests = {r: REQUESTS[r] for r in ("r0", "r1")}
    try:
        for request_id, params in requests.items():
            result, prompt = bench.prefilled(request_id, params=params, first_id=FIRST_PROMPT_TOKEN[request_id])
            bench.send_decode(result, prompt, params=params)
        replies = bench.until(lambda replies: len(decode.running) == 2)
        hog = decode.block_manager.allocate(decode.block_manager.num_free_blocks * decode.block_manager.block_size)
        newest = max(decode.running, key=lambda s: s.order)
        blocks_before = list(newest.request.block_ids)
        wanted = decode.blocks_for_next_step
        monkeypatch.setattr(decode, "blocks_for_next_step",
                            lambda request: wanted(request) + (request is newest.request))
        decode.grow_running()
        assert newest in decode.paused and newest.request.block_ids == []
        assert [b for part in newest.swapped.parts for b in part.block_ids] == blocks_before
        monkeypatch.undo()
        decode.block_manager.free(hog)
        events = bench.until(lambda replies: not (decode.running or decode.paused), max_turns=2000)
        outputs = {}
        for event in replies + events:
            assert isinstance(event, protocol.TokenEvent), event
            outputs.setdefault(event.request_id, []).append((event.token_ids, event.logprobs))
        assert outputs == {r: outputs_alone[r] for r in requests}
        bench.step(3)
        bench.assert_idle()
    finally:
        bench.close()


def test_copies_out_that_end_out_of_order_give_back_their_own_blocks(monkeypatch):
    """Two copies out in flight, the later one ending first (a GPU's events may fire so): its blocks alone come back,
    then the other's."""
    from corun.kv_swap import HostCopy

    cache = PagedKVCache(types.SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=8), CacheConfig(num_blocks=8),
                         torch.float32, "cpu")
    swap = HostSwap(cache, capacity_blocks=6)
    first, second = swap.swap_out([1, 2]).parts[0], swap.swap_out([5]).parts[0]
    ended = {id(second)}
    monkeypatch.setattr(HostCopy, "done", lambda part: id(part) in ended)
    assert swap.copied_blocks() == [5] and swap.copying == [first]
    ended.add(id(first))
    assert swap.copied_blocks() == [1, 2] and swap.copying == [] and swap.used_blocks == 3
