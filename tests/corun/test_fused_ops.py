"""The fused Triton kernels of the CUDA path (corun/kernels/fused_ops.py) against the torch ops they replace.

- each kernel is close to its torch reference (float32: they differ only in reduction order and exp/rsqrt);
- a row's bits do not depend on how many rows share the launch;
- a tiny model on the fused path gives the torch path's logits and KV cache, and is bitwise batch-invariant.

On CPU hosts this runs through Triton's interpreter (tests/conftest.py) in float32: the interpreter rounds
float32 -> bfloat16 by truncation, so the bf16 rounding points and CUDA-graph capture are checked on a GPU only.
"""

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from corun.attention import AttentionMetadata, write_kv
from corun.model_runner import ModelRunner
from corun.models.decoder import RMSNorm
from corun.models.rope import apply_rope
from corun.request import Request
from corun.scheduler import PrefillChunk
from corun.step_inputs import build_step, build_window_decode
from wire.config import CacheConfig, EngineConfig, SchedulerConfig
from wire.sampling_params import SamplingParams

pytestmark = [pytest.mark.numerics,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")]
ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
gpu_only = pytest.mark.gpu
EPS = 1e-6
ROW_COUNTS = (1, 3, 8)
TOLERANCE = dict(atol=1e-6, rtol=1e-5)
BF16_TOLERANCE = dict(atol=1e-3, rtol=1.6e-2)  # about two bf16 ulps


def random(*shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def random_norm(size: int, seed: int) -> RMSNorm:
    norm = RMSNorm(size, EPS).to(DEVICE)
    norm.weight.data = 1 + random(size, seed=seed, scale=0.1)
    return norm.requires_grad_(False)


def qkv_case(num_tokens: int, head_dim: int, seed: int, num_heads: int = 4, num_kv_heads: int = 2):
    """q, k, v as the model has them (strided views of one qkv output), and cos/sin rows of random positions."""
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = random(num_tokens, q_size + 2 * kv_size, seed=seed).split([q_size, kv_size, kv_size], dim=-1)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    positions = torch.randint(0, 4096, (num_tokens,), generator=torch.Generator().manual_seed(seed)).float()
    angles = torch.outer(positions, inv_freq)
    angles = torch.cat((angles, angles), dim=-1).to(DEVICE)
    return (q.view(num_tokens, num_heads, head_dim), k.view(num_tokens, num_kv_heads, head_dim),
            v.view(num_tokens, num_kv_heads, head_dim), angles.cos(), angles.sin())


@pytest.mark.parametrize("num_rows", ROW_COUNTS)
def test_add_rms_norm_is_the_residual_add_then_rms_norm(num_rows):
    from corun.kernels.fused_ops import fused_add_rms_norm, rms_norm

    x, residual = random(num_rows, 96, seed=1), random(num_rows, 96, seed=2, scale=4.0)
    norm = random_norm(96, seed=3)
    normed, new_residual = fused_add_rms_norm(x, residual, norm.weight, EPS)
    assert torch.equal(new_residual, residual + x)  # one rounded add: the residual stream is bitwise torch's
    torch.testing.assert_close(normed, norm(residual + x), **TOLERANCE)
    torch.testing.assert_close(rms_norm(x, norm.weight, EPS), norm(x), **TOLERANCE)


@pytest.mark.parametrize("num_tokens", ROW_COUNTS)
@pytest.mark.parametrize("head_dim", [16, 24])  # 24: a half (12) that is not a power of two
@pytest.mark.parametrize("qk_norm", [True, False], ids=["qwen3", "llama"])
def test_qk_norm_rope_matches_norm_then_apply_rope(num_tokens, head_dim, qk_norm):
    from corun.kernels.fused_ops import qk_norm_rope

    q, k, _, cos, sin = qkv_case(num_tokens, head_dim, seed=4)
    q_norm, k_norm = random_norm(head_dim, seed=5), random_norm(head_dim, seed=6)
    if qk_norm:
        fused_q, fused_k = qk_norm_rope(q, k, q_norm.weight, k_norm.weight, cos, sin, EPS)
        expected_q, expected_k = apply_rope(q_norm(q), cos, sin), apply_rope(k_norm(k), cos, sin)
        torch.testing.assert_close(fused_q, expected_q, **TOLERANCE)
        torch.testing.assert_close(fused_k, expected_k, **TOLERANCE)
    else:
        fused_q, fused_k = qk_norm_rope(q, k, None, None, cos, sin, EPS)
        expected_q, expected_k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if ON_GPU:  # NOTE: measured on the H200: Triton's compiler contracts RoPE's multiply-adds (FMA)
            torch.testing.assert_close(fused_q, expected_q, **TOLERANCE)
            torch.testing.assert_close(fused_k, expected_k, **TOLERANCE)
        else:  # the interpreter rounds every op as torch does: bitwise
            assert torch.equal(fused_q, expected_q) and torch.equal(fused_k, expected_k)


def test_qk_norm_rope_write_kv_writes_the_slots_write_kv_writes():
    from corun.kernels.fused_ops import qk_norm_rope, qk_norm_rope_write_kv

    num_tokens, head_dim, block_size, num_blocks = 6, 16, 4, 5
    q, k, v, cos, sin = qkv_case(num_tokens, head_dim, seed=7)
    q_norm, k_norm = random_norm(head_dim, seed=8), random_norm(head_dim, seed=9)
    slots = torch.randperm(num_blocks * block_size, generator=torch.Generator().manual_seed(10))[:num_tokens]
    meta = AttentionMetadata((slots // block_size).to(DEVICE), (slots % block_size).to(DEVICE))
    # PagedKVCache's layout [blocks, layers, k/v, block_size, kv_heads, head_dim]; layer 1's strided views
    fused_cache, torch_cache = (torch.zeros(num_blocks, 2, 2, block_size, 2, head_dim, device=DEVICE)
                                for _ in range(2))
    fused_q, fused_k = qk_norm_rope_write_kv(q, k, v, q_norm.weight, k_norm.weight, cos, sin, EPS,
                                             fused_cache[:, 1, 0], fused_cache[:, 1, 1], meta.slot_blocks,
                                             meta.slot_offsets)
    expected_q, expected_k = qk_norm_rope(q, k, q_norm.weight, k_norm.weight, cos, sin, EPS)
    assert torch.equal(fused_q, expected_q) and torch.equal(fused_k, expected_k)
    write_kv(torch_cache[:, 1, 0], torch_cache[:, 1, 1], apply_rope(k_norm(k), cos, sin), v, meta)
    assert torch.equal(fused_cache[:, :, 1], torch_cache[:, :, 1])  # v: copied, and nothing else touched
    torch.testing.assert_close(fused_cache, torch_cache, **TOLERANCE)


@pytest.mark.parametrize("num_rows", ROW_COUNTS)
@pytest.mark.parametrize("size", [40, 1500])  # 1500: more than one column block per row
def test_silu_and_mul_matches_torch(num_rows, size):
    from corun.kernels.fused_ops import silu_and_mul

    gate_up = random(num_rows, 2 * size, seed=11, scale=3.0)
    gate, up = gate_up.split(size, dim=-1)
    torch.testing.assert_close(silu_and_mul(gate_up), F.silu(gate) * up, **TOLERANCE)


def test_a_rows_bits_do_not_depend_on_the_other_rows():
    """Row i alone (a 1-row launch) is bitwise row i of a 7-row launch, for every fused kernel."""
    from corun.kernels.fused_ops import fused_add_rms_norm, qk_norm_rope, rms_norm, silu_and_mul

    x, residual, gate_up = random(7, 96, seed=12), random(7, 96, seed=13), random(7, 80, seed=14)
    q, k, _, cos, sin = qkv_case(7, 16, seed=15)
    weight, q_weight, k_weight = (random_norm(size, seed).weight for size, seed in ((96, 16), (16, 17), (16, 18)))
    kernels = {
        "add_rms_norm": lambda rows: torch.cat(fused_add_rms_norm(x[rows], residual[rows], weight, EPS), -1),
        "rms_norm": lambda rows: rms_norm(x[rows], weight, EPS),
        "qk_norm_rope": lambda rows: torch.cat(
            qk_norm_rope(q[rows], k[rows], q_weight, k_weight, cos[rows], sin[rows], EPS), 1),
        "silu_and_mul": lambda rows: silu_and_mul(gate_up[rows]),
    }
    for name, kernel in kernels.items():
        batched = kernel(slice(0, 7))
        for i in range(7):
            assert torch.equal(kernel(slice(i, i + 1))[0], batched[i]), f"{name}: row {i}"


def make_runner(model_dir: str, fused: bool | None, use_cuda_graph: bool = False) -> ModelRunner:
    """fused: force the fused path on or off (as tests force batched_decode_rows); None: the runner's choice."""
    runner = ModelRunner(EngineConfig(model=model_dir, device=DEVICE, dtype="float32", use_cuda_graph=use_cuda_graph,
                                      scheduler=SchedulerConfig(max_num_seqs=4, max_model_len=128),
                                      cache=CacheConfig(num_blocks=40)))
    assert (runner.model.fused_ops is not None) == runner.on_cuda  # the runner turns them on for CUDA only
    if fused is not None:
        runner.model.use_fused_kernels(fused)
    return runner


def new_request(request_id: str, prompt: list[int], first_block: int) -> Request:
    request = Request(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=8), 0, frozenset())
    request.block_ids = list(range(first_block, first_block + 8))
    return request


def test_fused_model_matches_the_torch_path(tiny_model_dir):
    """Prefill, then decode steps through the fixed-window step: the same logits and the same KV cache."""
    runners = [make_runner(tiny_model_dir, fused=False), make_runner(tiny_model_dir, fused=True)]
    prompt = torch.randint(0, 2048, (37,), generator=torch.Generator().manual_seed(19)).tolist()
    request = new_request("r", prompt, first_block=1)
    chunk = [PrefillChunk(request, 0, len(prompt))]
    torch_logits, fused_logits = (r.model.compute_logits(r.forward(build_step([], 0, chunk, r.block_size, DEVICE)))
                                  for r in runners)
    assert torch_logits.abs().max() > 1.0  # a meaningful comparison, not two near-zero tensors
    torch.testing.assert_close(fused_logits, torch_logits, atol=1e-4, rtol=1e-4)
    request.num_computed_tokens = len(prompt)
    for _ in range(3):
        request.output_token_ids.append(int(torch_logits[-1].argmax()))
        torch_logits, fused_logits = (r.window_decode_logits(build_window_decode(
            [request], r.max_num_seqs, r.window_blocks, r.block_size).to(DEVICE)) for r in runners)
        torch.testing.assert_close(fused_logits, torch_logits, atol=1e-4, rtol=1e-4)
        request.num_computed_tokens += 1
    torch.testing.assert_close(runners[1].kv_cache.data, runners[0].kv_cache.data, atol=1e-5, rtol=1e-5)


def row_by_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear one row at a time: batch-invariant by construction (the Triton matmul of batch_invariant mode is
    too slow in the interpreter), so the model test below exercises the fused kernels' invariance alone."""
    return torch.cat([F.linear(row[None], weight, bias) for row in x.reshape(-1, x.shape[-1])]).view(
        *x.shape[:-1], weight.shape[0])


def test_fused_model_is_batch_invariant(tiny_model_dir):
    """A request's decode logits alone (a 1-row step) are bitwise its row of a 3- or 4-row step, wherever it sits
    (CPU attention is per request; the GEMMs go row by row)."""
    runner = make_runner(tiny_model_dir, fused=True)
    runner.model.use_batch_invariant_kernels(row_by_row_linear, rms_norm=None)
    prompts = [(5, 20), (3, 21), (9, 22), (2, 23)]  # NOTE: short: every prompt token costs interpreter time
    requests = [new_request(str(i), torch.randint(0, 2048, (length,), generator=torch.Generator().manual_seed(seed))
                            .tolist(), first_block=1 + 8 * i) for i, (length, seed) in enumerate(prompts)]
    for request in requests:
        sampled = runner.run_prefill([PrefillChunk(request, 0, request.num_prompt_tokens)])
        request.output_token_ids.append(sampled[0].token_id)

    def decode_logits(rows: list[Request]) -> torch.Tensor:
        return runner.model.compute_logits(runner.forward(runner.mixed_inputs(rows, len(rows), [])))

    a, b, c, d = requests
    alone = decode_logits([a])[0]
    assert torch.equal(decode_logits([b, a, c])[1], alone)
    assert torch.equal(decode_logits([c, b, d, a])[3], alone)


@gpu_only
def test_fused_decode_step_replays_as_a_cuda_graph(tiny_model_dir):
    """On CUDA the runner turns the fused path on and captures the N-row step: replay equals an eager step."""
    runner = make_runner(tiny_model_dir, fused=None, use_cuda_graph=True)
    assert runner.decode_graph is not None
    requests = [new_request(str(i), list(range(3 + i, 20 + 2 * i)), first_block=1 + 8 * i) for i in range(3)]
    for request in requests:
        request.output_token_ids.append(runner.run_prefill([PrefillChunk(request, 0, request.num_prompt_tokens)])[0]
                                        .token_id)
    replayed = runner.decode_logits(requests, runner.max_num_seqs).clone()
    inputs = build_window_decode(requests, runner.max_num_seqs, runner.window_blocks, runner.block_size).to(DEVICE)
    assert torch.equal(replayed, runner.window_decode_logits(inputs, runner.kv_splits(runner.max_num_seqs),
                                                                runner.kv_split_tokens))


@gpu_only
def test_bf16_rounds_where_torch_rounds():
    """The residual add is bitwise torch's in bfloat16; RoPE, the norms and silu within an ulp or so."""
    from corun.kernels.fused_ops import fused_add_rms_norm, qk_norm_rope, silu_and_mul

    bf16 = torch.bfloat16
    x, residual = random(64, 4096, seed=24).to(bf16), random(64, 4096, seed=25, scale=8.0).to(bf16)
    norm = random_norm(4096, seed=26).to(bf16)
    normed, new_residual = fused_add_rms_norm(x, residual, norm.weight, EPS)
    assert torch.equal(new_residual, residual + x)
    torch.testing.assert_close(normed, norm(residual + x), **BF16_TOLERANCE)
    q, k, _, cos, sin = (t.to(bf16) for t in qkv_case(64, 128, seed=27, num_heads=32, num_kv_heads=8))
    # NOTE: RoPE's two products round separately and their difference may cancel, so an ulp of difference
    # (FMA contraction on the H200: 0.2% of elements, at most 0.0039 there) is large next to a tiny result
    rope_tolerance = dict(atol=3e-2, rtol=2e-2)
    for fused, expected in zip(qk_norm_rope(q, k, None, None, cos, sin, EPS),
                               (apply_rope(q, cos, sin), apply_rope(k, cos, sin)), strict=True):
        torch.testing.assert_close(fused, expected, **rope_tolerance)
    q_norm, k_norm = random_norm(128, seed=28).to(bf16), random_norm(128, seed=29).to(bf16)
    fused_q, fused_k = qk_norm_rope(q, k, q_norm.weight, k_norm.weight, cos, sin, EPS)
    torch.testing.assert_close(fused_q, apply_rope(q_norm(q), cos, sin), **rope_tolerance)
    torch.testing.assert_close(fused_k, apply_rope(k_norm(k), cos, sin), **rope_tolerance)
    gate_up = random(64, 2 * 3072, seed=30, scale=3.0).to(bf16)
    gate, up = gate_up.split(3072, dim=-1)
    torch.testing.assert_close(silu_and_mul(gate_up), F.silu(gate) * up, **BF16_TOLERANCE)
