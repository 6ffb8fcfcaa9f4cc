"""A random-weight model directory (`corun make-random-model`, a benchmark shape without a weight file) is served
by the cluster like a checkpoint: token-id prompts in, the colocated engine's tokens and logprobs out."""

import dataclasses
import json

import pytest

from corun import LLM, SamplingParams
from corun.models.config import random_weights_spec
from corun.models.loader import model_digest
from corun.models.presets import make_random_model_dir
from tests.launch.cluster_client import client, engine_config, start_cluster
from wire.tokenizer import load_tokenizer

PROMPTS = [[5, 17, 300, 2000, 9], list(range(100, 180)), [2046]]


@pytest.fixture(scope="module")
def random_model_dir(tmp_path_factory):
    return str(make_random_model_dir("qwen3-tiny", tmp_path_factory.mktemp("random-qwen3-tiny"), seed=3))


def test_the_directory_holds_config_and_a_tokenizer_covering_the_vocabulary(random_model_dir):
    config = json.loads(open(f"{random_model_dir}/config.json").read())
    tokenizer = load_tokenizer(random_model_dir)
    assert random_weights_spec(random_model_dir) == {"preset": "qwen3-tiny", "seed": 3}
    assert tokenizer.vocab_size == config["vocab_size"] == 2048 and tokenizer.eos_token_id == 2047
    assert tokenizer.encode(tokenizer.decode([5, 17, 300])) == [5, 17, 300]
    assert model_digest(random_model_dir) != model_digest(str(make_random_model_dir(
        "qwen3-tiny", f"{random_model_dir}-seed-4", seed=4)))  # NOTE: the seed is part of what the digest covers


def test_cluster_serves_it_bitwise_like_the_colocated_engine(random_model_dir):
    params = {"temperature": 0.7, "seed": 11, "max_tokens": 8, "logprobs": 2}
    # NOTE: one thread, as the nodes run (the thread count changes the bits)
    llm = LLM.from_config(dataclasses.replace(engine_config(random_model_dir), num_threads=1))
    expected = [llm.generate([prompt], SamplingParams(**params, ignore_eos=True))[0]
                for prompt in PROMPTS]
    cluster = start_cluster(random_model_dir, 1, 1)
    try:
        api = client(cluster)
        for prompt, want in zip(PROMPTS, expected, strict=True):
            choice = api.completions.create(model="corun-tiny", prompt=prompt,
                                            extra_body={"ignore_eos": True, "return_token_ids": True},
                                            **params).choices[0]
            assert choice.model_extra["token_ids"] == want.outputs[0].token_ids
            assert choice.logprobs.token_logprobs == [lp.logprob for lp in want.outputs[0].logprobs]
    finally:
        cluster.stop()
