"""Chaos: random SIGKILLs of prefill and decode nodes (restarted as `corun serve` does), and nodes added and drained
away (killed while they drain too), during at least 200 streaming requests; and `corun serve` itself SIGKILLed under
streams. Every stream that completes equals its undisturbed run, none is lost (a request the cluster gives up on
ends with an error event or a closed connection, never silence), the idle cluster returns to its idle counts
afterwards, and a killed `corun serve` leaves no process behind."""

import concurrent.futures
import os
import random
import signal
import threading
import time

import openai
import pytest

from launch import scaling
from launch.cluster import check_port_free
from launch.local import LocalCluster, LocalClusterConfig, free_port
from tests.launch.cluster_client import alive, client, descendants, engine_config, node_stats, start_serve

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NUM_REQUESTS = 200
MAX_CHAOS_REQUESTS = 4 * NUM_REQUESTS
"""The chaos run streams at least NUM_REQUESTS, and on until its kills and drains have all landed (a restarted node
serves again only after SERVING_AFTER_S, so a run quicker than the restarts would end with kills pending), at most
this many."""
CONCURRENCY = 24
LEASE_S = 4.0
"""Short leases, so that what a fault left behind is freed within the test (the bound is the lease)."""
SERVING_AFTER_S = 5.0
KILL_AT = (0.05, 0.25, 0.45, 0.65, 0.85)
KILL_GAP_S = 1.0
DRAIN_AT = (0.0, 0.5)
"""Progress fractions at which a node is added and a serving one of its role drained away and killed as it drains
(decode, then prefill). The first at once, while every node serves: so a kill during a drain lands however fast the
run is; the second only if the first has ended and a prefill node may be killed by then."""
PROMPTS = ["the river reads the morning light", "seven numbers and a name", "a cat sat under the green house",
           "people ran quickly on the blue mat"]


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    config = LocalClusterConfig(engine_config(tiny_model_dir), served_model_name="corun-tiny",
                                num_prefill=2, num_decode=2,
                                port=free_port("127.0.0.1"), kv_lease_seconds=LEASE_S)
    cluster = LocalCluster(config).start()
    yield cluster
    cluster.stop()


def request_args(i: int) -> dict:
    return dict(model="corun-tiny", prompt=PROMPTS[i % len(PROMPTS)], max_tokens=24 + i % 17, temperature=0.9,
                seed=1000 + i, logprobs=1, extra_body={"ignore_eos": True, "return_token_ids": True})


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
    requests finished; so the kills land mid-run whatever the host's speed), adds a node and drains a serving one of
    its role away at each of DRAIN_AT, restarts the dead ones every 0.1 s (and stops the drained ones), until
    stopped."""

    def __init__(self, cluster: LocalCluster, progress, seed: int):
        self.cluster, self.progress, self.random = cluster, progress, random.Random(seed)
        self.kills: list[str] = []
        self.removals: list = []
        self.pending = len(KILL_AT) + len(DRAIN_AT)
        """Kills and drains not yet done."""
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
        drains = [(int(fraction * NUM_REQUESTS), role) for fraction, role in zip(DRAIN_AT, ("decode", "prefill"))]
        last_kill = float("-inf")
        while not self._stop.is_set():
            # NOTE: one kill at a time, a second apart: the router must have seen the last one (its connection
            # closed) before the next one's victim is chosen by the router's view of who serves
            if time.monotonic() - last_kill > KILL_GAP_S:
                if thresholds and self.progress() >= thresholds[0] and self._kill_one():
                    thresholds.pop(0)
                    last_kill = time.monotonic()
                elif drains and self.progress() >= drains[0][0] and self._replace_one(drains[0][1]):
                    drains.pop(0)
                    last_kill = time.monotonic()
                self.pending = len(thresholds) + len(drains)
            self.cluster.restart_dead_nodes()
            time.sleep(0.1)

    def _replace_one(self, role: str) -> bool:
        """Add a node of role, drain a serving one of it away (once no other drain runs), and SIGKILL that one as
        it drains: what it held fails over, it is restarted (holding nothing), and its drain still ends."""
        if any(removal.state not in ("removed", "returned") for removal in self.removals):
            return False
        victims = [(name, process) for name, process in self._killable() if name.startswith(role)]
        if not victims:
            return False
        name, process = victims[0]
        self.cluster.add_node(role)
        removal = self.cluster.begin_removal(name)
        self.removals.append(removal)
        if removal.state == "draining":
            process.send_signal(signal.SIGKILL)
            self.kills.append(f"{name} (draining)")
        return True

    def _kill_one(self) -> bool:
        candidates = self._killable()
        if not candidates:
            return False
        name, process = self.random.choice(candidates)
        process.send_signal(signal.SIGKILL)
        self.kills.append(name)
        return True

    def _killable(self) -> list:
        """Serving nodes (up SERVING_AFTER_S, healthy in the router and not draining) whose role keeps another such
        node: a kill of a node still loading, or of a role's last serving node, tests the restart policy or the
        error path, not failover; a draining one is killed once, by _replace_one."""
        now = time.monotonic()
        serving = [(name, p) for name, p in self.cluster.processes if name != "router" and p.poll() is None
                   and now - self.cluster.restarts.nodes[name].started_at > SERVING_AFTER_S]
        try:
            nodes = scaling.router_admin(self.cluster.url, "GET")["nodes"]
        except OSError:  # NOTE: a loaded host's router may answer later than the call's timeout: next tick
            return []
        taking = {n["node_id"] for n in nodes if n["healthy"] and not n["draining"]}
        return [(name, p) for name, p in serving if name in taking
                and any(other.split("-")[0] == name.split("-")[0] and other != name and other in taking
                        for other, _ in serving)]


def test_random_kills_during_200_streams(cluster):
    api = client(cluster)
    references = {}
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        for i, result in zip(range(NUM_REQUESTS), pool.map(lambda i: run_stream(api, i), range(NUM_REQUESTS))):
            assert result[0] == "done"
            references[i] = result[1:]
        finished, results = [], []
        with Chaos(cluster, progress=lambda: len(finished), seed=7) as chaos:
            next_request = iter(range(MAX_CHAOS_REQUESTS))

            def stream_until_chaos_ends():
                for k in next_request:  # NOTE: a range iterator hands each k to one thread (the GIL)
                    if k >= NUM_REQUESTS and not chaos.pending:
                        return
                    results.append((k % NUM_REQUESTS, run_stream(api, k % NUM_REQUESTS)))
                    finished.append(k)

            for worker in [pool.submit(stream_until_chaos_ends) for _ in range(CONCURRENCY)]:
                worker.result()
    # NOTE: a kill waits for a node of a role that keeps another serving one: on a slow host not all five land
    assert len([kill for kill in chaos.kills if "draining" not in kill]) >= 3, chaos.kills
    # NOTE: a drain waits for the one before it, and a run that is quick leaves none of them waiting
    assert chaos.removals and any("draining" in kill for kill in chaos.kills), chaos.kills
    done = [(i, result) for i, result in results if result[0] == "done"]
    for i, result in done:
        assert tuple(result[1:]) == tuple(references[i]), f"request {i} differs from its undisturbed run"
    errors = [i for i, result in results if result[0] == "error event"]
    # NOTE: every request ended (done or an error event): none timed out in silence (that raises above)
    assert len(results) >= NUM_REQUESTS and len(done) + len(errors) == len(results)
    assert len(done) >= len(results) * 0.9, f"{len(errors)} gave up: {errors}"
    print(f"chaos: {len(chaos.kills)} kills ({', '.join(chaos.kills)}), removed "
          f"{', '.join(removal.node_id for removal in chaos.removals)}, {len(done)} done, {len(errors)} errors")
    # NOTE: generous: restarted nodes load again before they answer (38 s ran out on a loaded 2-core host once); a
    # leaked block or lease never returns, however long the wait
    assert_idle_counts_return(cluster, timeout_s=LEASE_S * 2 + 120, removals=chaos.removals)


def assert_idle_counts_return(cluster: LocalCluster, timeout_s: float, removals=()) -> None:
    """Every removal done (drained, then stopped), every node alive again, with every KV block free and no lease
    left, within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        cluster.restart_dead_nodes()
        if any(removal.state != "removed" for removal in removals):
            assert time.monotonic() < deadline, f"removals not done: {[r.answer() for r in removals]}"
            time.sleep(0.5)
            continue
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


SUPERVISOR_REQUESTS = 48
SUPERVISOR_KILL_AT = 0.25
ORPHAN_DEADLINE_S = 60.0
"""Generous (a loaded 2-core host): every process `corun serve` started ends within it."""


def run_stream_visibly(api: openai.OpenAI, i: int) -> tuple[str, list[int], list[float]]:
    """run_stream, where a closed connection (the router went away) is a visible end too; silence still raises."""
    try:
        return run_stream(api, i)
    except openai.APITimeoutError:
        raise
    except openai.APIConnectionError:
        return "connection closed", [], []


def test_sigkill_of_corun_serve_under_streams_loses_nothing_silently_and_leaves_nothing(tiny_model_dir, tmp_path):
    port = free_port("127.0.0.1")
    serve = start_serve(tiny_model_dir, port, tmp_path)
    started = descendants(serve.pid)
    api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=60, max_retries=0)
    try:
        with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
            references = list(pool.map(lambda i: run_stream(api, i), range(SUPERVISOR_REQUESTS)))
            assert all(state == "done" for state, *_ in references)
            finished = []

            def counted(i: int):
                result = run_stream_visibly(api, i)
                finished.append(i)
                return result

            futures = [pool.submit(counted, i) for i in range(SUPERVISOR_REQUESTS)]
            deadline = time.monotonic() + ORPHAN_DEADLINE_S
            while len(finished) < SUPERVISOR_REQUESTS * SUPERVISOR_KILL_AT and time.monotonic() < deadline:
                time.sleep(0.05)
            serve.send_signal(signal.SIGKILL)
            results = [future.result() for future in futures]  # NOTE: silence raises (the client times out)
        states = [state for state, *_ in results]
        for i, (state, *output) in enumerate(results):
            assert state != "done" or output == list(references[i][1:]), f"request {i} differs from its run"
        print(f"corun serve SIGKILLed: {states.count('done')} done, {states.count('error event')} error events, "
              f"{states.count('connection closed')} connections closed")
        assert states.count("done") < SUPERVISOR_REQUESTS  # NOTE: the kill landed mid-run
        deadline = time.monotonic() + ORPHAN_DEADLINE_S
        while alive(started) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert alive(started) == [], f"orphans of corun serve still running: {alive(started)}"
        check_port_free("127.0.0.1", port)
    finally:
        if serve.poll() is None:
            serve.kill()
        for pid in alive(started):  # NOTE: whatever this test left running, it ends
            os.kill(pid, signal.SIGKILL)
