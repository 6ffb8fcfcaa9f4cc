"""fixed_shape's padded prefill through CUDA graphs (GPU only): replays give every prompt the same bits alone and
batched, and the values of the eager path. The inverse (mixed mode differs) is in benchmarks/gpu_determinism.py
and tests/corun/test_padded_prefill.py."""

import dataclasses

import pytest
import torch

from corun import LLM, SamplingParams
from tests.corun.test_determinism import completions, first_difference
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

pytestmark = pytest.mark.gpu  # NOTE: CUDA graphs need a GPU
PARAMS = SamplingParams(temperature=0.6, seed=42, max_tokens=12, logprobs=5, ignore_eos=True)
OPTIONS = {"buckets": dict(prefill_buckets=(16, 32, 64, 128)), "packed": dict(prefill_pack_tokens=256,
                                                                             prefill_pack_seqs=8)}


def config(dtype: str, use_cuda_graph: bool, **options) -> EngineConfig:
    return EngineConfig(model="random:qwen3-tiny", dtype=dtype, device="cuda", use_cuda_graph=use_cuda_graph,
                        scheduler=SchedulerConfig(max_num_seqs=16, max_model_len=512, prefill_chunk_size=64,
                                                  **options), cache=CacheConfig(num_blocks=2048))


def prompts(num: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    lengths = [1, 2, 3, 15, 16, 17, 63, 64, 65, 130, 200, 300][:num]  # NOTE: across buckets and chunk cuts
    return [torch.randint(0, 2000, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant", OPTIONS)
def test_graph_prefill_is_batch_invariant_and_matches_eager(dtype, variant):
    llm = LLM.from_config(config(dtype, True, **OPTIONS[variant]))
    runner = llm.engine.runner
    assert runner.prefill_graph is not None and runner.prefill_path.endswith("-graph")
    batch = prompts(12)
    alone = [completions(llm.generate([p], PARAMS))[0] for p in batch]
    together = completions(llm.generate(batch, PARAMS))
    assert first_difference(alone, together) is None
    assert runner.prefill_graph.num_replays > 0
    eager = completions(LLM.from_config(dataclasses.replace(llm.config, use_cuda_graph=False)).generate(batch, PARAMS))
    first_steps = [(ids[0], lps[0].logprob) for ids, lps in together]
    eager_first = [(ids[0], lps[0].logprob) for ids, lps in eager]
    assert [t for t, _ in first_steps] == [t for t, _ in eager_first]
    torch.testing.assert_close([lp for _, lp in first_steps], [lp for _, lp in eager_first], atol=1e-2, rtol=1e-2)
