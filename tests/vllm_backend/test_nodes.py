"""Prefill and decode nodes on vLLM engines (`corun serve --engine vllm`, 1P1D), through HTTP with the official
client: each request's KV crosses over NIXL from vLLM's KV tensors to the other engine's, token 1 comes from
prefill, and the outputs are bitwise the same alone, under concurrent load and on the colocated vLLM engine under
CoRun's rules with the same settings; under vLLM's default scheduling it is not (the inverse check)."""

from __future__ import annotations

import json
import random
import subprocess
import time
import urllib.request

import openai
import pytest

from launch.local import free_port
from tests.vllm_backend.conftest import REPO, VLLM_PYTHON, requires_vllm
from wire.seeding import sample_seed

pytestmark = [pytest.mark.slow, requires_vllm]

N, CHUNK, MAX_MODEL_LEN = 4, 64, 512
SETTINGS = ["--max-num-seqs", str(N), "--prefill-chunk-size", str(CHUNK), "--max-model-len", str(MAX_MODEL_LEN),
            "--block-size", "32", "--kv-cache-mib", "64"]
rng = random.Random(3)
PROMPTS = [[rng.randrange(2048) for _ in range(length)] for length in (5, 150, 33, 300, 70, 12, 200, 90)]
PARAMS = [{"temperature": 0.7, "seed": 100 + i, "max_tokens": 10, "logprobs": 2, "ignore_eos": True,
           **({"top_p": 0.9, "frequency_penalty": 0.4} if i % 2 else {})} for i in range(len(PROMPTS))]


@pytest.fixture(scope="module")
def cluster(tiny_model_dir, tmp_path_factory):
    port = free_port("127.0.0.1")
    argv = [str(VLLM_PYTHON), "-m", "cli.main", "serve", "--model", tiny_model_dir, "--engine", "vllm",
            "--prefill", "1", "--decode", "1", "--num-threads", "1", "--port", str(port), "--served-model-name",
            "corun-tiny", *SETTINGS]
    # NOTE: a file, not a pipe: vLLM logs to stdout, and nodes blocked on a full pipe miss their heartbeats
    log_path = tmp_path_factory.mktemp("vllm-cluster") / "serve.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        wait_for_log(process, log_path, "CoRun cluster ready", timeout_s=300)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=60)


def wait_for_log(process: subprocess.Popen, log_path, needle: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while needle not in log_path.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"corun serve did not get ready: {log_path.read_text()[-3000:]}")
        time.sleep(0.5)


def complete(url: str, prompt: list[int], params: dict, n: int = 1) -> list[tuple[list[int], list[float]]]:
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=120, max_retries=0)
    response = api.completions.create(
        model="corun-tiny", prompt=prompt, max_tokens=params["max_tokens"], temperature=params["temperature"],
        seed=params["seed"], logprobs=params["logprobs"], n=n, top_p=params.get("top_p", 1.0),
        frequency_penalty=params.get("frequency_penalty", 0.0),
        extra_body={"ignore_eos": True, "return_token_ids": True})
    return [(choice.model_extra["token_ids"], choice.logprobs.token_logprobs) for choice in response.choices]


def colocated_records(outputs: list[dict]) -> list[tuple[list[int], list[float]]]:
    return [(o["tokens"], [float.fromhex(v) for v in o["logprobs"]]) for o in outputs]


def colocated_job(model_dir: str, mode: str, threads: int, params: list[dict]) -> dict:
    """engine_script's job: PROMPTS with these params, all submitted at once to the colocated vLLM engine."""
    return {"model": model_dir, "mode": mode, "threads": threads, "max_num_seqs": N, "chunk": CHUNK,
            "together_only": True, "requests": [{"prompt": p, "params": q} for p, q in zip(PROMPTS, params)]}


def colocated_outputs(*jobs: dict) -> list[list[dict]]:
    """Each job's outputs, the jobs run one after the other in one engine_script process."""
    result = subprocess.run([str(VLLM_PYTHON), "-m", "tests.vllm_backend.engine_script", json.dumps(list(jobs))],
                            capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    return [run["together"] for run in json.loads(result.stdout.strip().splitlines()[-1])]


PROMPT_LOGPROBS_PARAMS = [{"temperature": 0.0, "max_tokens": 1, "prompt_logprobs": 1}] * len(PROMPTS)
"""What the colocated engine computes the echo loglikelihoods' reference with."""


@pytest.fixture(scope="module")
def colocated_fixed_shape(tiny_model_dir) -> dict[str, list[dict]]:
    """The colocated engine's outputs under CoRun's rules, on one thread as the nodes: PARAMS' and prompt logprobs'
    (one process: vLLM's start-up there is most of each run's time)."""
    jobs = {"params": colocated_job(tiny_model_dir, "fixed_shape", 1, PARAMS),
            "prompt_logprobs": colocated_job(tiny_model_dir, "fixed_shape", 1, PROMPT_LOGPROBS_PARAMS)}
    return dict(zip(jobs, colocated_outputs(*jobs.values()), strict=True))


@pytest.fixture(scope="module")
def alone(cluster):
    return [complete(cluster, p, q)[0] for p, q in zip(PROMPTS, PARAMS)]


def test_alone_equals_concurrent(cluster, alone):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        concurrent = list(pool.map(lambda pq: complete(cluster, *pq)[0], zip(PROMPTS, PARAMS)))
    assert concurrent == alone


def test_cluster_equals_colocated_vllm_engine(alone, colocated_fixed_shape):
    assert alone == colocated_records(colocated_fixed_shape["params"])


def test_inverse_vllm_default_scheduling_differs(alone, tiny_model_dir):
    """The comparison above can fail here: the colocated engine under vLLM's own scheduling (prompt chunks mixed
    with decodes under a 64-token budget, batch-sized shapes, split KV), on 2 threads, gives other bits."""
    (mixed,) = colocated_outputs(colocated_job(tiny_model_dir, "mixed", 2, PARAMS))
    assert alone != colocated_records(mixed)


def test_kv_crossed_over_nixl_from_vllm_tensors(cluster, alone):
    with urllib.request.urlopen(f"{cluster}/admin/nodes", timeout=10) as response:
        nodes = json.loads(response.read())["nodes"]
    decode = next(node["stats"] for node in nodes if node["role"] == "decode")
    assert decode["reads_completed"] >= len(PROMPTS)
    assert decode["num_decode_forwards"] > 0 and decode["num_graph_replays"] == 0


def test_n_samples_are_single_requests_with_their_seeds(cluster):
    prompt, params = PROMPTS[1], dict(PARAMS[0], max_tokens=6)
    samples = complete(cluster, prompt, params, n=3)
    singles = [complete(cluster, prompt, dict(params, seed=sample_seed(params["seed"], i)))[0] for i in range(3)]
    assert samples == singles and len({tuple(tokens) for tokens, _ in samples}) > 1


def loglikelihood(url: str, prompt: list[int]) -> list[float | None]:
    """What lm-eval's loglikelihood requests send: echo with logprobs and max_tokens 0."""
    body = {"model": "corun-tiny", "prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 0, "temperature": 0.0}
    request = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["choices"][0]["logprobs"]["token_logprobs"]


def test_echo_loglikelihood_is_the_colocated_engines_prompt_logprobs(cluster, colocated_fixed_shape):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        concurrent = list(pool.map(lambda prompt: loglikelihood(cluster, prompt), PROMPTS))
    assert concurrent == [loglikelihood(cluster, prompt) for prompt in PROMPTS]
    expected = [[None, *(float.fromhex(entry[1]) for entry in o["prompt_logprobs"][1:])]
                for o in colocated_fixed_shape["prompt_logprobs"]]
    assert concurrent == expected and len(expected[3]) == 300  # NOTE: bitwise; a 5-chunk prompt among them


def test_needle_arriving_while_a_batch_runs(cluster, alone):
    """PROMPTS[0] sent while the others (longer outputs) are decoding: bitwise what it gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    # NOTE: 7 requests of 150 tokens on N = 4 rows: hundreds of decode steps, far more than the half second waited
    background = [(p, dict(q, max_tokens=150, seed=q["seed"] + 1000)) for p, q in zip(PROMPTS[1:], PARAMS[1:])]
    with ThreadPoolExecutor(len(background)) as pool:
        running = [pool.submit(complete, cluster, p, q) for p, q in background]
        time.sleep(0.5)
        needle = complete(cluster, PROMPTS[0], PARAMS[0])[0]
        assert not all(future.done() for future in running)  # NOTE: the needle met a running batch
        [future.result() for future in running]
    assert needle == alone[0]


def node_stats(url: str) -> dict[str, dict]:
    with urllib.request.urlopen(f"{url}/admin/nodes", timeout=10) as response:
        return {node["role"]: node["stats"] for node in json.loads(response.read())["nodes"]}


def test_streams_dropped_mid_way_leave_no_kv_or_slot_behind(cluster, alone):
    """Clients that hang up mid-stream: the router aborts, both vLLM nodes free everything, and the next requests
    still get their bits."""
    api = openai.OpenAI(base_url=f"{cluster}/v1", api_key="none", timeout=120, max_retries=0)
    for prompt, params in zip(PROMPTS[:4], PARAMS[:4]):
        stream = api.completions.create(model="corun-tiny", prompt=prompt, max_tokens=200, temperature=0.7,
                                        seed=params["seed"], stream=True, extra_body={"ignore_eos": True})
        for index, _ in enumerate(stream):
            if index == 2:
                break
        stream.close()
    deadline = time.monotonic() + 20
    while True:
        stats = node_stats(cluster)
        idle = stats["decode"]["num_running"] == 0 and stats["decode"]["kv_cache_usage_perc"] == 0 \
            and stats["prefill"]["num_leased"] == 0 and stats["prefill"]["kv_cache_usage_perc"] == 0
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert idle, stats
    assert complete(cluster, PROMPTS[0], PARAMS[0])[0] == alone[0]


def test_settings_vllm_nodes_cannot_honour_are_refused_at_start(tiny_model_dir):
    argv = [str(VLLM_PYTHON), "-m", "cli.main", "serve", "--model", tiny_model_dir, "--engine", "vllm",
            "--prefill", "1", "--decode", "1", "--port", str(free_port("127.0.0.1")), "--prefill-buckets", "default",
            "--served-model-name", "corun-tiny", *SETTINGS]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert result.returncode != 0
    assert "--engine vllm nodes do not support: packed or bucketed prefill" in result.stdout + result.stderr
