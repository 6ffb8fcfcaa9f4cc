"""vLLM's metric families on the router's /metrics, read with prometheus_client's own parser: vLLM's names, types,
buckets and model_name label, the nodes' forwards summed into vllm:iteration_tokens_total, and KV usage one sample
per role. Fake nodes report fixed stats (tests/router/fake_nodes.py), so the sums are known."""

import importlib.util
from pathlib import Path

import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from router.metrics import (
    INTER_TOKEN_LATENCY_BUCKETS_S,
    REQUEST_LATENCY_BUCKETS_S,
    REQUEST_PARAMS_N_BUCKETS,
    TIME_TO_FIRST_TOKEN_BUCKETS_S,
    request_tokens_buckets,
)
from tests.router.fake_nodes import FakeBehaviour
from tests.router.harness import RouterHarness, get
from wire.config import SchedulerConfig
from wire.iteration_tokens import ITERATION_TOKENS_BUCKETS
from wire.protocol import NodeCapacity

pytestmark = pytest.mark.timeout(60)
MODEL = "corun-tiny"
VLLM_BUCKETS = next(Path(__file__).resolve().parents[2].glob(".venv-vllm/lib/python*/site-packages/vllm/v1/metrics/"
                                                             "buckets.py"), None)
REQUEST_HISTOGRAMS = ("request_prompt_tokens", "request_generation_tokens", "request_params_n",
                      "request_params_max_tokens", "request_inference_time_seconds",
                      "request_prefill_time_seconds", "request_decode_time_seconds")


@pytest.fixture(scope="module")
def router(tiny_model_dir, word_token_ids):
    """Prefill nodes of 100 KV blocks, decode nodes of 300: the pool's usage per role is weighted by blocks."""
    prefill = FakeBehaviour(capacity=NodeCapacity(8, 100, block_size=16))
    decode = FakeBehaviour(capacity=NodeCapacity(8, 300, block_size=16))
    with RouterHarness(tiny_model_dir, word_token_ids, prefill=prefill, decode=decode) as harness:
        harness.wait_until_healthy()
        with OpenAI(base_url=harness.base_url + "/v1", api_key="unused", max_retries=0, timeout=10) as client:
            client.completions.create(model=MODEL, prompt=[11, 12, 13], max_tokens=3, n=2, seed=1,
                                      extra_body={"ignore_eos": True})
        yield harness


@pytest.fixture(scope="module")
def families(router) -> dict:
    text = get(router.base_url + "/metrics").body
    return {family.name: family for family in text_string_to_metric_families(text)}


def buckets(family, **labels) -> dict[float, float]:
    return {float(s.labels["le"]): s.value for s in family.samples
            if s.name.endswith("_bucket") and all(s.labels.get(k) == v for k, v in labels.items())}


def value(family, suffix: str) -> float:
    [sample] = [s for s in family.samples if s.name == family.name + suffix]
    return sample.value


def test_every_vllm_family_carries_the_model_name(families):
    vllm_families = [f for name, f in families.items() if name.startswith("vllm:")]
    assert len(vllm_families) >= 20
    for family in vllm_families:
        assert family.samples, family.name
        assert all(s.labels.get("model_name") == MODEL for s in family.samples), family.name


def test_the_request_histograms_count_each_sample_and_the_prompt_s_n(families):
    for name in REQUEST_HISTOGRAMS:
        assert families[f"vllm:{name}"].type == "histogram", name
    # NOTE: n = 2 samples of a 3-token prompt, 3 tokens each: vLLM counts each sample as a (child) request
    assert value(families["vllm:request_prompt_tokens"], "_count") == 2
    assert value(families["vllm:request_prompt_tokens"], "_sum") == 2 * 3
    assert value(families["vllm:request_generation_tokens"], "_sum") == 2 * 3
    assert value(families["vllm:request_params_max_tokens"], "_sum") == 2 * 3
    assert (value(families["vllm:request_params_n"], "_count"), value(families["vllm:request_params_n"], "_sum")) == (
        1, 2)
    for phase in ("inference", "prefill", "decode"):
        assert value(families[f"vllm:request_{phase}_time_seconds"], "_count") == 2
    inference = value(families["vllm:request_inference_time_seconds"], "_sum")
    parts = sum(value(families[f"vllm:request_{p}_time_seconds"], "_sum") for p in ("prefill", "decode"))
    assert inference == pytest.approx(parts)


def test_vllm_s_bucket_bounds(families):
    token_bounds = request_tokens_buckets(SchedulerConfig.max_model_len)
    assert token_bounds[:7] == (1, 2, 5, 10, 20, 50, 100) and token_bounds[-1] <= SchedulerConfig.max_model_len
    expected = {"vllm:request_prompt_tokens": token_bounds, "vllm:request_params_n": REQUEST_PARAMS_N_BUCKETS,
                "vllm:request_decode_time_seconds": REQUEST_LATENCY_BUCKETS_S,
                "vllm:time_to_first_token_seconds": TIME_TO_FIRST_TOKEN_BUCKETS_S,
                "vllm:inter_token_latency_seconds": INTER_TOKEN_LATENCY_BUCKETS_S,
                "vllm:iteration_tokens_total": ITERATION_TOKENS_BUCKETS}
    for name, bounds in expected.items():
        assert sorted(buckets(families[name])) == [*map(float, bounds), float("inf")], name


@pytest.mark.skipif(VLLM_BUCKETS is None, reason="no .venv-vllm (bash scripts/setup.sh makes it)")
def test_the_bounds_are_those_of_the_installed_vllm():
    """vLLM's buckets module, loaded from its file (pure Python: no vllm import, no torch)."""
    spec = importlib.util.spec_from_file_location("vllm_buckets", VLLM_BUCKETS)
    vllm_buckets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vllm_buckets)
    assert vllm_buckets.histogram_buckets("request_tokens", max_model_len=2048) == list(request_tokens_buckets(2048))
    for family, ours in [("request_latency", REQUEST_LATENCY_BUCKETS_S), ("request_params_n", REQUEST_PARAMS_N_BUCKETS),
                         ("time_to_first_token", TIME_TO_FIRST_TOKEN_BUCKETS_S),
                         ("inter_token_latency", INTER_TOKEN_LATENCY_BUCKETS_S),
                         ("iteration_tokens", ITERATION_TOKENS_BUCKETS)]:
        assert vllm_buckets.histogram_buckets(family) == list(ours), family


def test_iteration_tokens_sum_every_node_s_forwards(families):
    """2 fake prefill nodes ran one 10-token chunk each, 2 fake decode nodes two 1-row steps each."""
    family = families["vllm:iteration_tokens_total"]
    assert family.type == "histogram"
    assert (value(family, "_count"), value(family, "_sum")) == (6, 2 * 10 + 2 * 2)
    cumulative = buckets(family, model_name=MODEL)
    assert (cumulative[1.0], cumulative[8.0], cumulative[16.0], cumulative[float("inf")]) == (4, 4, 6, 6)


def test_kv_cache_usage_is_one_sample_per_role(families):
    samples = {s.labels["role"]: s.value for s in families["vllm:kv_cache_usage_perc"].samples}
    # NOTE: every node of a role reports the same fraction here (prefill 0.5, decode 0.25); per node: corun_node_*
    assert samples == {"prefill": 0.5, "decode": 0.25}
    per_node = {s.labels["node_id"] for s in families["corun_node_kv_cache_usage_perc"].samples}
    assert per_node == {"fake-prefill-0", "fake-prefill-1", "fake-decode-0", "fake-decode-1"}


def test_preemptions_and_prefix_cache_are_zero_counters_and_cache_config_is_an_info_gauge(families):
    for name in ("vllm:num_preemptions", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
        assert families[name].type == "counter"
        assert [s.value for s in families[name].samples if s.name == name + "_total"] == [0.0]
    info = families["vllm:cache_config_info"]
    assert info.type == "gauge"
    by_node = {s.labels["engine"]: s.labels for s in info.samples}
    assert set(by_node) == {"fake-prefill-0", "fake-prefill-1", "fake-decode-0", "fake-decode-1"}
    assert by_node["fake-decode-0"]["num_gpu_blocks"] == "300" and by_node["fake-prefill-1"]["block_size"] == "16"
    assert all(s.value == 1 for s in info.samples)
