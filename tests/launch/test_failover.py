"""Node loss: a decode node killed mid-stream; the router re-runs the request elsewhere and, outputs being
deterministic, the client's stream continues with exactly the tokens an undisturbed run gives."""

import signal

import pytest

from tests.launch.cluster_client import client, node_stats, start_cluster

PARAMS = {"temperature": 0.8, "seed": 11, "max_tokens": 400, "logprobs": 2}
PROMPT = "the river reads the morning light because"


@pytest.fixture(scope="module")
def cluster_1p2d(tiny_model_dir):
    cluster = start_cluster(tiny_model_dir, num_prefill=1, num_decode=2)
    yield cluster
    cluster.stop()


def kill_busy_decode_node(cluster) -> str:
    busy = [node for node, stats in node_stats(cluster).items()
            if node.startswith("decode") and stats["num_running"] > 0]
    assert len(busy) == 1, busy
    process = dict(cluster.processes)[busy[0]]
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    return busy[0]


def test_stream_survives_its_decode_node_dying(cluster_1p2d):
    api = client(cluster_1p2d)
    args = dict(model="corun-tiny", prompt=PROMPT, max_tokens=PARAMS["max_tokens"], temperature=PARAMS["temperature"],
                seed=PARAMS["seed"], logprobs=PARAMS["logprobs"], extra_body={"ignore_eos": True})
    reference = api.completions.create(**args).choices[0]
    token_ids, logprobs, killed = [], [], None
    for chunk in api.completions.create(stream=True, **args):
        for choice in chunk.choices:
            token_ids += choice.model_extra.get("token_ids") or []
            logprobs += choice.logprobs.token_logprobs if choice.logprobs else []
        if killed is None and len(token_ids) >= 20:
            killed = kill_busy_decode_node(cluster_1p2d)
    assert killed is not None and len(token_ids) == PARAMS["max_tokens"]
    assert token_ids == reference.model_extra["token_ids"]
    assert logprobs == reference.logprobs.token_logprobs  # the rest came from the other decode node


def test_a_dead_node_is_started_again_and_serves(cluster_1p2d):
    """What `corun serve` does every half second: restart dead nodes (decode-x was killed above)."""
    cluster_1p2d.restart_dead_nodes()
    assert cluster_1p2d.num_restarts == 1
    cluster_1p2d.wait_healthy()
    stats = node_stats(cluster_1p2d)  # every node answers again, the restarted one included
    assert {"prefill-0", "decode-0", "decode-1"} <= stats.keys()
    api = client(cluster_1p2d)
    for node in ("decode-0", "decode-1"):
        response = api.completions.create(model="corun-tiny", prompt=PROMPT, max_tokens=8, temperature=0.8, seed=3,
                                          extra_headers={"X-CoRun-Decode-Node": node})
        assert len(response.choices[0].model_extra["token_ids"]) == 8
