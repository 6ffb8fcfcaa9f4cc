"""NodeActor: one prefill or decode server, run as a subprocess of a Ray actor on the host Ray placed the actor on.

The actor picks a free port on its host, has the node bind `node_host` (0.0.0.0 by default) and advertise the
host's IP, and reports the address back: the router (on the driver's host) and the decode nodes (which connect to
the prefill node named in a KV handle) reach it from other hosts. The node runs with the actor's interpreter and
environment, so on a CUDA cluster it sees the one GPU Ray gave the actor (CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import logging
import subprocess

import ray

from launch import cluster as launch
from launch.cluster import ClusterConfig, Role
from wire.config import EngineConfig
from wire.node_auth import ClusterKey
from wire.supervision import make_owned_dir

logger = logging.getLogger(__name__)

KEY_DIR_PREFIX = "corun-node-key-"
"""A node's copy of the cluster key, in KEY_DIR_PREFIX{actor pid}-XXXX on its host (removed at stop, or by the next
actor once this one died)."""


class NodeActor:
    """Wrapped with ray.remote(...).options(...) by RayCluster, which gives it its bundle of the placement group."""

    def __init__(self, config: ClusterConfig, engine: EngineConfig, role: Role, index: int, node_host: str,
                 port: int | None = None, key: ClusterKey | None = None):
        """port: None picks a free one on this host; a replacement actor asks for its predecessor's. key: the
        cluster's, written to a private file on this host for the node process."""
        self.name = launch.node_id(role, index)
        self.ip = ray.util.get_node_ip_address()
        self.port = port or launch.free_port(node_host)
        self.key_dir = make_owned_dir(KEY_DIR_PREFIX)
        key_file = None if key is None else key.save(self.key_dir / "cluster.key")
        self.argv = launch.node_argv(config, engine, role, index, node_host, self.port, advertise_host=self.ip,
                                     key_file=key_file)
        self.process = self._spawn()

    def address(self) -> str:
        return f"tcp://{self.ip}:{self.port}"

    def returncode(self) -> int | None:
        """None while the node process runs."""
        return self.process.poll()

    def pid(self) -> int:
        return self.process.pid

    def restart(self) -> None:
        """Start the node again on the same port (its address stays the router's)."""
        self.stop()
        self.process = self._spawn()

    def stop(self, grace_s: float = launch.STOP_GRACE_S) -> None:
        launch.stop_processes([(self.name, self.process)], grace_s)

    def _spawn(self) -> subprocess.Popen:
        logger.info("starting %s on %s", self.name, self.address())
        # NOTE: the node stays in the actor worker's process group, and Ray ends it with the worker (ray.kill or a
        # SIGKILL, measured on Ray 2.60), so no orphan keeps the port a replacement actor binds again (tested).
        return subprocess.Popen(self.argv, env=launch.node_environment())
