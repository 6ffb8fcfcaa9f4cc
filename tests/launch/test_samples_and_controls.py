"""n samples and the sampling controls through the cluster (HTTP, the openai client), against the colocated engine.

n: one prefill per prompt, its KV read once by one decode node and copied to every sample; sample i must be
bitwise the single request with seed sample_seed(seed, i), alone and under concurrent load.
"""

import concurrent.futures
import time
import urllib.request

import pytest

from corun import LLM, SamplingParams
from tests.conftest import varied_prompts
from tests.launch.cluster_client import CHUNK, MAX_MODEL_LEN, N, client, node_stats, start_cluster, wait_for_stats
from wire.seeding import sample_seed

PROMPTS = varied_prompts(4, seed=23, max_words=60)
SEED = 77
CONTROLS = {
    "penalties": {"presence_penalty": 1.2, "frequency_penalty": 0.6, "repetition_penalty": 1.4},
    "min_p and bias": {"min_p": 0.1, "logit_bias": {"9": 4.0, "31": -100.0}},
}


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    cluster = start_cluster(tiny_model_dir, 1, 2)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir, max_num_seqs=N, max_model_len=MAX_MODEL_LEN, prefill_chunk_size=CHUNK, num_threads=1)


def engine_params(seed: int, **controls) -> SamplingParams:
    bias = {int(t): b for t, b in controls.pop("logit_bias", {}).items()}
    return SamplingParams(temperature=0.9, seed=seed, max_tokens=10, logprobs=2, ignore_eos=True, logit_bias=bias,
                          **controls)


def engine_record(output) -> tuple[list[int], list[float]]:
    return list(output.token_ids), [lp.logprob for lp in output.logprobs]


def api_record(choice) -> tuple[list[int], list[float]]:
    return list(choice.model_extra["token_ids"]), list(choice.logprobs.token_logprobs)


def create(cluster, prompt, n=1, stream=False, **controls):
    return client(cluster).completions.create(
        model="corun-tiny", prompt=prompt, max_tokens=10, temperature=0.9, seed=SEED, logprobs=2, n=n,
        stream=stream, presence_penalty=controls.pop("presence_penalty", None),
        frequency_penalty=controls.pop("frequency_penalty", None), logit_bias=controls.pop("logit_bias", None),
        extra_body={"ignore_eos": True, "return_token_ids": True, **controls})


def streamed_choices(stream) -> dict[int, tuple[list[int], list[float]]]:
    choices: dict[int, tuple[list[int], list[float]]] = {}
    for chunk in stream:
        for choice in chunk.choices:
            ids, logprobs = choices.setdefault(choice.index, ([], []))
            ids += choice.model_extra.get("token_ids") or []
            logprobs += choice.logprobs.token_logprobs if choice.logprobs else []
    return choices


def test_each_of_n_samples_is_the_single_request_with_its_derived_seed(cluster, llm):
    response = create(cluster, PROMPTS[0], n=4)
    assert [c.index for c in response.choices] == [0, 1, 2, 3] and response.model_extra["seed"] == SEED
    for choice in response.choices:
        seed = sample_seed(SEED, choice.index)
        assert choice.model_extra["seed"] == seed
        assert api_record(choice) == engine_record(llm.generate(PROMPTS[0], engine_params(seed))[0].outputs[0])
    # NOTE: the inverse: the samples differ from each other, so equal records are not a given
    assert len({tuple(api_record(c)[0]) for c in response.choices}) > 1
    assert response.usage.prompt_tokens == len(llm.tokenizer.encode(PROMPTS[0]))
    assert response.usage.completion_tokens == 40


def test_n_with_several_prompts_orders_choices_prompt_major(cluster, llm):
    response = create(cluster, PROMPTS[:2], n=2)
    for choice in response.choices:
        prompt, sample = PROMPTS[choice.index // 2], choice.index % 2
        expected = llm.generate(prompt, engine_params(sample_seed(SEED, sample)))[0].outputs[0]
        assert api_record(choice) == engine_record(expected)


def test_n_samples_are_the_same_streamed_and_under_concurrent_load(cluster):
    alone = {c.index: api_record(c) for c in create(cluster, PROMPTS[1], n=3).choices}
    assert streamed_choices(create(cluster, PROMPTS[1], n=3, stream=True)) == alone
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(create, cluster, PROMPTS[i % 4], n=1 + i % 3) for i in range(12)]
        futures.append(pool.submit(create, cluster, PROMPTS[1], n=3))
        results = [f.result() for f in futures]
    assert {c.index: api_record(c) for c in results[-1].choices} == alone


def test_one_prefill_serves_every_sample(cluster):
    before = settled_prefill_count(cluster)
    create(cluster, PROMPTS[2], n=5)
    assert settled_prefill_count(cluster, changed_from=before) - before == 1
    # NOTE: the inverse: five single requests are five prefills
    for i in range(5):
        client(cluster).completions.create(model="corun-tiny", prompt=PROMPTS[2], max_tokens=2, seed=i)
    assert settled_prefill_count(cluster, changed_from=before + 1) - before == 6


def settled_prefill_count(cluster, changed_from: int | None = None) -> int:
    """The prefill nodes' num_prefills as /metrics shows it (from their latest Pongs), once it stops changing."""
    deadline = time.monotonic() + 20
    last = None
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{cluster.url}/metrics", timeout=10) as response:
            lines = response.read().decode().splitlines()
        count = int(sum(float(line.split()[-1]) for line in lines if line.startswith("corun_node_num_prefills_total")))
        if count == last and count != changed_from:
            return count
        last = count
        time.sleep(1.5)
    return last


@pytest.mark.parametrize("name", CONTROLS)
def test_sampling_controls_are_the_colocated_engine_s(cluster, llm, name):
    controls = CONTROLS[name]
    for prompt in PROMPTS[:2]:
        choice = create(cluster, prompt, **dict(controls)).choices[0]
        expected = llm.generate(prompt, engine_params(SEED, **dict(controls)))[0].outputs[0]
        assert api_record(choice) == engine_record(expected)
    # NOTE: the inverse: the controls changed the output (so agreeing with the engine is not agreeing with nothing)
    plain = create(cluster, PROMPTS[0]).choices[0]
    controlled = create(cluster, PROMPTS[0], **dict(controls)).choices[0]
    assert api_record(plain) != api_record(controlled)


def test_min_tokens_holds_back_a_stop_token_as_the_colocated_engine_does(cluster, llm):
    stop_id = api_record(create(cluster, PROMPTS[0]).choices[0])[0][1]  # NOTE: the plain run's second token
    early = create(cluster, PROMPTS[0], stop_token_ids=[stop_id]).choices[0]
    held = create(cluster, PROMPTS[0], stop_token_ids=[stop_id], min_tokens=6).choices[0]
    expected = llm.generate(PROMPTS[0], engine_params(SEED, stop_token_ids=[stop_id], min_tokens=6))[0].outputs[0]
    assert api_record(held) == engine_record(expected)
    assert len(early.model_extra["token_ids"]) == 2 and early.finish_reason == "stop"
    held_ids = held.model_extra["token_ids"]
    assert len(held_ids) >= 6 and stop_id not in held_ids[:6]


def test_a_stop_string_ends_one_sample_and_not_the_others(cluster, llm):
    seeds = [sample_seed(SEED, i) for i in range(3)]
    texts = [llm.generate(PROMPTS[3], engine_params(seed))[0].outputs[0].text for seed in seeds]
    stop = next((t[3:6] for t in texts if len(t) > 6 and t[3:6].strip() and all(t[3:6] not in o for o in texts
                                                                               if o is not t)), None)
    if stop is None:
        pytest.skip("no stop string that only one sample contains")
    stopped = [i for i, t in enumerate(texts) if stop in t]
    response = client(cluster).completions.create(
        model="corun-tiny", prompt=PROMPTS[3], max_tokens=10, temperature=0.9, seed=SEED, n=3, stop=[stop],
        extra_body={"ignore_eos": True})
    for choice in response.choices:
        if choice.index in stopped:
            assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] == stop
            assert choice.text == texts[choice.index][:texts[choice.index].index(stop)]
        else:
            assert choice.finish_reason == "length" and choice.text == texts[choice.index]


def test_n_beyond_a_decode_node_s_slots_is_a_400_before_any_prefill(cluster):
    """Issue 23: the decode node refused it after the prefill, and the prefill node's KV lease held its blocks until
    it expired (kv_lease_seconds). The router knows each decode node's slots now (its Pong) and refuses first."""
    import openai
    idle = wait_for_stats(cluster, lambda stats: stats["prefill-0"]["num_leased"] == 0)["prefill-0"]
    with pytest.raises(openai.BadRequestError, match=f"max_num_seqs.*n must be <= {N}"):
        create(cluster, PROMPTS[0], n=N + 1)
    after = node_stats(cluster)["prefill-0"]
    assert after["num_prefills"] == idle["num_prefills"]
    assert after["num_leased"] == 0 and after["num_free_blocks"] == idle["num_free_blocks"]


def test_best_of_other_than_n_is_a_400(cluster):
    import openai
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client(cluster).completions.create(model="corun-tiny", prompt="a", max_tokens=2, n=1, best_of=2)

