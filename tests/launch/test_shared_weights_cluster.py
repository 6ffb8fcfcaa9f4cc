"""Nodes that share a GPU (or, asked, a CPU host) hold one copy of the weights (ClusterConfig.share_weights): the
launcher has one node export and the others import, a 1P1D cluster sharing its weights on CPU serves the engine's
bits, and its prefill node runs on the decode node's memory (the file is mapped in it; with sharing off it is not).
"""

import dataclasses
from pathlib import Path

import pytest

from launch.cluster import ClusterConfig, weights_sharing
from tests.conftest import varied_prompts
from tests.launch.cluster_client import client, colocated_records, complete, complete_all_concurrently, start_cluster
from wire.config import EngineConfig

PARAMS = {"temperature": 0.7, "seed": 3, "max_tokens": 10, "logprobs": 2}
PROMPTS = varied_prompts(8, seed=17)


def holdings(config: ClusterConfig, extra: tuple = ()) -> dict:
    return {f"{role}-{i}": weights_sharing(config, role, i, Path("/private")).holding
            for role, i in [*config.nodes(), *extra]}


def test_the_launcher_shares_the_weights_of_nodes_on_one_gpu():
    cuda = ClusterConfig(engine=EngineConfig(model="m", device="cuda"), num_prefill=2, num_decode=1)
    assert holdings(cuda, extra=(("prefill", 2),)) == {
        "prefill-0": "import", "prefill-1": "import", "decode-0": "export", "prefill-2": "import"}
    assert {weights_sharing(cuda, role, i, Path("/private")).rendezvous for role, i in cuda.nodes()} == {
        "/private/weights-gpu0.msgpack"}
    apart = dataclasses.replace(cuda, prefill_gpus=("0", "1"), decode_gpus=("1",))
    assert holdings(apart) == {"prefill-0": "own", "prefill-1": "import", "decode-0": "export"}
    only_prefill = dataclasses.replace(cuda, num_decode=1, decode_gpus=("2",), prefill_gpus=("0",))
    assert holdings(only_prefill) == {"prefill-0": "export", "prefill-1": "import", "decode-0": "own"}
    assert set(holdings(dataclasses.replace(cuda, share_weights="off")).values()) == {"own"}
    cpu = dataclasses.replace(cuda, engine=EngineConfig(model="m"))
    assert set(holdings(cpu).values()) == {"own"}, "auto shares GPUs only"
    assert holdings(dataclasses.replace(cpu, share_weights="on")) == {
        "prefill-0": "import", "prefill-1": "import", "decode-0": "export"}
    assert weights_sharing(cuda, "prefill", 0, None).holding == "own"  # NOTE: no private directory, nothing shared


def maps_file(pid: int, suffix: str) -> bool:
    return any(line.rstrip().endswith(suffix) for line in Path(f"/proc/{pid}/maps").read_text().splitlines())


def node_pid(cluster, name: str) -> int:
    [process] = [process for node, process in cluster.processes if node == name]
    return process.pid


@pytest.fixture(scope="module")
def engine_records(tiny_model_dir):
    return colocated_records(tiny_model_dir, PROMPTS, PARAMS)


@pytest.mark.parametrize("share", ["on", "off"])
def test_a_cluster_sharing_its_weights_serves_the_engine_s_bits(tiny_model_dir, engine_records, share):
    cluster = start_cluster(tiny_model_dir, num_prefill=1, num_decode=1, share_weights=share)
    try:
        api = client(cluster)
        assert complete_all_concurrently(api, PROMPTS, PARAMS) == engine_records
        assert complete(api, PROMPTS[2], PARAMS) == engine_records[2]
        assert complete(api, PROMPTS[2], {**PARAMS, "seed": 4}) != engine_records[2], \
            "inverse: another seed gives other bits, so the comparison can fail"
        mapped = {name: maps_file(node_pid(cluster, name), ".msgpack.data") for name in ("prefill-0", "decode-0")}
        assert mapped == {"prefill-0": share == "on", "decode-0": share == "on"}, \
            "with sharing on both nodes map the one file; off, neither does (so the check can fail)"
        assert cluster.importers_of("decode-0") == (["prefill-0"] if share == "on" else [])
        if share == "on":  # NOTE: the prefill node would stop with it
            with pytest.raises(ValueError, match="decode-0 holds the weights mapped by prefill-0 on its GPU"):
                cluster.begin_removal("decode-0")
    finally:
        cluster.stop()
