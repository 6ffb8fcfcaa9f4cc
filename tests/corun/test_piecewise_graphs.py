"""Mixed-step modes' piecewise mixed steps (corun/piecewise_graphs.py), their bookkeeping on CPU: the pieces run
eagerly through the same fixed buffers the CUDA graphs replay from (capture is CUDA-only: tests/corun/
test_prefill_graphs.py's GPU tier and benchmarks/h200_runs.sh run it there).

- at a size equal to the step's token count, the pieces compute bitwise what the plain forward computes (the
  same ops in the same order: the split moves no arithmetic), torch ops and the fused Triton kernels alike;
- padded to a larger size, the real rows stay within rounding of the plain forward (row-count-dependent GEMMs
  on CPU), and the padding rows write only the null block;
- a mixed engine stepping through the pieces generates what the eager one does.
"""

import pytest
import torch

from corun.block_manager import NULL_BLOCK, BlockManager
from corun.engine import LLMEngine
from corun.model_runner import ModelRunner
from corun.piecewise_graphs import PiecewiseForward, piecewise_sizes
from corun.request import Request
from corun.scheduler import PrefillChunk
from wire.config import CacheConfig, EngineConfig, SchedulerConfig
from wire.sampling_params import SamplingParams

BLOCK_SIZE = 16


def engine_config(model_dir: str) -> EngineConfig:
    return EngineConfig(model=model_dir, num_threads=1, scheduler=SchedulerConfig(
        mode="mixed", max_num_seqs=8, max_model_len=256, max_num_batched_tokens=96),
        cache=CacheConfig(block_size=BLOCK_SIZE, num_blocks=200))


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    return ModelRunner(engine_config(tiny_model_dir))


def mixed_step(runner):
    """Two decoding requests (KV filled by their prefill) and two prompt chunks, one of them a later chunk."""
    blocks = BlockManager(runner.kv_cache.num_blocks, BLOCK_SIZE)
    params = SamplingParams(max_tokens=8)

    def request(name, prompt):
        r = Request(name, prompt, params, 0, frozenset())
        r.block_ids = blocks.allocate(r.max_num_tokens)
        return r

    decodes = [request(f"d{i}", list(range(10 + i, 40 + 3 * i))) for i in range(2)]
    for r in decodes:
        runner.forward(runner.mixed_inputs([], 0, [PrefillChunk(r, 0, r.num_prompt_tokens)]))
        r.num_computed_tokens = r.num_prompt_tokens
        r.output_token_ids.append(5)
    later = request("p1", list(range(200, 260)))
    runner.forward(runner.mixed_inputs([], 0, [PrefillChunk(later, 0, 20)]))
    chunks = [PrefillChunk(request("p0", list(range(100, 125))), 0, 25), PrefillChunk(later, 20, 21)]
    return runner.mixed_inputs(decodes, len(decodes), chunks)


def kv_snapshot(runner):
    return runner.kv_cache.data.clone()


def run_both(runner, inputs, sizes):
    """inputs: mixed_step's. -> (plain hidden, piecewise hidden, KV after plain, KV after piecewise), from the same
    starting KV."""
    before = kv_snapshot(runner)
    plain = runner.forward(inputs).clone()
    after_plain = kv_snapshot(runner)
    runner.kv_cache.data.copy_(before)
    pieces = PiecewiseForward(runner.model, runner.kv_cache.layers, sizes, torch.float32, runner.device,
                              capture=False)
    piecewise = pieces.forward(inputs.input_ids, inputs.positions, inputs.meta).clone()
    return plain, piecewise, after_plain, kv_snapshot(runner)


@pytest.mark.parametrize("fused", [False, True], ids=["torch-ops", "fused-triton"])
def test_pieces_at_the_exact_size_are_the_plain_forward_bitwise(runner, fused):
    # NOTE: the KV the step reads is prefilled by the torch ops: both forwards start from it, and only they need the
    # fused kernels (in Triton's interpreter on CPU, each forward through them costs seconds)
    inputs = mixed_step(runner)
    runner.model.use_fused_kernels(fused)
    try:
        plain, piecewise, kv_plain, kv_piecewise = run_both(runner, inputs, [len(inputs.input_ids)])
    finally:
        runner.model.use_fused_kernels(False)
    assert torch.equal(plain, piecewise)
    assert torch.equal(kv_plain, kv_piecewise)


def test_inverse_a_piece_out_of_order_changes_the_result(runner):
    """The comparison above can fail: pieces run with one layer's attention skipped differ."""
    inputs = mixed_step(runner)
    plain = runner.forward(inputs).clone()
    pieces = PiecewiseForward(runner.model, runner.kv_cache.layers, [len(inputs.input_ids)], torch.float32,
                              runner.device, capture=False)
    real_attend = runner.model.attend
    runner.model.attend = lambda i, q, *rest: torch.zeros_like(q) if i == 0 else real_attend(i, q, *rest)
    try:
        piecewise = pieces.forward(inputs.input_ids, inputs.positions, inputs.meta)
    finally:
        del runner.model.attend
    assert not torch.equal(plain, piecewise)


def test_padding_rows_write_only_the_null_block(runner):
    inputs = mixed_step(runner)
    padded_size = len(inputs.input_ids) + 19
    plain, piecewise, kv_plain, kv_piecewise = run_both(runner, inputs, [padded_size])
    torch.testing.assert_close(piecewise, plain, atol=1e-4, rtol=1e-4)
    real = [b for b in range(runner.kv_cache.num_blocks) if b != NULL_BLOCK]
    torch.testing.assert_close(kv_piecewise[real], kv_plain[real], atol=1e-4, rtol=1e-4)


def test_sizes_stop_at_the_token_budget():
    assert piecewise_sizes(2048)[-1] == 2048 and 16 in piecewise_sizes(2048)
    assert piecewise_sizes(100) == [16, 32, 64, 100]
    assert piecewise_sizes(8192)[-1] == 2048  # NOTE: larger steps run eagerly


def generate(engine: LLMEngine):
    """Six prompts of 11-66 tokens, greedy: -> (token ids per request, every logprob)."""
    prompts = [list(range(30 + 7 * i, 30 + 7 * i + 11 * (i + 1))) for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=2, ignore_eos=True)
    requests = [engine.add_request(f"r{i}", p, params) for i, p in enumerate(prompts)]
    while engine.has_unfinished():
        engine.step()
    return [r.output_token_ids for r in requests], [lp.logprob for r in requests for lp in r.output_logprobs]


def test_a_standard_engine_through_the_pieces_generates_what_the_eager_one_does(tiny_model_dir):
    eager = LLMEngine(engine_config(tiny_model_dir))
    through_pieces = LLMEngine(engine_config(tiny_model_dir))
    runner = through_pieces.runner
    runner.piecewise_forward = PiecewiseForward(runner.model, runner.kv_cache.layers, [32, 64, 96], torch.float32,
                                                runner.device, capture=False)
    tokens, logprobs = generate(eager)
    piece_tokens, piece_logprobs = generate(through_pieces)
    assert runner.num_piecewise_forwards > 0
    assert piece_tokens == tokens
    torch.testing.assert_close(piece_logprobs, logprobs, atol=1e-4, rtol=0)


def cuda_config(**scheduler) -> EngineConfig:
    return EngineConfig(model="random:qwen3-tiny", device="cuda", dtype="float32", scheduler=SchedulerConfig(
        mode="mixed", max_num_seqs=8, max_model_len=256, max_num_batched_tokens=96, **scheduler),
        cache=CacheConfig(block_size=BLOCK_SIZE, num_blocks=200))


@pytest.mark.gpu
def test_captured_pieces_at_the_exact_size_are_the_plain_forward_bitwise():
    runner = ModelRunner(cuda_config(piecewise_graphs=False))
    inputs = mixed_step(runner)
    before = kv_snapshot(runner)
    plain = runner.forward(inputs).clone()
    runner.kv_cache.data.copy_(before)
    pieces = PiecewiseForward(runner.model, runner.kv_cache.layers, [len(inputs.input_ids)], torch.float32,
                              runner.device, capture=True)
    assert len(pieces.graphs[len(inputs.input_ids)]) == len(runner.model.layers) + 1
    replayed = pieces.forward(inputs.input_ids, inputs.positions, inputs.meta).clone()
    assert pieces.num_replays == 1
    assert torch.equal(plain, replayed)


@pytest.mark.gpu
def test_a_standard_cuda_engine_runs_mixed_steps_through_its_graphs():
    graphed, eager = LLMEngine(cuda_config()), LLMEngine(cuda_config(piecewise_graphs=False))
    assert graphed.runner.prefill_path == "mixed-batch-piecewise-graphs" and eager.runner.piecewise_forward is None
    tokens, logprobs = generate(graphed)
    assert graphed.runner.piecewise_forward.num_replays > 0
    eager_tokens, eager_logprobs = generate(eager)
    assert tokens == eager_tokens
    torch.testing.assert_close(logprobs, eager_logprobs, atol=1e-3, rtol=0)
