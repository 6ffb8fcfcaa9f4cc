"""A `corun serve` that dies without stopping its cluster (SIGKILL, the OOM killer) leaves nothing behind: every
process it started ends with it, its ports are free, and the next `corun serve` removes the key directory it left.
The nodes get a cleaned environment (no API key: they never need it)."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launch.cluster import check_port_free
from launch.local import LocalCluster, LocalClusterConfig, free_port
from tests.launch.cluster_client import alive, descendants, engine_config, start_serve

API_KEY = "sk-supervision-test"
ORPHAN_DEADLINE_S = 60.0
"""Generous (a loaded 2-core host); the figure that matters is printed: processes alive 10 s after the kill."""


def key_dirs(temp_dir: Path) -> list[str]:
    return sorted(path.name for path in temp_dir.glob("corun-cluster-key-*"))


@pytest.mark.timeout(600)
def test_sigkill_of_corun_serve_ends_every_process_it_started(tiny_model_dir, tmp_path):
    port = free_port("127.0.0.1")
    serve = start_serve(tiny_model_dir, port, tmp_path)
    second, started = None, []
    try:
        started = descendants(serve.pid)
        assert len(started) >= 3  # NOTE: prefill, decode, router (and any parser worker)
        left_behind = key_dirs(tmp_path)
        assert len(left_behind) == 1
        serve.send_signal(signal.SIGKILL)
        serve.wait()
        killed_at = time.monotonic()
        alive_at_10_s = None
        while alive(started) and time.monotonic() - killed_at < ORPHAN_DEADLINE_S:
            if alive_at_10_s is None and time.monotonic() - killed_at >= 10:
                alive_at_10_s = len(alive(started))
            time.sleep(0.2)
        print(f"after SIGKILL of corun serve: {len(alive(started))} of {len(started)} processes alive at "
              f"{time.monotonic() - killed_at:.1f} s; at 10 s: {alive_at_10_s if alive_at_10_s is not None else 0}")
        assert alive(started) == [], f"orphans of corun serve still running: {alive(started)}"
        check_port_free("127.0.0.1", port)  # NOTE: a new `corun serve --port` can start
        second = start_serve(tiny_model_dir, port, tmp_path)
        now = key_dirs(tmp_path)
        assert left_behind[0] not in now and len(now) == 1, (left_behind, now)  # NOTE: the dead one's is gone
    finally:
        for process in (serve, second):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(timeout=60)
        for pid in alive(started):  # NOTE: whatever this test left running, it ends
            os.kill(pid, signal.SIGKILL)


SUPERVISED_CHILD = """
import os, sys, time
from wire.supervision import end_with_supervisor
end_with_supervisor(int(sys.argv[1]))
print("supervised", flush=True)
time.sleep(120)
"""


def test_a_supervised_process_outlives_the_thread_that_started_it():
    """The kernel sends the parent-death signal when the forking *thread* ends (a test's helper thread restarting
    a node): the process must check that its supervisor really died, and serve on."""
    started = []

    def spawn():
        child = subprocess.Popen([sys.executable, "-c", SUPERVISED_CHILD, str(os.getpid())], stdout=subprocess.PIPE,
                                 text=True)
        assert child.stdout.readline().strip() == "supervised"
        started.append(child)

    thread = threading.Thread(target=spawn)
    thread.start()
    thread.join()  # NOTE: the thread that forked the child has ended: the kernel signalled the child
    [child] = started
    try:
        time.sleep(2)
        assert child.poll() is None, f"the supervised process exited ({child.returncode}) with its supervisor alive"
    finally:
        child.kill()
        child.wait()


def test_nodes_do_not_inherit_the_api_key(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", API_KEY)
    config = LocalClusterConfig(engine_config(tiny_model_dir), served_model_name="corun-tiny",
                                port=free_port("127.0.0.1"), api_key=API_KEY)
    with LocalCluster(config) as cluster:
        for name, process in cluster.processes:
            environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
            assert not any(API_KEY.encode() in variable for variable in environ), f"{name} has the API key"
        [router] = cluster.routers.processes.values()
        assert f"VLLM_API_KEY={API_KEY}".encode() in Path(f"/proc/{router.pid}/environ").read_bytes().split(b"\0")
