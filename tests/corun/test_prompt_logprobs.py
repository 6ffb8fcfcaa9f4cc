"""Prompt logprobs (what lm-eval's loglikelihood tasks need) from the prompt's own isolated prefill: equal to
transformers' up to float error, bitwise the same alone, among other prompts and whatever the prefill path
(natural, bucketed); the generated tokens are those of the same request without them."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from corun import LLM, SamplingParams
from corun.engine import RequestRejected
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

pytestmark = pytest.mark.numerics

PROMPT = list(range(5, 150))  # NOTE: longer than the 64-token chunks: three chunks
OTHERS = [list(range(300, 300 + n)) for n in (7, 90, 33)]


def engine(model_dir: str, **scheduler) -> LLM:
    config = EngineConfig(model=model_dir, num_threads=1, cache=CacheConfig(num_blocks=256),
                          scheduler=SchedulerConfig(max_num_seqs=4, max_model_len=512, prefill_chunk_size=64,
                                                    **scheduler))
    return LLM.from_config(config)


def params(**fields) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.8, "seed": 3, "max_tokens": 4, "prompt_logprobs": 3, **fields})


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return engine(tiny_model_dir)


def test_prompt_logprobs_match_transformers(llm, tiny_model_dir):
    [out] = llm.generate([PROMPT], params())
    logprobs = out.prompt_logprobs
    assert len(logprobs) == len(PROMPT) and logprobs[0] is None
    assert [lp.token_id for lp in logprobs[1:]] == PROMPT[1:]
    assert all(len(lp.top) == 3 and lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1] for lp in logprobs[1:])
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        reference = torch.log_softmax(hf(torch.tensor([PROMPT])).logits[0].float(), dim=-1)
    expected = reference[torch.arange(len(PROMPT) - 1), torch.tensor(PROMPT[1:])]
    assert torch.allclose(torch.tensor([lp.logprob for lp in logprobs[1:]]), expected, atol=1e-4)


def test_prompt_logprobs_are_bitwise_the_same_alone_and_among_other_prompts(llm):
    [alone] = llm.generate([PROMPT], params())
    together = llm.generate([OTHERS[0], PROMPT, *OTHERS[1:]], [params(seed=9), params(), params(), params()])
    assert together[1].prompt_logprobs == alone.prompt_logprobs
    assert together[1].outputs[0].token_ids == alone.outputs[0].token_ids


def test_asking_for_them_changes_no_generated_token(llm):
    [plain] = llm.generate([PROMPT], params(prompt_logprobs=None, logprobs=2))
    [asked] = llm.generate([PROMPT], params(logprobs=2))
    assert plain.prompt_logprobs is None
    assert asked.outputs[0].token_ids == plain.outputs[0].token_ids
    assert asked.outputs[0].logprobs == plain.outputs[0].logprobs


def test_the_bucketed_path_gives_the_natural_path_s_tokens_and_close_logprobs(llm, tiny_model_dir):
    bucketed = engine(tiny_model_dir, prefill_buckets=(16, 32, 64))
    short = PROMPT[:20]  # NOTE: one chunk padded to the 32 bucket
    [padded] = bucketed.generate([short], params())
    [natural] = llm.generate([short], params())
    assert [lp.token_id for lp in padded.prompt_logprobs[1:]] == short[1:]
    assert torch.allclose(torch.tensor([lp.logprob for lp in padded.prompt_logprobs[1:]]),
                          torch.tensor([lp.logprob for lp in natural.prompt_logprobs[1:]]), atol=1e-4)
    [again] = bucketed.generate([short], params())
    assert again.prompt_logprobs == padded.prompt_logprobs  # NOTE: bitwise on its own path


@pytest.mark.mkl_default_mode  # NOTE: the engine's strict MKL mode keeps rows from the row count here
def test_the_rows_together_are_not_the_rows_one_by_one(llm):
    """Inverse: the comparison above sees float differences. lm_head over the chunk's rows at once (what the
    prefill does) and row by row give different bits on this CPU (GEMM kernels differ by row count)."""
    model = llm.engine.runner.model
    hidden = torch.randn(40, model.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    together = model.compute_logits(hidden)
    one_by_one = torch.cat([model.compute_logits(hidden[i:i + 1]) for i in range(len(hidden))])
    assert not torch.equal(together, one_by_one)


def test_prompt_logprobs_need_fixed_shape_mode_and_at_most_max_logprobs(tiny_model_dir, llm):
    with pytest.raises(RequestRejected, match="prompt_logprobs must be <= 20"):
        llm.engine.add_request("too-many", PROMPT, params(prompt_logprobs=21))
    mixed = engine(tiny_model_dir, mode="mixed")
    with pytest.raises(RequestRejected, match="prompt_logprobs needs mode fixed_shape"):
        mixed.engine.add_request("mixed", PROMPT, params())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_cuda_asking_for_them_changes_no_token_of_the_graphed_bucket_path(tiny_model_dir, dtype):
    """A prompt-logprob prefill runs its bucket eagerly (for every row's hidden state); the token it samples must
    be the captured graph's."""
    config = EngineConfig(model=tiny_model_dir, device="cuda", dtype=dtype, cache=CacheConfig(num_blocks=256),
                          scheduler=SchedulerConfig(max_num_seqs=4, max_model_len=512, prefill_chunk_size=64,
                                                    prefill_buckets=(16, 32, 64)))
    llm = LLM.from_config(config)
    assert llm.engine.runner.prefill_graph is not None
    prompts = [PROMPT[:n] for n in (5, 20, 64, 100)]
    plain = llm.generate(prompts, params(prompt_logprobs=None, logprobs=2))
    asked = llm.generate(prompts, params(logprobs=2))
    for a, b in zip(plain, asked, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids and a.outputs[0].logprobs == b.outputs[0].logprobs
    again = llm.generate(prompts, params(logprobs=2))
    assert [o.prompt_logprobs for o in again] == [o.prompt_logprobs for o in asked]
