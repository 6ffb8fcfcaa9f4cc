"""`corun serve`: P prefill servers, D decode servers and the router on one host, as separate processes.

Starts them, waits until the router's /health says every node answers, then waits for Ctrl-C or SIGTERM and
stops them all (SIGTERM, then SIGKILL after a grace period). A node that dies is started again on its port (the
router retries its requests elsewhere meanwhile), and so is a router (launch/routers.py: with --routers K the others
serve meanwhile); one that keeps dying at start stops everything. At run time add_node()
starts one more node and adds it to the router's pool; begin_removal() drains one (no new requests, what it holds
finishes) beside the serve loop, which then stops it (launch/removals.py); remove_node() waits for that.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
from pathlib import Path

from launch import cluster as launch
from launch import serve_loop
from launch.cluster import ClusterConfig, free_port
from launch.removals import Removal, Removals, wait_until_removed
from launch.restarts import RestartPolicy
from launch.routers import RouterGroup
from wire.config import SharedWeightsConfig
from wire.node_auth import ClusterKey

logger = logging.getLogger(__name__)

LocalClusterConfig = ClusterConfig
"""NOTE: the local launcher needs nothing beyond the settings every launcher shares."""

__all__ = ["LocalCluster", "LocalClusterConfig", "free_port", "serve_forever"]


class LocalCluster:
    def __init__(self, config: ClusterConfig):
        self.config = config
        self.processes: list[tuple[str, subprocess.Popen]] = []
        self.argvs: dict[str, list[str]] = {}
        self.envs: dict[str, dict[str, str]] = {}
        self.num_restarts = 0
        self.restarts = RestartPolicy()
        self.prefill_addresses: list[str] = []
        self.decode_addresses: list[str] = []
        self.colocated_addresses: list[str] = []
        self.node_addresses: dict[str, str] = {}
        """node id -> tcp://HOST:PORT, of the nodes running now."""
        self.cluster_key: ClusterKey | None = None
        self.key_file: Path | None = None
        """The cluster's CURVE key pair and its file (made at start, removed at stop)."""
        self.num_started = {"prefill": 0, "decode": 0, "colocated": 0}
        """Nodes ever started per role: the next one's index (ids are never reused)."""
        self.routers: RouterGroup | None = None
        self.removals = Removals(config.drain_timeout_s, config.api_key)
        self.stopping: list[threading.Thread] = []
        """Threads stopping removed nodes (stop() waits for them)."""
        self.weights: dict[str, SharedWeightsConfig] = {}
        """How each node started holds its weights (launch/cluster.py weights_sharing)."""

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def pool_addresses(self) -> tuple[list[str], list[str], list[str]]:
        """(prefill, decode, colocated) addresses of the pool now: what a (re)started router is given."""
        return list(self.prefill_addresses), list(self.decode_addresses), list(self.colocated_addresses)

    def role_addresses(self, role: str) -> list[str]:
        return {"prefill": self.prefill_addresses, "decode": self.decode_addresses,
                "colocated": self.colocated_addresses}[role]

    def start(self) -> LocalCluster:
        if self.processes:
            raise RuntimeError("this cluster is already started (use `with LocalCluster(config)` or start(), not both)")
        self.cluster_key, self.key_file = launch.make_cluster_key()
        try:
            for role, index in self.config.nodes():
                self.start_node(role, index)
            self.start_router()
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, role: str, index: int) -> str:
        """Start node role-index; -> its address."""
        host, port = self.config.host, free_port(self.config.host)
        self.num_started[role] = max(self.num_started[role], index + 1)
        # NOTE: several busy processes share the host's cores: one thread each unless the engine names a count
        engine = launch.node_engine(self.config, role, 1, launch.gpu_kv_split(self.config, role, index))
        gpu = launch.node_gpu(self.config, role, index)
        env = launch.node_environment(gpu)
        weights = launch.weights_sharing(self.config, role, index, self.key_file and self.key_file.parent)
        self.weights[launch.node_id(role, index)] = weights
        argv = launch.node_argv(self.config, engine, role, index, host, port, key_file=self.key_file,
                                weights=weights)
        self.spawn(launch.node_id(role, index), argv, env, "" if gpu is None else f" on GPU {gpu}")
        address = f"tcp://{host}:{port}"
        self.role_addresses(role).append(address)
        self.node_addresses[launch.node_id(role, index)] = address
        return address

    def add_node(self, role: str) -> str:
        """One more node of this role, in the router's pool (it takes requests once it answers: node_state); -> its
        id."""
        index = self.num_started[role]
        address = self.start_node(role, index)
        self.routers.add_node(role, address)
        return launch.node_id(role, index)

    def node_address(self, node_id: str) -> str | None:
        """The running node's address, None for no such node."""
        return self.node_addresses.get(node_id)

    def begin_removal(self, node_id: str) -> Removal:
        """Drain the node in every router (the routers send it nothing new; what it holds finishes), in a thread:
        restart_dead_nodes() stops it once drained (launch/removals.py)."""
        if node_id not in self.node_addresses:
            raise ValueError(f"no running node {node_id!r} (have {', '.join(self.node_addresses)})")
        if importers := self.importers_of(node_id):
            raise ValueError(f"{node_id} holds the weights mapped by {', '.join(importers)} on its GPU: remove "
                             f"those first")
        return self.removals.begin(node_id, self.node_addresses[node_id], self.routers.admin_urls)

    def importers_of(self, node_id: str) -> list[str]:
        """The running nodes that map the weights node_id published (they would stop with it)."""
        exported = self.weights.get(node_id)
        if exported is None or exported.holding != "export":
            return []
        return [other for other in self.node_addresses if other != node_id
                and self.weights[other].rendezvous == exported.rendezvous]

    def remove_node(self, node_id: str) -> None:
        """begin_removal(), then wait until the node is stopped; ValueError if its drain timed out (the node is
        back in service)."""
        wait_until_removed(self.begin_removal(node_id), self.end_removals)

    def end_removals(self) -> None:
        """Forget each node whose drain ended (every router forgot it) and stop it off this thread."""
        for removal in self.removals.take_drained():
            [process] = [process for name, process in self.processes if name == removal.node_id]
            self.processes = [(name, p) for name, p in self.processes if name != removal.node_id]
            address = self.node_addresses.pop(removal.node_id)
            for addresses in (self.prefill_addresses, self.decode_addresses, self.colocated_addresses):
                if address in addresses:
                    addresses.remove(address)
            stopping = threading.Thread(target=stop_removed, args=(removal, process), name=f"stop {removal.node_id}",
                                        daemon=True)
            stopping.start()
            self.stopping.append(stopping)

    def start_router(self) -> None:
        self.routers = RouterGroup(self.config, self.key_file, self.restarts)
        self.routers.start(self.pool_addresses)

    def spawn(self, name: str, argv: list[str], env: dict[str, str], where: str = "") -> None:
        logger.info("starting %s%s", name, where)
        self.argvs[name], self.envs[name] = argv, env
        self.processes.append((name, subprocess.Popen(argv, env=env)))
        self.restarts.started(name)

    def restart_dead_nodes(self) -> None:
        """Stop the nodes whose removal drained, then start again every process that exited (RestartPolicy:
        backoff, then giving up); raise if a router is given up on."""
        self.end_removals()
        self.routers.restart_dead(self.pool_addresses)
        for i, (name, process) in enumerate(self.processes):
            if process.poll() is None:
                continue
            decision = self.restarts.decide(name, f"exit code {process.returncode}")
            if decision == "give_up":
                self.routers.give_up(self.node_addresses[name])
            if decision != "restart":
                continue
            logger.warning("%s exited with code %s; starting it again", name, process.returncode)
            self.processes[i] = (name, subprocess.Popen(self.argvs[name], env=self.envs[name]))
            self.restarts.started(name)
            self.num_restarts += 1

    def wait_healthy(self) -> None:
        self.routers.wait_healthy(self.config.startup_timeout_s, self.check_alive)

    def healthy(self) -> bool:
        return self.routers.healthy()

    def check_alive(self) -> None:
        if self.routers is not None:
            self.routers.check_alive()
        for name, process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with code {process.returncode}")

    def stop(self, grace_s: float = launch.STOP_GRACE_S) -> None:
        self.removals.stop()
        # NOTE: the nodes first, as the Ray launcher does: a router's open streams then end at once (an error
        # event: their nodes are gone), where they would hold its graceful stop for the whole grace period
        for _, process in self.processes:
            if process.poll() is None:
                process.terminate()
        if self.routers is not None:
            self.routers.stop(grace_s)
        launch.stop_processes(self.processes, grace_s)
        self.processes.clear()
        for stopping in self.stopping:
            stopping.join()
        if self.key_file is not None:
            shutil.rmtree(self.key_file.parent, ignore_errors=True)
            self.key_file = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_removed(removal: Removal, process: subprocess.Popen, grace_s: float = launch.STOP_GRACE_S) -> None:
    launch.stop_processes([(removal.node_id, process)], grace_s)
    removal.finish("removed", "drained and stopped")


def serve_forever(config: ClusterConfig) -> int:
    """Run until SIGINT/SIGTERM or until the router dies (then exit non-zero)."""
    return serve_loop.serve_forever(LocalCluster(config), config)
