"""The vLLM engine under CoRun's rules, colocated: bitwise the same outputs (prompt logprobs included) alone, in a
batch and as a needle in a running batch; isolated prefill chunks and N-row decode steps; admission only when the
whole sequence fits, and no preemption. vLLM's default scheduling on the same long prompts (2 threads) is not
bitwise the same (the inverse check)."""

from __future__ import annotations

import json
import random
import subprocess
from collections import Counter

import pytest

from corun import LLM, SamplingParams
from tests.vllm_backend.conftest import REPO, VLLM_PYTHON, requires_vllm

pytestmark = [pytest.mark.slow, requires_vllm]

MAX_NUM_SEQS = 8


def requests(rng: random.Random, lengths: list[int], vocab: int = 2048) -> list[dict]:
    specs = []
    for i, length in enumerate(lengths):
        params = {"temperature": 0.7, "seed": 1000 + i, "max_tokens": 12, "logprobs": 3, "ignore_eos": True}
        if i % 3 == 1:
            params.update(top_p=0.9, top_k=50, presence_penalty=0.5, repetition_penalty=1.2)
        if i % 3 == 2:
            params.update(prompt_logprobs=2)
        if i == 3:  # NOTE: issue 24's token controls, through vLLM's logits processor
            params.update(allowed_token_ids=list(range(0, vocab, 3)), bad_words_token_ids=[[6, 9], [12]])
        specs.append({"prompt": [rng.randrange(vocab) for _ in range(length)], "params": params})
    return specs


PROMPT_LENGTHS, BACKGROUND_LENGTHS, CHUNK = [430, 12, 290, 590, 77, 350], [500, 40, 270, 9, 600, 180, 333], 128


def run_engine(tiny_model_dir, mode: str, threads: int) -> dict:
    rng = random.Random(5)
    specs = requests(rng, PROMPT_LENGTHS), requests(rng, BACKGROUND_LENGTHS)
    if mode != "fixed_shape":  # NOTE: prompt logprobs need isolated prefill (the engine refuses them otherwise)
        for spec in (spec for group in specs for spec in group):
            spec["params"].pop("prompt_logprobs", None)
    job = {"model": tiny_model_dir, "mode": mode, "threads": threads, "max_num_seqs": MAX_NUM_SEQS, "chunk": CHUNK,
           # NOTE: long prompts: with 2 threads the kernels' work split depends on the rows they get
           "requests": specs[0], "background": specs[1], "needle_after_steps": 6}
    return run_script(job)


def run_script(job: dict) -> dict:
    result = subprocess.run([str(VLLM_PYTHON), "-m", "tests.vllm_backend.engine_script", json.dumps(job)],
                            capture_output=True, text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def corun_run(tiny_model_dir):
    return run_engine(tiny_model_dir, "fixed_shape", threads=2)


def test_alone_together_and_needle_are_bitwise_equal(corun_run):
    for alone, together in zip(corun_run["alone"], corun_run["together"], strict=True):
        assert alone == together
    assert corun_run["needle"] == corun_run["alone"][0]
    controlled = corun_run["alone"][3]["tokens"]  # NOTE: the token controls acted: allowed ids only, 12 banned
    assert all(t % 3 == 0 and t != 12 for t in controlled) and any(t % 3 for t in corun_run["alone"][0]["tokens"])
    with_prompt_logprobs = [r for r in corun_run["alone"] if r["prompt_logprobs"]]
    assert with_prompt_logprobs and all(len(r["prompt_logprobs"][1][2]) == 2 for r in with_prompt_logprobs)


def test_every_decode_step_computes_n_rows_and_every_prefill_one_prompts_chunk(corun_run):
    """Forwards of N rows (the decodes) and of one prompt's chunk; lm_head never below N rows."""
    rows = Counter({int(k): v for k, v in corun_run["forward_rows"]["forward"].items()})
    assert corun_run["max_decode_batch"] > 1
    # NOTE: prefill chunks are 128 tokens or a prompt's tail (none 8 long here): the rest are decodes
    assert rows.pop(MAX_NUM_SEQS) == corun_run["num_decode_steps"]
    # NOTE: each prompt was prefilled alone, together and (the needle's background, and the needle) once more
    prefilled = [*PROMPT_LENGTHS, *PROMPT_LENGTHS, *BACKGROUND_LENGTHS, PROMPT_LENGTHS[0]]
    chunks = Counter(min(CHUNK, length - start) for length in prefilled for start in range(0, length, CHUNK))
    assert rows == chunks
    # NOTE: vLLM computes logits after the forward on the sampled rows only: that GEMM is padded to N too
    logits_rows = {int(k) for k in corun_run["forward_rows"]["logits"]}
    assert MAX_NUM_SEQS in logits_rows and min(logits_rows) == MAX_NUM_SEQS


def admission_job(tiny_model_dir) -> dict:
    rng = random.Random(9)
    return {"model": tiny_model_dir, "mode": "fixed_shape", "threads": 1, "max_num_seqs": MAX_NUM_SEQS,
            "chunk": CHUNK, "max_model_len": 512, "kv_mib": 3, "requests": requests(rng, [150] * 6), "background": [],
            "needle_after_steps": 0}


def eos_job(tiny_model_dir, params: dict) -> dict:
    return {"model": tiny_model_dir, "mode": "fixed_shape", "threads": 1, "max_num_seqs": MAX_NUM_SEQS,
            "chunk": CHUNK, "together_only": True, "requests": [{"prompt": [5, 6, 7], "params": params}]}


EOS_PARAMS = {"temperature": 0.7, "seed": 1, "max_tokens": 10, "logit_bias": {"2047": 100.0}, "min_tokens": 3}
GENERATION_CONFIG_EOS_PARAMS = {**EOS_PARAMS, "logit_bias": {"2045": 100.0}}


@pytest.fixture(scope="module")
def one_thread_runs(tiny_model_dir) -> dict[str, dict]:
    """The one-thread fixed_shape jobs of the tests below, each on its own engine, in one engine_script process:
    vLLM's start-up there is most of each one's time."""
    jobs = {"admission": admission_job(tiny_model_dir), "eos": eos_job(tiny_model_dir, EOS_PARAMS),
            "generation_config_eos": eos_job(tiny_model_dir, GENERATION_CONFIG_EOS_PARAMS)}
    return dict(zip(jobs, run_script(list(jobs.values())), strict=True))


def test_admission_waits_for_the_whole_sequence_and_never_preempts(one_thread_runs):
    """A KV cache of 23 usable 32-token blocks: a 150-token prompt + 12 tokens reserves 6, so 3 run at once."""
    run = one_thread_runs["admission"]
    assert run["max_decode_batch"] == 3 and run["num_preempted"] == 0
    assert run["alone"] == run["together"]


def test_inverse_vllm_default_scheduling_differs(tiny_model_dir):
    """The same comparison fails under vLLM's own scheduling (mixed prefill chunks, batch-sized decode, split KV)."""
    mixed = run_engine(tiny_model_dir, "mixed", threads=2)
    differing = [i for i, (alone, together) in enumerate(zip(mixed["alone"], mixed["together"], strict=True))
                 if alone != together]
    assert differing, "vLLM's default scheduling gave the same bits alone and batched: the check cannot fail here"


def test_eos_stops_after_min_tokens(one_thread_runs):
    """vLLM without a tokenizer knows no EOS: the engine hands it the model's. A bias makes EOS certain, min_tokens
    holds it off for 3 tokens."""
    (output,) = one_thread_runs["eos"]["together"]
    assert output["tokens"][3:] == [2047] and 2047 not in output["tokens"][:3] and output["finish_reason"] == "stop"


def test_generation_configs_eos_stops_as_on_corun_engine(tiny_model_dir, one_thread_runs):
    """The tiny model's generation_config.json adds EOS 2045 to config.json's 2047: both engines stop on it."""
    (output,) = one_thread_runs["generation_config_eos"]["together"]
    assert output["tokens"][3:] == [2045] and output["finish_reason"] == "stop"
    corun = LLM(tiny_model_dir).generate([[5, 6, 7]], SamplingParams(**GENERATION_CONFIG_EOS_PARAMS))[0].outputs[0]
    assert corun.token_ids[3:] == [2045] and corun.finish_reason == "stop"
