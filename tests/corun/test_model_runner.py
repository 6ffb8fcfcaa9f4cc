"""The model runner's fixed-shape decode step, below the scheduler and engine.

- a request's row of the N-row step is bitwise the same whichever row it sits in and whatever fills the others
  (both CPU implementations: per-request attention via `build_step`, fixed-window attention via
  `build_window_decode`);
- padding rows read and write only the null block;
- a request that moves between rows (co-runners finishing) generates what it generates when it stays put.
"""

import random

import pytest
import torch

from corun.block_manager import NULL_BLOCK, BlockManager
from corun.model_runner import ModelRunner
from corun.request import Request
from corun.scheduler import PrefillChunk
from corun.step_inputs import build_step, build_window_decode
from wire.config import CacheConfig, EngineConfig, SchedulerConfig
from wire.sampling_params import SamplingParams

pytestmark = pytest.mark.numerics

N = 8
BLOCK_SIZE = 16
TARGET_PARAMS = SamplingParams(temperature=0.8, seed=1234, max_tokens=24, logprobs=3)


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    config = EngineConfig(model=tiny_model_dir, scheduler=SchedulerConfig(max_num_seqs=N, max_model_len=256),
                          cache=CacheConfig(block_size=BLOCK_SIZE, num_blocks=160))
    return ModelRunner(config)


@pytest.fixture()
def blocks(runner):
    """A block manager over the runner's cache; every test gets all blocks but the null block."""
    return BlockManager(runner.kv_cache.num_blocks, BLOCK_SIZE)


def postprocess(sampled):
    """The engine's bookkeeping after a step (no stop conditions: these tests decide how long to run)."""
    for item in sampled:
        item.request.output_token_ids.append(item.token_id)
        if item.logprobs is not None:
            item.request.output_logprobs.append(item.logprobs)
        item.request.num_computed_tokens = item.request.num_tokens - 1


def admit(runner, blocks, request_id, prompt, params):
    """Reserve blocks for the whole sequence and prefill alone (token 1 sampled), as the engine does."""
    request = Request(request_id, list(prompt), params, params.seed, frozenset())
    request.block_ids = blocks.allocate(request.max_num_tokens)
    assert request.block_ids is not None
    postprocess(runner.run_prefill([PrefillChunk(request, 0, len(prompt))]))
    return request


def random_prompt(rng, vocab_size):
    return [rng.randrange(vocab_size) for _ in range(rng.randint(1, 180))]


def co_runners(runner, blocks, rng, num, tag):
    """Requests with random prompts, seeds and temperatures, prefilled and a few decode steps in."""
    vocab = runner.model.cfg.vocab_size
    requests = [admit(runner, blocks, f"{tag}{i}", random_prompt(rng, vocab),
                      SamplingParams(temperature=rng.choice([0.0, 1.0]), seed=rng.randrange(2**31), max_tokens=40))
                for i in range(num)]
    for _ in range(rng.randint(0, 3)):
        postprocess(runner.run_decode(requests))
    return requests


def step_logits_per_request(runner, requests):
    hidden = runner.forward(build_step(requests, N, [], BLOCK_SIZE, runner.device))
    return runner.model.compute_logits(hidden)


def step_logits_window(runner, requests):
    return runner.window_decode_logits(build_window_decode(requests, N, runner.window_blocks, BLOCK_SIZE))


PATHS = {"per_request": step_logits_per_request, "window": step_logits_window}


@pytest.mark.parametrize("path", PATHS)
def test_decode_row_is_bitwise_position_invariant(runner, blocks, path):
    step_logits = PATHS[path]
    rng = random.Random(3)
    vocab = runner.model.cfg.vocab_size
    target = admit(runner, blocks, "target", random_prompt(rng, vocab), TARGET_PARAMS)
    for _ in range(2):
        postprocess(runner.run_decode([target]))
    state = (list(target.output_token_ids), target.num_computed_tokens)

    results = {}
    # (row of the target, number of co-runners): alone, row 0 of a full step, row 5 with padding after it,
    # the last row; each arrangement with its own fresh random co-runners
    for row, num_others in [(0, 0), (0, 7), (5, 5), (5, 7), (7, 7)]:
        others = co_runners(runner, blocks, rng, num_others, tag=f"{row}-{num_others}-")
        rows = others[:row] + [target] + others[row:]
        logits = step_logits(runner, rows)
        assert logits.shape == (N, vocab)
        results[(row, num_others)] = logits[row].clone()
        assert (list(target.output_token_ids), target.num_computed_tokens) == state  # the step has no side effect
        for r in others:
            blocks.free(r.block_ids)

    reference = results[(0, 0)]
    for key, logits in results.items():
        assert torch.equal(logits, reference), f"{path}: target at row/co-runners {key} differs from alone: " \
            f"max |diff| {(logits - reference).abs().max().item()}"


@pytest.mark.mkl_default_mode
@pytest.mark.parametrize("path", PATHS)
def test_inverse_a_step_of_k_rows_differs_from_the_n_row_step(runner, blocks, path):
    """Why the step is padded to N: the same request in a step of only its own row (k = 1) gets other bits on
    this CPU (its float32 GEMMs tile 1, 2-3 and >= 4 rows differently), so the comparison above can fail."""
    rng = random.Random(4)
    target = admit(runner, blocks, "alone", random_prompt(rng, runner.model.cfg.vocab_size), TARGET_PARAMS)
    padded = PATHS[path](runner, [target])[0].clone()
    if path == "per_request":
        hidden = runner.forward(build_step([target], 1, [], BLOCK_SIZE, runner.device))
        unpadded = runner.model.compute_logits(hidden)[0]
    else:
        unpadded = runner.window_decode_logits(build_window_decode([target], 1, runner.window_blocks, BLOCK_SIZE))[0]
    assert not torch.equal(padded, unpadded)
    torch.testing.assert_close(padded, unpadded, rtol=1e-4, atol=1e-4)
    blocks.free(target.block_ids)


def test_per_request_and_window_paths_agree_closely(runner, blocks):
    """Two implementations of the same attention: close, not required to be bitwise equal."""
    rng = random.Random(5)
    requests = co_runners(runner, blocks, rng, 6, tag="p")
    a, b = step_logits_per_request(runner, requests), step_logits_window(runner, requests)
    torch.testing.assert_close(a[:6], b[:6], rtol=1e-4, atol=1e-4)
    assert torch.equal(a[:6].argmax(-1), b[:6].argmax(-1))


def changed_slots(before: torch.Tensor, after: torch.Tensor) -> set[tuple[int, int]]:
    """(block, offset) slots of [num_blocks, layers, 2, block_size, kv_heads, head_dim] whose KV changed."""
    changed = (before != after).any(dim=5).any(dim=4).any(dim=2).any(dim=1)  # [num_blocks, block_size]
    return {tuple(x) for x in changed.nonzero().tolist()}


def decode_slot(request):
    position = request.num_tokens - 1
    return request.block_ids[position // BLOCK_SIZE], position % BLOCK_SIZE


@pytest.mark.parametrize("path", ["run_decode", "window"])
def test_padding_rows_write_no_kv(runner, blocks, path):
    rng = random.Random(11)
    vocab = runner.model.cfg.vocab_size
    # NOTE: a count no verified decode size equals, so the step has padding rows on any host (a host whose
    # numerics verify the size 2 runs 2 requests without padding)
    num_real = next(count for count in range(1, N) if count not in runner.decode_sizes)
    real = [admit(runner, blocks, f"real{i}", random_prompt(rng, vocab), TARGET_PARAMS) for i in range(num_real)]
    # make the null block hold garbage, so that a padding write to it is visible as a change
    runner.kv_cache.data[NULL_BLOCK] = torch.randn_like(runner.kv_cache.data[NULL_BLOCK])
    expected_real = {decode_slot(r) for r in real}
    before = runner.kv_cache.data.clone()
    if path == "run_decode":
        runner.run_decode(real)
    else:
        step_logits_window(runner, real)
    changed = changed_slots(before, runner.kv_cache.data)
    assert expected_real <= changed, "the real rows must write their KV"
    outside = changed - expected_real - {(NULL_BLOCK, offset) for offset in range(BLOCK_SIZE)}
    assert not outside, f"slots written outside the real rows and the null block: {sorted(outside)}"
    assert any(block == NULL_BLOCK for block, _ in changed), "padding rows should write the null block"
    for r in real:
        blocks.free(r.block_ids)


def generate(runner, target, others_schedule, num_steps, step_fn):
    """Decode target for num_steps; others_schedule(step) gives the rows before and after the target."""
    for step in range(num_steps):
        before, after = others_schedule(step)
        rows = before + [target] + after
        sampled = step_fn(runner, rows)
        postprocess(sampled)
    return list(target.output_token_ids), list(target.output_logprobs)


def run_decode_window(runner, requests):
    logits = step_logits_window(runner, requests)
    return runner.sample(logits, requests)


STEP_FNS = {"run_decode": ModelRunner.run_decode, "window": run_decode_window}


@pytest.mark.parametrize("path", STEP_FNS)
def test_request_moving_between_rows_generates_the_same_tokens(runner, blocks, path):
    step_fn = STEP_FNS[path]
    rng = random.Random(21)
    prompt = random_prompt(rng, runner.model.cfg.vocab_size)
    num_steps = 12

    # stays put: alone in row 0 of every step
    alone = admit(runner, blocks, "alone", prompt, TARGET_PARAMS)
    reference = generate(runner, alone, lambda step: ([], []), num_steps, step_fn)
    alone_blocks = list(alone.block_ids)
    blocks.free(alone_blocks)

    # moves: starts in row 6 behind six co-runners (and one after it), which leave two at a time, so the target
    # moves 6 -> 4 -> 2 -> 0; its blocks are other block ids than the first run's
    others = co_runners(runner, blocks, rng, 7, tag="mover-")
    moved = admit(runner, blocks, "moved", prompt, TARGET_PARAMS)
    assert set(moved.block_ids).isdisjoint(alone_blocks)  # other KV blocks, too

    def schedule(step):
        num_before = max(6 - 2 * (step // 3), 0)
        return others[:num_before], others[6:] if step < 6 else []

    rows_seen = [len(schedule(s)[0]) for s in range(num_steps)]
    assert rows_seen == [6, 6, 6, 4, 4, 4, 2, 2, 2, 0, 0, 0]
    result = generate(runner, moved, schedule, num_steps, step_fn)
    for r in others + [moved]:
        blocks.free(r.block_ids)

    assert result[0] == reference[0]
    assert result[1] == reference[1]  # logprobs (sampled and top-3) bitwise equal at every step
    assert len(result[0]) == num_steps + 1
