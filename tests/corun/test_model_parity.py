"""Our DecoderLM against transformers' own Qwen3 and Llama on checkpoints that transformers itself saved."""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

from corun.model_runner import ModelRunner
from corun.request import Request
from corun.scheduler import PrefillChunk
from corun.step_inputs import build_step, build_window_decode
from wire.config import CacheConfig, EngineConfig, SchedulerConfig
from wire.sampling_params import SamplingParams

pytestmark = pytest.mark.numerics

SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6)
CONFIGS = {
    "qwen3-tied": lambda: Qwen3Config(**SMALL, head_dim=16, tie_word_embeddings=True, rope_theta=1e6),
    "llama3-untied": lambda: LlamaConfig(
        **SMALL, tie_word_embeddings=False, rope_theta=5e5,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64}),
}


def save_hf_checkpoint(name: str, path) -> torch.nn.Module:
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(CONFIGS[name](), dtype=torch.float32)
    with torch.no_grad():
        for pname, p in hf.named_parameters():  # NOTE: wider than HF's init, so logits are not ~0
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in pname else 0.15 * torch.randn_like(p))
    hf.save_pretrained(path)
    return hf.eval()


def make_runner(path, chunk: int = 512) -> ModelRunner:
    return ModelRunner(EngineConfig(model=str(path), scheduler=SchedulerConfig(
        max_num_seqs=4, max_model_len=256, prefill_chunk_size=chunk), cache=CacheConfig(num_blocks=64)))


def new_request(prompt, num_blocks=16):
    request = Request("r", list(prompt), SamplingParams(max_tokens=8), 0, frozenset())
    request.block_ids = list(range(1, 1 + num_blocks))
    return request


@pytest.mark.parametrize("fused", [False, True], ids=["torch", "fused"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_logits_match_transformers(name, fused, tmp_path):
    """Both implementations of the layer glue: torch ops, and the CUDA path's fused Triton kernels (forced on)."""
    if fused:
        pytest.importorskip("triton")
        if torch.cuda.is_available():
            pytest.skip("the fused kernels need CUDA tensors on a GPU host; test_fused_ops covers them there")
    hf = save_hf_checkpoint(name, tmp_path)
    runner = make_runner(tmp_path)
    if fused:
        runner.model.use_fused_kernels()  # NOTE: CPU: through Triton's interpreter (tests/conftest.py)
    prompt = torch.randint(0, 512, (57,), generator=torch.Generator().manual_seed(1))
    request = new_request(prompt.tolist())
    hidden = runner.forward(build_step([], 0, [PrefillChunk(request, 0, 57)], runner.block_size, "cpu"))
    ours = runner.model.compute_logits(hidden)
    with torch.no_grad():
        theirs = hf(prompt[None]).logits[0].float()
    assert theirs.abs().max() > 1.0  # a meaningful comparison, not two near-zero tensors
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_chunked_prefill_then_decode_match_transformers(name, tmp_path):
    hf = save_hf_checkpoint(name, tmp_path)
    runner = make_runner(tmp_path, chunk=16)
    tokens = torch.randint(0, 512, (45,), generator=torch.Generator().manual_seed(2)).tolist()
    request = new_request(tokens[:40])
    for start in range(0, 40, 16):
        chunk = PrefillChunk(request, start, min(16, 40 - start))
        runner.forward(build_step([], 0, [chunk], runner.block_size, "cpu"))
        request.num_computed_tokens = start + chunk.num_tokens
    with torch.no_grad():
        theirs = hf(torch.tensor(tokens)[None]).logits[0].float()
    for position in range(40, 45):  # feed the reference's next tokens one decode step at a time
        request.output_token_ids.append(tokens[position])
        # both decode attentions: per-request (CPU) and fixed-window (the CUDA graph's), at N rows
        per_request = runner.forward(build_step([request], runner.max_num_seqs, [], runner.block_size, "cpu"))
        window = build_window_decode([request], runner.max_num_seqs, runner.window_blocks, runner.block_size)
        torch.testing.assert_close(runner.model.compute_logits(per_request)[0], theirs[position],
                                   atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(runner.window_decode_logits(window)[0], theirs[position],
                                   atol=2e-4, rtol=1e-4)
