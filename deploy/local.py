"""`corun serve`: P prefill servers, D decode servers and the router on one host, as separate processes.

Starts them, waits until the router's /health says every node answers, then waits for Ctrl-C or SIGTERM and
stops them all (SIGTERM, then SIGKILL after a grace period). A node that dies is started again on its port (the
router retries its requests elsewhere meanwhile); if the router dies, everything stops.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

from corun.config import EngineConfig
from corun.engine_args import engine_args_to_argv

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalClusterConfig:
    engine: EngineConfig
    num_prefill: int = 1
    num_decode: int = 1
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str = "corun-tiny"
    max_pending_requests: int = 256
    kv_lease_seconds: float = 60.0
    startup_timeout_s: float = 180.0

    def __post_init__(self):
        if self.num_prefill < 1 or self.num_decode < 1:
            raise ValueError("need at least one prefill and one decode server")


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalCluster:
    def __init__(self, config: LocalClusterConfig):
        self.config = config
        self.processes: list[tuple[str, subprocess.Popen]] = []
        self.argvs: dict[str, list[str]] = {}
        self.num_restarts = 0
        self.prefill_addresses: list[str] = []
        self.decode_addresses: list[str] = []

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def start(self) -> LocalCluster:
        try:
            for role, count in (("prefill", self.config.num_prefill), ("decode", self.config.num_decode)):
                for index in range(count):
                    self.start_node(role, index)
            self.start_router()
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, role: str, index: int) -> None:
        port = free_port(self.config.host)
        engine = self.config.engine
        if engine.num_threads is None:  # NOTE: several busy processes share the host's cores
            engine = dataclasses.replace(engine, num_threads=1)
        argv = [sys.executable, "-m", f"{role}_node", "--node-id", f"{role}-{index}", "--host", self.config.host,
                "--port", str(port), "--kv-lease-seconds", str(self.config.kv_lease_seconds),
                *engine_args_to_argv(engine)]
        self.spawn(f"{role}-{index}", argv)
        (self.prefill_addresses if role == "prefill" else self.decode_addresses).append(
            f"tcp://{self.config.host}:{port}")

    def start_router(self) -> None:
        cfg = self.config
        argv = [sys.executable, "-m", "router", "--model", cfg.engine.model, "--host", cfg.host,
                "--port", str(cfg.port), "--served-model-name", cfg.served_model_name, "--max-model-len",
                str(cfg.engine.scheduler.max_model_len), "--max-pending-requests", str(cfg.max_pending_requests),
                "--base-seed", str(cfg.engine.seed)]
        for address in self.prefill_addresses:
            argv += ["--prefill", address]
        for address in self.decode_addresses:
            argv += ["--decode", address]
        self.spawn("router", argv)

    def spawn(self, name: str, argv: list[str]) -> None:
        logger.info("starting %s", name)
        self.argvs[name] = argv
        self.processes.append((name, subprocess.Popen(argv)))

    def restart_dead_nodes(self) -> None:
        """Start again every prefill/decode process that exited; raise if the router did."""
        for i, (name, process) in enumerate(self.processes):
            if process.poll() is None:
                continue
            if name == "router":
                raise RuntimeError(f"router exited with code {process.returncode}")
            logger.warning("%s exited with code %s; starting it again", name, process.returncode)
            self.processes[i] = (name, subprocess.Popen(self.argvs[name]))
            self.num_restarts += 1

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            if self.healthy():
                logger.info("cluster ready at %s", self.url)
                return
            time.sleep(0.25)
        raise TimeoutError(f"cluster not healthy after {self.config.startup_timeout_s} s")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def check_alive(self) -> None:
        for name, process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with code {process.returncode}")

    def stop(self, grace_s: float = 10.0) -> None:
        for _, process in self.processes:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + grace_s
        for name, process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in time; killing it", name)
                process.kill()
                process.wait()
        self.processes.clear()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_forever(config: LocalClusterConfig) -> int:
    """Run until SIGINT/SIGTERM or until a process dies (then exit non-zero)."""
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: stopping.append(signum))
    cluster = LocalCluster(config).start()
    print(f"CoRun cluster ready: {cluster.url}/v1 ({config.num_prefill}P{config.num_decode}D, "
          f"N={config.engine.scheduler.max_num_seqs})", flush=True)
    try:
        while not stopping:
            cluster.restart_dead_nodes()
            time.sleep(0.5)
    except RuntimeError as error:
        logger.error("%s; stopping the cluster", error)
        return 1
    finally:
        cluster.stop()
    return 0
