"""The Ray launcher on one local Ray head (2 CPUs, one per node): `corun serve --launcher ray` serves and stops
everything on SIGTERM; a 1P1D RayCluster (placement group, node actors advertising the host's IP) serves bitwise
what the colocated engine computes, and again after its node process or its node actor is killed; bad settings
are refused before anything starts."""

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time

import openai
import pytest
import ray

from cli import main as cli
from corun import LLM, SamplingParams
from launch import ray_cluster
from launch.cluster import ClusterConfig, free_port
from launch.ray_cluster import LABEL_AMOUNT, RayCluster, RayClusterConfig
from tests.conftest import varied_prompts
from tests.launch.cluster_client import (
    CHUNK,
    MAX_MODEL_LEN,
    NODE_START_DEADLINE_S,
    child_pids,
    client,
    complete,
    engine_config,
    node_stats,
    wait_for_line,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # NOTE: one Ray cluster on the host at a time

N = 8
PARAMS = {"temperature": 0.7, "seed": 123, "max_tokens": 12, "logprobs": 3}
PROMPTS = varied_prompts(4, seed=5, max_words=90)  # NOTE: some longer than CHUNK: chunked prefill on the node


def ray_config(model_dir: str = "/nonexistent", device: str = "cpu", num_prefill: int = 1, num_decode: int = 1,
               **ray_settings) -> RayClusterConfig:
    engine = dataclasses.replace(engine_config(model_dir, max_num_seqs=N), device=device)
    cluster = ClusterConfig(engine, served_model_name="corun-tiny",
                            num_prefill=num_prefill, num_decode=num_decode, port=free_port("127.0.0.1"))
    return RayClusterConfig(cluster, **ray_settings)


def node_processes(model_path: str) -> list[int]:
    """pids of the node servers of the model at model_path, wherever Ray started them on this host."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if model_path.encode() in argv and argv[1:3] in ([b"-m", b"prefill_node"], [b"-m", b"decode_node"]):
            pids.append(int(pid))
    return pids


def exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # NOTE: a zombie has exited
    except FileNotFoundError:
        return True


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


def test_corun_serve_on_ray_serves_and_stops_everything_on_sigterm(tiny_model_dir, tmp_path):
    model = tmp_path / "model"  # NOTE: a path of its own, to find this cluster's node processes by command line
    model.symlink_to(tiny_model_dir)
    port = free_port("127.0.0.1")
    argv = [sys.executable, "-m", "cli.main", "serve", "--launcher", "ray", "--placement-strategy", "PACK",
            "--cpus-per-node", "1", "--model", str(model), "--max-num-seqs", str(N), "--max-model-len", "256",
            "--kv-cache-mib", "32", "--port", str(port), "--served-model-name", "corun-tiny"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        wait_for_line(process, "CoRun cluster ready", timeout_s=NODE_START_DEADLINE_S)
        nodes = node_processes(str(model))
        assert len(nodes) == 2, nodes  # prefill and decode, started by the Ray actors
        head = child_pids(process.pid)  # the router and the local Ray head's processes
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
        first, again = (complete(api, "the river reads", PARAMS) for _ in range(2))
        assert first == again and len(first[0]) == PARAMS["max_tokens"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        wait_until(lambda: all(exited(pid) for pid in [*nodes, *head]), 10, "processes left after SIGTERM")
    finally:
        if process.poll() is None:
            process.kill()


@pytest.fixture(scope="module")
def cluster_1p1d(tiny_model_dir):
    started = time.monotonic()
    cluster = RayCluster(ray_config(tiny_model_dir, num_cpus=2)).start()
    print(f"Ray 1P1D healthy after {time.monotonic() - started:.1f} s")
    yield cluster
    cluster.stop()
    assert not ray.is_initialized()  # the cluster started the head, so it shut it down


@pytest.fixture(scope="module")
def colocated(tiny_model_dir):
    """The colocated engine with the nodes' settings (one thread each: the thread count changes the bits)."""
    llm = LLM(tiny_model_dir, max_num_seqs=N, max_model_len=MAX_MODEL_LEN, prefill_chunk_size=CHUNK, num_threads=1)
    outputs = llm.generate(PROMPTS, SamplingParams(**PARAMS, ignore_eos=True))
    return [(list(o.outputs[0].token_ids), [lp.logprob for lp in o.outputs[0].logprobs]) for o in outputs]


def assert_serves_colocated_bits(cluster, colocated) -> None:
    api = client(cluster)
    for i, (ids, steps) in enumerate(complete(api, prompt, PARAMS) for prompt in PROMPTS):
        ref_ids, ref_logprobs = colocated[i]
        assert ids == ref_ids, f"prompt {i}: tokens differ from the colocated engine"
        assert [lp for lp, _ in steps] == ref_logprobs, f"prompt {i}: logprobs differ from the colocated engine"


def test_ray_1p1d_is_placed_by_bundle_and_serves_the_colocated_bits(cluster_1p1d, colocated):
    table = ray.util.placement_group_table(cluster_1p1d.placement_group)
    assert table["strategy"] == "SPREAD" and table["state"] == "CREATED"
    assert list(table["bundles"].values()) == [{"CPU": 1.0}, {"CPU": 1.0}]
    ip = ray.util.get_node_ip_address()
    assert [a.rsplit(":", 1)[0] for a in cluster_1p1d.prefill_addresses + cluster_1p1d.decode_addresses] == [
        f"tcp://{ip}"] * 2  # the host's IP, which other hosts can reach; the nodes bind 0.0.0.0
    assert_serves_colocated_bits(cluster_1p1d, colocated)


def test_a_killed_node_process_is_started_again_on_its_actor(cluster_1p1d, colocated):
    decode = cluster_1p1d.nodes[1]
    old_pid = ray.get(decode.actor.pid.remote())
    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: ray.get(decode.actor.returncode.remote()) is not None, 10, "the actor missed its node's death")
    cluster_1p1d.restart_dead_nodes()
    assert cluster_1p1d.num_restarts == 1
    assert ray.get(decode.actor.pid.remote()) != old_pid
    # NOTE: the new process answers at the old address once it has loaded (slow on a loaded 2-core host)
    assert {"prefill-0", "decode-0"} <= node_stats(cluster_1p1d, timeout_s=NODE_START_DEADLINE_S).keys()
    assert_serves_colocated_bits(cluster_1p1d, colocated)


def test_a_crashed_actor_is_replaced_in_its_bundle_at_the_same_address(cluster_1p1d, colocated):
    prefill = cluster_1p1d.nodes[0]
    old_actor, old_address = prefill.actor, prefill.address
    old_pid = ray.get(old_actor.pid.remote())
    # NOTE: SIGKILL, not ray.kill: a crashed worker gets no chance to stop its children
    os.kill(ray.get(old_actor.__ray_call__.remote(lambda actor: os.getpid())), signal.SIGKILL)
    wait_until(lambda: exited(old_pid), 10, "the node process outlived its actor")
    restarts = cluster_1p1d.num_restarts
    wait_until(lambda: cluster_1p1d.restart_dead_nodes() or cluster_1p1d.num_restarts > restarts, 30,
               "the dead actor was not replaced")
    assert prefill.actor != old_actor and prefill.address == old_address
    assert {"prefill-0", "decode-0"} <= node_stats(cluster_1p1d, timeout_s=NODE_START_DEADLINE_S).keys()
    assert_serves_colocated_bits(cluster_1p1d, colocated)


@pytest.mark.parametrize("settings, message", [
    ({"num_decode": 0}, "prefill and decode servers come together"),
    ({"num_prefill": -1}, "num_prefill must be >= 0"),
    ({"placement_strategy": "DIAGONAL"}, "placement_strategy must be one of SPREAD, PACK"),
    ({"cpus_per_node": 0}, "cpus_per_node must be > 0"),
    ({"address": "head-node"}, "Ray address must be 'auto', 'ray://HOST:PORT' or 'HOST:PORT'"),
    ({"address": "auto", "num_cpus": 2}, "needs address None (a local head)"),
    ({"prefill_resource": "GPU"}, "must be a custom resource name"),
    ({"device": "cuda:1"}, "use device 'cuda'"),
])
def test_bad_settings_are_refused_before_anything_starts(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ray_config(**settings)


def test_bundles_ask_one_gpu_per_cuda_node_and_the_roles_resources():
    config = ray_config(device="cuda", num_decode=2, cpus_per_node=4, prefill_resource="corun_prefill",
                        decode_resource="corun_decode")
    assert config.bundles() == [{"CPU": 4, "GPU": 1, "corun_prefill": LABEL_AMOUNT},
                                {"CPU": 4, "GPU": 1, "corun_decode": LABEL_AMOUNT},
                                {"CPU": 4, "GPU": 1, "corun_decode": LABEL_AMOUNT}]
    assert ray_config().bundles() == [{"CPU": 1.0}, {"CPU": 1.0}]


def test_serve_flags_reach_the_ray_config(monkeypatch, capsys, tiny_model_dir):
    seen = []
    monkeypatch.setattr(ray_cluster, "serve_forever", lambda config: seen.append(config) or 0)
    flags = ["serve", "--model", tiny_model_dir, "--port", str(free_port("127.0.0.1")), "--prefill", "2",
             "--decode", "3", "--launcher", "ray", "--ray-address", "auto",
             "--placement-strategy", "PACK", "--cpus-per-node", "2", "--decode-resource", "corun_decode"]
    assert cli.main(flags) == 0
    assert (seen[0].address, seen[0].placement_strategy, seen[0].cpus_per_node) == ("auto", "PACK", 2.0)
    assert (seen[0].prefill_resource, seen[0].decode_resource) == (None, "corun_decode")
    assert (seen[0].cluster.num_prefill, seen[0].cluster.num_decode) == (2, 3)
    assert cli.main(["serve", "--model", "m", "--cpus-per-node", "2"]) == 2  # a Ray flag without --launcher ray
    assert "--cpus-per-node: only with --launcher ray" in capsys.readouterr().err


@pytest.mark.parametrize("bundles, strategy, hosts, reason", [
    ([{"CPU": 1, "GPU": 1}], "PACK", [{"CPU": 8}], "no host offers {'CPU': 1, 'GPU': 1}"),
    ([{"CPU": 1, "corun_decode": LABEL_AMOUNT}], "SPREAD", [{"CPU": 8, "corun_prefill": 1}], "no host offers"),
    ([{"CPU": 6}, {"CPU": 6}], "STRICT_PACK", [{"CPU": 8}, {"CPU": 8}], "STRICT_PACK needs {'CPU': 12} on one host"),
    ([{"CPU": 1}] * 3, "STRICT_SPREAD", [{"CPU": 8}, {"CPU": 8}], "3 nodes, 2 hosts"),
    ([{"CPU": 4}] * 5, "SPREAD", [{"CPU": 8}, {"CPU": 8}], "less than the nodes need of ['CPU']"),
    ([{"CPU": 4}] * 4, "SPREAD", [{"CPU": 8}, {"CPU": 8}], None),  # NOTE: fits once the hosts are idle: wait
    ([{"CPU": 6}, {"CPU": 6}], "STRICT_SPREAD", [{"CPU": 8}, {"CPU": 8}], None),
])
def test_a_placement_that_can_never_fit_is_named(bundles, strategy, hosts, reason):
    found = ray_cluster.why_never_placed(bundles, strategy, hosts)
    assert found is None if reason is None else reason in found


def test_a_gpu_cluster_on_cpu_hosts_is_refused_at_once(tiny_model_dir):
    """Not after placement_timeout_s (120 s): no amount of waiting gives a CPU-only Ray cluster a GPU."""
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"Ray can never place this cluster \(2 nodes, SPREAD\): no host offers"):
        RayCluster(ray_config(tiny_model_dir, device="cuda", num_cpus=2)).start()
    assert time.monotonic() - start < 60
