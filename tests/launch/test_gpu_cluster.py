"""On a GPU (pytest -m gpu; skipped in CI): 1P1D on one GPU, two processes, the KV crossing over NIXL's CUDA-IPC
path, serves through HTTP exactly what the colocated engine computes on the same GPU."""

import dataclasses
import json
import time
import urllib.request

import pytest

from corun import LLM, SamplingParams
from corun.shared_weights import read_manifest
from launch.cluster import ClusterConfig, free_port
from launch.local import LocalCluster
from wire.config import CacheConfig, EngineConfig, SchedulerConfig, TransferConfig

pytestmark = pytest.mark.gpu

PROMPTS = [list(range(10, 10 + n)) for n in (5, 40, 130, 300)]
PARAMS = {"temperature": 0.7, "seed": 21, "max_tokens": 10, "logprobs": 3}
IDS = {"return_token_ids": True}
"""The choices' token ids, compared with the engine's (vLLM sends them only when asked)."""
CONTROLS = {"n": 3, "presence_penalty": 0.8, "frequency_penalty": 0.3, "repetition_penalty": 1.3, "min_p": 0.05}
BIAS = {12: 2.0, 40: -100.0}


def engine(model_dir: str, dtype: str) -> EngineConfig:
    return EngineConfig(model=model_dir, device="cuda", dtype=dtype, num_threads=1,
                        cache=CacheConfig(memory_budget_bytes=256 * 2**20),
                        scheduler=SchedulerConfig(max_num_seqs=8, max_model_len=512, prefill_chunk_size=128))


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def decode_stats_once(url: str, num_reads: int, timeout_s: float = 10.0) -> dict:
    """The decode node's stats once its pings report num_reads completed reads (pongs lag by a ping)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(f"{url}/admin/nodes", timeout=10) as response:  # NOTE: /health has no stats
            [decode] = [node["stats"] for node in json.loads(response.read())["nodes"] if node["role"] == "decode"]
        if decode.get("reads_completed", 0) >= num_reads or time.monotonic() > deadline:
            return decode
        time.sleep(0.2)


@pytest.mark.parametrize("dtype, copy_on_gpu", [("float32", True), ("bfloat16", True), ("bfloat16", False)])
def test_one_gpu_1p1d_serves_the_colocated_bits_over_cuda_ipc(tiny_model_dir, dtype, copy_on_gpu):
    """The KV read by the decode node's own copy from the prefill node's mapped KV (transfer/gpu_peers.py, the
    default), and by NIXL's READ (copy_on_gpu off): the same bits either way."""
    config = ClusterConfig(engine(tiny_model_dir, dtype), served_model_name="corun-tiny",
                           port=free_port("127.0.0.1"), prefill_gpus=("0",),
                           decode_gpus=("0",), transfer=TransferConfig(copy_on_gpu=copy_on_gpu))
    with LocalCluster(config) as cluster:
        # NOTE: the defaults share the weights (share_weights auto): the decode node published them, the prefill node
        # maps them (it would not have started otherwise)
        manifest = read_manifest(cluster.key_file.parent / "weights-gpu0.msgpack")
        assert manifest.exporter_pid == dict(cluster.processes)["decode-0"].pid
        served = [post(cluster.url, {"model": "corun-tiny", "prompt": prompt, "ignore_eos": True, **PARAMS, **IDS})
                  for prompt in PROMPTS]
        decode = decode_stats_once(cluster.url, len(PROMPTS))
        # NOTE: n samples (the KV copied on the GPU to each sample's blocks) and the sampling controls
        sampled = [post(cluster.url, {"model": "corun-tiny", "prompt": prompt, "ignore_eos": True, **PARAMS, **IDS,
                                      **CONTROLS, "logit_bias": {str(t): b for t, b in BIAS.items()}})
                   for prompt in PROMPTS]
    llm = LLM.from_config(dataclasses.replace(config.engine))
    expected = llm.generate(PROMPTS, SamplingParams(**PARAMS, ignore_eos=True))
    for body, want in zip(served, expected, strict=True):
        choice = body["choices"][0]
        assert choice["token_ids"] == want.outputs[0].token_ids
        assert choice["logprobs"]["token_logprobs"] == [lp.logprob for lp in want.outputs[0].logprobs]
    assert decode["reads_completed"] == len(PROMPTS)
    assert decode["reads_on_gpu"] == (len(PROMPTS) if copy_on_gpu else 0)
    expected = llm.generate(PROMPTS, SamplingParams(**PARAMS, **CONTROLS, logit_bias=BIAS, ignore_eos=True))
    for body, want in zip(sampled, expected, strict=True):
        assert [c["token_ids"] for c in body["choices"]] == [o.token_ids for o in want.outputs]
        assert [c["logprobs"]["token_logprobs"] for c in body["choices"]] == [
            [lp.logprob for lp in o.logprobs] for o in want.outputs]
    assert any(c["token_ids"] != sampled[0]["choices"][0]["token_ids"] for c in sampled[0]["choices"][1:])
    assert decode["kv_probe_read_gbps_min"] >= TransferConfig().min_vram_read_gbps  # NOTE: not the emulated path
