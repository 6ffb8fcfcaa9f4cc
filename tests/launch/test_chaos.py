"""Chaos: random SIGKILLs of prefill and decode nodes (restarted as `corun serve` does) during 200 streaming
requests. Every stream that completes equals its undisturbed run, none is lost (a request the cluster gives up on
ends with an error event, never silence), and the idle cluster returns to its idle counts afterwards."""

import concurrent.futures
import random
import signal
import threading
import time

import openai
import pytest

from launch.local import LocalCluster, LocalClusterConfig, free_port
from tests.launch.cluster_client import client, engine_config, node_stats

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NUM_REQUESTS = 200
CONCURRENCY = 24
LEASE_S = 4.0
"""Short leases, so that what a fault left behind is freed within the test (the bound is the lease)."""
SERVING_AFTER_S = 5.0
KILL_AT = (0.05, 0.25, 0.45, 0.65, 0.85)
PROMPTS = ["the river reads the morning light", "seven numbers and a name", "a cat sat under the green house",
           "people ran quickly on the blue mat"]


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    config = LocalClusterConfig(engine_config(tiny_model_dir), num_prefill=2, num_decode=2,
                                port=free_port("127.0.0.1"), kv_lease_seconds=LEASE_S)
    cluster = LocalCluster(config).start()
    yield cluster
    cluster.stop()


def request_args(i: int) -> dict:
    return dict(model="corun-tiny", prompt=PROMPTS[i % len(PROMPTS)], max_tokens=24 + i % 17, temperature=0.9,
                seed=1000 + i, logprobs=1, extra_body={"ignore_eos": True})


def run_stream(api: openai.OpenAI, i: int) -> tuple[str, list[int], list[float]]:
    """-> ("done" | "error event", token ids, logprobs). Silence raises (the client times out)."""
    token_ids, logprobs = [], []
    try:
        for chunk in api.completions.create(stream=True, **request_args(i)):
            for choice in chunk.choices:
                token_ids += choice.model_extra.get("token_ids") or []
                logprobs += choice.logprobs.token_logprobs if choice.logprobs else []
    except openai.APIError as error:
        if isinstance(error, openai.APITimeoutError | openai.APIConnectionError):
            raise
        return "error event", token_ids, logprobs
    return "done", token_ids, logprobs


class Chaos:
    """Kills a random serving node each time the streams' progress passes the next of KILL_AT (a fraction of the
    requests finished; so the kills land mid-run whatever the host's speed), restarts the dead ones every 0.2 s,
    until stopped."""

    def __init__(self, cluster: LocalCluster, progress, seed: int):
        self.cluster, self.progress, self.random = cluster, progress, random.Random(seed)
        self.kills: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        thresholds = [int(fraction * NUM_REQUESTS) for fraction in KILL_AT]
        while not self._stop.is_set():
            if thresholds and self.progress() >= thresholds[0] and self._kill_one():
                thresholds.pop(0)
            self.cluster.restart_dead_nodes()
            time.sleep(0.1)

    def _kill_one(self) -> bool:
        """A serving node (up SERVING_AFTER_S) whose role keeps another serving one: a kill of a node still
        loading, or of a role's last node, tests the restart policy or the error path, not failover."""
        now = time.monotonic()
        serving = [(name, p) for name, p in self.cluster.processes if name != "router" and p.poll() is None
                   and now - self.cluster.restarts.nodes[name].started_at > SERVING_AFTER_S]
        candidates = [(name, p) for name, p in serving
                      if sum(other.split("-")[0] == name.split("-")[0] for other, _ in serving) > 1]
        if not candidates:
            return False
        name, process = self.random.choice(candidates)
        process.send_signal(signal.SIGKILL)
        self.kills.append(name)
        return True


def test_random_kills_during_200_streams(cluster):
    api = client(cluster)
    references = {}
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        for i, result in zip(range(NUM_REQUESTS), pool.map(lambda i: run_stream(api, i), range(NUM_REQUESTS))):
            assert result[0] == "done"
            references[i] = result[1:]
        finished = []

        def counted(i: int):
            result = run_stream(api, i)
            finished.append(i)
            return result

        with Chaos(cluster, progress=lambda: len(finished), seed=7) as chaos:
            results = list(pool.map(counted, range(NUM_REQUESTS)))
    # NOTE: a kill waits for a node of a role that keeps another serving one: on a slow host not all five land
    assert len(chaos.kills) >= 3, chaos.kills
    done = [i for i, (state, *_) in enumerate(results) if state == "done"]
    for i in done:
        assert tuple(results[i][1:]) == tuple(references[i]), f"request {i} differs from its undisturbed run"
    errors = [i for i, (state, *_) in enumerate(results) if state == "error event"]
    # NOTE: every request ended (done or an error event): none timed out in silence (that raises above)
    assert len(done) + len(errors) == NUM_REQUESTS
    assert len(done) >= NUM_REQUESTS * 0.9, f"{len(errors)} gave up: {errors}"
    print(f"chaos: {len(chaos.kills)} kills ({', '.join(chaos.kills)}), {len(done)} done, {len(errors)} errors")
    assert_idle_counts_return(cluster, timeout_s=LEASE_S * 2 + 30)


def assert_idle_counts_return(cluster: LocalCluster, timeout_s: float) -> None:
    """Every node alive again, with every KV block free and no lease left, within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        cluster.restart_dead_nodes()
        try:
            stats = node_stats(cluster)
        except TimeoutError:
            stats = {}
        held = {name: s for name, s in stats.items()
                if s.get("kv_cache_usage_perc", 1) != 0 or s.get("num_leased", 0) or s.get("num_running", 0)}
        if len(stats) == 4 and not held:
            return
        assert time.monotonic() < deadline, f"not idle after {timeout_s} s: {held or stats}"
        time.sleep(0.5)
