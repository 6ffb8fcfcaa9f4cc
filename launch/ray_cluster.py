"""`corun serve --launcher ray`: the prefill and decode servers on a Ray cluster, the router (or the K routers of
--routers K, launch/routers.py) on this (driver) host, where the cluster's port is.

Placement (RayClusterConfig, in launch/ray_config.py so that `corun serve`'s flags need no ray): one placement
group with one bundle per node ({"CPU": cpus_per_node}, plus {"GPU": 1} when the engine runs on CUDA and an
optional custom resource per role, so that prefill and decode can be pinned to host types), SPREAD over hosts by
default or PACKed. Each node is a NodeActor (launch/ray_node.py) in its bundle, running the node server as a
subprocess on that host and advertising the host's IP.

Health and restarts as in `corun serve` (launch/local.py): start() returns once the router's /health says every
node answers; restart_dead_nodes() starts an exited node process again on its actor, and replaces a dead actor by
a new one in the same bundle (same host, same port: the router's addresses stay valid). stop() stops the router
and the nodes, removes the placement group and shuts Ray down if start() initialized it.

Every host needs the same environment (the package and the model directory at the same paths), as with vLLM or
SGLang on Ray.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from launch import cluster as launch
from launch import serve_loop
from launch.cluster import Role
from launch.ray_config import LABEL_AMOUNT, PlacementStrategy, RayClusterConfig  # noqa: F401 (NOTE: re-exported)
from launch.ray_node import NodeActor
from launch.removals import Removal, Removals, wait_until_removed
from launch.restarts import RestartPolicy
from launch.routers import RouterGroup
from wire.node_auth import ClusterKey

logger = logging.getLogger(__name__)

_RemoteNodeActor = ray.remote(NodeActor)

PLACEMENT_PROGRESS_S = 10.0


def why_never_placed(bundles: list[dict[str, float]], strategy: PlacementStrategy,
                     hosts: list[dict[str, float]]) -> str | None:
    """Why these bundles cannot be placed on these hosts' total resources even with every host idle, or None.

    Catches what waiting cannot fix (a GPU node on a cluster without GPUs, a resource no host offers, STRICT_PACK
    beyond one host, more STRICT_SPREAD nodes than hosts); a placement that fits only once other jobs finish
    is left to wait."""
    def fits(bundle, host):
        return all(host.get(name, 0) >= amount for name, amount in bundle.items())

    for bundle in bundles:
        if not any(fits(bundle, host) for host in hosts):
            return (f"no host offers {bundle} (hosts: {hosts}); start hosts with what it needs, or lower "
                    f"--cpus-per-node")
    needed: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            needed[name] = needed.get(name, 0) + amount
    if strategy == "STRICT_PACK" and not any(fits(needed, host) for host in hosts):
        return f"STRICT_PACK needs {needed} on one host; no host offers that"
    if strategy == "STRICT_SPREAD" and len(hosts) < len(bundles):
        return f"STRICT_SPREAD needs a host per node: {len(bundles)} nodes, {len(hosts)} hosts"
    short = {name: amount for name, amount in needed.items() if sum(h.get(name, 0) for h in hosts) < amount}
    if short:
        return f"the cluster offers less than the nodes need of {sorted(short)}: needed {needed}"
    return None


@dataclass
class RayNode:
    role: Role
    index: int
    bundle_index: int
    actor: ray.actor.ActorHandle
    address: str = ""
    """tcp://HOST_IP:PORT, as the actor reported it."""
    placement_group: PlacementGroup | None = None
    """Its own group, for a node added at run time (bundle 0 of it); None: the cluster's group."""

    @property
    def name(self) -> str:
        return launch.node_id(self.role, self.index)


ACTOR_LOST = "actor lost"
"""A node's state when its actor died (its process went with it): see _node_states()."""


class RayCluster:
    def __init__(self, config: RayClusterConfig):
        self.config = config
        self.nodes: list[RayNode] = []
        self.routers: RouterGroup | None = None
        self.placement_group: PlacementGroup | None = None
        self.num_restarts = 0
        self.restarts = RestartPolicy()
        self.num_started = {"prefill": config.cluster.num_prefill, "decode": config.cluster.num_decode,
                            "colocated": config.cluster.num_colocated}
        """Nodes ever started per role: the next added node's index (ids are never reused)."""
        self._initialized_ray = False
        self.removals = Removals(config.cluster.drain_timeout_s, config.cluster.api_key)
        self.stopping: list[threading.Thread] = []
        """Threads stopping the actors of removed nodes (stop() waits for them)."""
        self.cluster_key: ClusterKey | None = None
        self.key_file: Path | None = None
        """The cluster's CURVE key pair: the router's copy here; each actor writes its node's on its own host."""

    @property
    def url(self) -> str:
        return f"http://{self.config.cluster.host}:{self.config.cluster.port}"

    @property
    def prefill_addresses(self) -> list[str]:
        return [node.address for node in self.nodes if node.role == "prefill"]

    @property
    def decode_addresses(self) -> list[str]:
        return [node.address for node in self.nodes if node.role == "decode"]

    @property
    def colocated_addresses(self) -> list[str]:
        return [node.address for node in self.nodes if node.role == "colocated"]

    def pool_addresses(self) -> tuple[list[str], list[str], list[str]]:
        return self.prefill_addresses, self.decode_addresses, self.colocated_addresses

    def start(self) -> RayCluster:
        self.cluster_key, self.key_file = launch.make_cluster_key()
        try:
            self._init_ray()
            self.placement_group = self._reserve()
            for bundle_index, (role, index) in enumerate(self.config.cluster.nodes()):
                self.nodes.append(RayNode(role, index, bundle_index, self._new_actor(role, index, bundle_index)))
            # NOTE: one get for all: the actors start in parallel
            addresses = ray.get([node.actor.address.remote() for node in self.nodes],
                                timeout=self.config.placement_timeout_s)
            for node, address in zip(self.nodes, addresses, strict=True):
                node.address = address
            self.routers = RouterGroup(self.config.cluster, self.key_file, self.restarts)
            self.routers.start(self.pool_addresses)
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _init_ray(self) -> None:
        if ray.is_initialized():  # NOTE: the caller's Ray session: leave it to the caller
            return
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        if self.config.address is None:
            ray.init(address="local", num_cpus=self.config.num_cpus, include_dashboard=False)
        else:
            ray.init(address=self.config.address)
        self._initialized_ray = True
        if threading.current_thread() is threading.main_thread():
            # NOTE: ray.init makes SIGTERM exit the driver at once; keep the caller's handlers (`corun serve`'s
            # stops the cluster and exits 0).
            for sig, handler in handlers.items():
                if handler is not None:  # NOTE: None: a handler set outside Python, which cannot be put back
                    signal.signal(sig, handler)

    def _reserve(self) -> PlacementGroup:
        bundles, strategy = self.config.bundles(), self.config.placement_strategy
        hosts = [node["Resources"] for node in ray.nodes() if node["Alive"]]
        if reason := why_never_placed(bundles, strategy, hosts):
            raise ValueError(f"Ray can never place this cluster ({len(bundles)} nodes, {strategy}): {reason}")
        group = placement_group(bundles, strategy=strategy, name="corun")
        deadline, placed = time.monotonic() + self.config.placement_timeout_s, group.ready()
        while True:  # NOTE: waits for resources other jobs hold; says so every few seconds
            ready, _ = ray.wait([placed], timeout=max(0.0, min(PLACEMENT_PROGRESS_S, deadline - time.monotonic())))
            if ready:
                break
            if time.monotonic() >= deadline:
                remove_placement_group(group)
                raise launch.StartupError(f"Ray could not place {bundles} ({strategy}) in "
                                          f"{self.config.placement_timeout_s} s; the cluster has "
                                          f"{ray.available_resources()} free")
            logger.info("waiting for Ray to place %d bundles (%s); free now: %s", len(bundles), strategy,
                        ray.available_resources())
        logger.info("placement group ready: %d bundles, %s", len(bundles), strategy)
        return group

    def add_node(self, role: Role) -> str:
        """One more node of this role, in a placement group of its own (one bundle), added to the router's pool;
        -> its id."""
        index = self.num_started[role]
        group = placement_group([self.config.node_resources(role)], name=f"corun-{launch.node_id(role, index)}")
        try:
            ray.get(group.ready(), timeout=self.config.placement_timeout_s)
            node = RayNode(role, index, 0, self._new_actor(role, index, 0, group=group), placement_group=group)
            node.address = ray.get(node.actor.address.remote(), timeout=self.config.placement_timeout_s)
        except BaseException:
            remove_placement_group(group)
            raise
        self.num_started[role] = index + 1
        self.nodes.append(node)
        self.routers.add_node(role, node.address)
        return node.name

    def node_address(self, node_id: str) -> str | None:
        """The running node's address, None for no such node."""
        return next((node.address for node in self.nodes if node.name == node_id), None)

    def begin_removal(self, node_id: str) -> Removal:
        """Drain the node in every router (nothing new; what it holds finishes), in a thread: restart_dead_nodes()
        stops its actor once drained (launch/removals.py)."""
        node = next((n for n in self.nodes if n.name == node_id), None)
        if node is None:
            raise ValueError(f"no running node {node_id!r} (have {', '.join(n.name for n in self.nodes)})")
        return self.removals.begin(node_id, node.address, self.routers.admin_urls)

    def remove_node(self, node_id: str) -> None:
        """begin_removal(), then wait until the node is stopped; ValueError if its drain timed out (the node is
        back in service)."""
        wait_until_removed(self.begin_removal(node_id), self.end_removals)

    def end_removals(self) -> None:
        """Forget each node whose drain ended and stop its actor off this thread."""
        for removal in self.removals.take_drained():
            node = next(n for n in self.nodes if n.name == removal.node_id)
            self.nodes.remove(node)
            stopping = threading.Thread(target=self._stop_removed, args=(removal, node), daemon=True,
                                        name=f"stop {removal.node_id}")
            stopping.start()
            self.stopping.append(stopping)

    def _stop_removed(self, removal: Removal, node: RayNode, grace_s: float = launch.STOP_GRACE_S) -> None:
        self._release(node, node.actor.stop.remote(grace_s), grace_s)
        removal.finish("removed", "drained and stopped")

    def _new_actor(self, role: Role, index: int, bundle_index: int, port: int | None = None,
                   group: PlacementGroup | None = None):
        resources = dict(self.config.node_resources(role))
        num_cpus, num_gpus = resources.pop("CPU"), resources.pop("GPU", 0)
        strategy = PlacementGroupSchedulingStrategy(group or self.placement_group,
                                                    placement_group_bundle_index=bundle_index)
        # NOTE: without the API keys: nodes never need them, and Ray stores an actor's arguments.
        cluster = dataclasses.replace(self.config.cluster, api_key=None, client_api_keys_file=None)
        share = self.config.gpus_per_node  # NOTE: roles sharing a GPU are Ray's choice: an equal part each
        engine = launch.node_engine(cluster, role, max(1, int(self.config.cpus_per_node)),
                                    (max(1, round(1 / share)), share))
        # NOTE: max_restarts=0: a dead actor is replaced by restart_dead_nodes(), which keeps its port.
        options = dict(num_cpus=num_cpus, num_gpus=num_gpus, resources=resources, scheduling_strategy=strategy,
                       max_restarts=0)
        # NOTE: the key travels to the actor over Ray's own (token-authenticated) channel, never on a command line
        return _RemoteNodeActor.options(**options).remote(cluster, engine, role, index, self.config.node_host, port,
                                                          self.cluster_key)

    def wait_healthy(self) -> None:
        self.routers.wait_healthy(self.config.cluster.startup_timeout_s, self.check_alive)

    def check_alive(self) -> None:
        self.routers.check_alive()
        for node, state in zip(self.nodes, self._node_states(), strict=True):
            if state is not None:
                raise RuntimeError(f"{node.name} exited ({state})")

    def restart_dead_nodes(self) -> None:
        """Start again every node whose process exited (on its actor) or whose actor died (a new actor in the
        same bundle, on the same port), and every router that exited (launch/routers.py); raise if a router is
        given up on."""
        self.end_removals()
        self.routers.restart_dead(self.pool_addresses)
        for node, state in zip(self.nodes, self._node_states(), strict=True):
            decision = None if state is None else self.restarts.decide(node.name, str(state))
            if decision == "give_up":
                self.routers.give_up(node.address)
            if decision != "restart":
                continue
            logger.warning("%s at %s exited (%s); starting it again", node.name, node.address, state)
            if state == ACTOR_LOST:
                self._replace_actor(node)
            else:
                ray.get(node.actor.restart.remote())
            self.restarts.started(node.name)
            self.num_restarts += 1

    def _node_states(self) -> list[int | str | None]:
        """Per node: None while its process runs, its exit code once it exited, ACTOR_LOST when its actor died."""
        refs = [node.actor.returncode.remote() for node in self.nodes]
        states = []
        for ref in refs:
            try:
                states.append(ray.get(ref, timeout=30))
            except ray.exceptions.ActorUnavailableError:
                states.append(None)  # NOTE: unreachable for now (e.g. its host is restarting); ask again later
            except ray.exceptions.RayActorError:
                states.append(ACTOR_LOST)
        return states

    def _replace_actor(self, node: RayNode) -> None:
        ray.kill(node.actor, no_restart=True)
        port = int(node.address.rsplit(":", 1)[1])
        node.actor = self._new_actor(node.role, node.index, node.bundle_index, port, node.placement_group)
        address = ray.get(node.actor.address.remote(), timeout=self.config.placement_timeout_s)
        if address != node.address:
            # NOTE: the bundle moved to another host (its host died); the router knows nodes by address.
            raise RuntimeError(f"{node.name} came back at {address}, not {node.address}; restart the cluster")

    def stop(self, grace_s: float = launch.STOP_GRACE_S) -> None:
        self.removals.stop()
        for removed in self.stopping:
            removed.join()
        stopping = [node.actor.stop.remote(grace_s) for node in self.nodes]
        if self.routers is not None:
            self.routers.stop(grace_s)
            self.routers = None
        for node, ref in zip(self.nodes, stopping, strict=True):
            self._release(node, ref, grace_s)
        self.nodes.clear()
        if self.placement_group is not None:
            remove_placement_group(self.placement_group)
            self.placement_group = None
        if self._initialized_ray:
            ray.shutdown()
            self._initialized_ray = False
        if self.key_file is not None:
            shutil.rmtree(self.key_file.parent, ignore_errors=True)
            self.key_file = None

    @staticmethod
    def _release(node: RayNode, stopping: ray.ObjectRef, grace_s: float) -> None:
        """Once the node's stop (already asked) returned or timed out: end its actor and free its own group."""
        try:
            ray.get(stopping, timeout=grace_s + 5)
        except ray.exceptions.RayError as error:
            logger.warning("%s did not stop cleanly: %s", node.name, error)
        ray.kill(node.actor, no_restart=True)
        if node.placement_group is not None:
            remove_placement_group(node.placement_group)

    def __enter__(self) -> RayCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_forever(config: RayClusterConfig) -> int:
    """Run until SIGINT/SIGTERM or until the router dies (then exit non-zero)."""
    return serve_loop.serve_forever(RayCluster(config), config.cluster)
