"""fixed_shape's decode attention over fixed-size context ranges (SchedulerConfig.decode_kv_split_tokens), through
the engine on CUDA: a request's outputs are the same alone and among others (the ranges are cut by its context
alone, whichever program layout a step's size picks); the inverse, another cut (one range per context), changes
them. The kernels' own tests, on CPU too through Triton's interpreter: tests/corun/test_kernels.py."""

import pytest

from corun import LLM, SamplingParams
from tests.corun.test_determinism import completions, first_difference
from wire.config import DECODE_TILE_TOKENS

pytestmark = [pytest.mark.gpu, pytest.mark.numerics]

PARAMS = [SamplingParams(temperature=0.8, seed=i, max_tokens=120, logprobs=2, ignore_eos=True) for i in range(20)]
PROMPTS = [list(range(5 + i, 40 + 16 * i)) for i in range(20)]  # NOTE: contexts of one to four 128-token ranges


def make_llm(split_tokens: int) -> LLM:
    from wire.config import CacheConfig, EngineConfig, SchedulerConfig

    return LLM.from_config(EngineConfig(
        model="random:qwen3-tiny", dtype="bfloat16", device="cuda", cache=CacheConfig(num_blocks=2048),
        scheduler=SchedulerConfig(max_num_seqs=16, max_model_len=512, prefill_chunk_size=64,
                                  decode_kv_split_tokens=split_tokens)))


def test_ranged_decode_attention_keeps_outputs_the_same_alone_and_batched():
    llm = make_llm(DECODE_TILE_TOKENS)
    together = completions(llm.generate(PROMPTS, PARAMS))
    alone = [completions(llm.generate([p], [q]))[0] for p, q in zip(PROMPTS[:6], PARAMS[:6], strict=True)]
    assert first_difference(alone, together[:6]) is None
    del llm
    one_range = completions(make_llm(0).generate(PROMPTS, PARAMS))
    assert first_difference(one_range, together) is not None  # NOTE: the inverse: where the cuts fall matters
