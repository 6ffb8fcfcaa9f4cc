"""RayClusterConfig: where `corun serve --launcher ray` places the cluster's nodes (launch/ray_cluster.py places
them).

Imports no ray: `corun serve`'s flags are generated from this config in every venv, .venv-vllm's (no Ray) too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from launch.cluster import ClusterConfig, Role
from wire.flags import flag

PlacementStrategy = Literal["SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK"]
LABEL_AMOUNT = 0.001
"""What one node asks of its role's custom resource. NOTE: a selector, not a limit: a host started with
`--resources '{"corun_prefill": 1}'` can take up to 1000 prefill nodes (CPUs and GPUs bound the count)."""
_RESERVED_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


@dataclass(frozen=True)
class RayClusterConfig:
    """A cluster on Ray: its nodes in one placement group, its routers on the driver's host."""

    cluster: ClusterConfig
    """What runs (`corun serve`'s other flags)."""
    address: str | None = field(default=None, metadata=flag("--ray-address"))
    """"auto" (the cluster `ray start` made on this host), "ray://HOST:10001" (Ray Client) or "HOST:6379" (the
    head's GCS); None starts a local Ray head (one host: tests) and shuts it down on stop()."""
    placement_strategy: PlacementStrategy = "SPREAD"
    """How the nodes' bundles are laid over hosts (Ray placement group strategies)."""
    cpus_per_node: float = 1.0
    """CPUs each node reserves; a CPU node computes with that many threads unless the engine names a count."""
    gpus_per_node: float = 1.0
    """--device cuda: the share of a GPU each node reserves; a fraction (e.g. 0.5) lets nodes share a GPU, each
    with its own KV budget (--prefill-kv-cache-mib / --decode-kv-cache-mib)."""
    prefill_resource: str | None = None
    """A custom resource the prefill nodes need (e.g. "corun_prefill"): they go only to hosts that offer it."""
    decode_resource: str | None = None
    """As prefill_resource, for the decode nodes."""
    node_host: str = "0.0.0.0"
    """Interface each node binds on its host; it advertises the host's IP (ray.util.get_node_ip_address())."""
    num_cpus: int | None = None
    """Local head only (address None): the CPUs it offers; None: the host's."""
    placement_timeout_s: float = 120.0
    """How long the placement group (and a replacement actor) may wait for resources."""

    def __post_init__(self):
        if self.placement_strategy not in get_args(PlacementStrategy):
            raise ValueError(f"placement_strategy must be one of {', '.join(get_args(PlacementStrategy))}, "
                             f"got {self.placement_strategy!r}")
        if not self.cpus_per_node > 0:
            raise ValueError(f"cpus_per_node must be > 0, got {self.cpus_per_node}")
        if not 0 < self.gpus_per_node <= 1:
            raise ValueError(f"gpus_per_node must be in (0, 1] (a node runs on one GPU), got {self.gpus_per_node}")
        if self.cluster.prefill_gpus or self.cluster.decode_gpus or self.cluster.colocated_gpus:
            raise ValueError("on Ray, Ray picks each node's GPU: use --gpus-per-node, not --prefill-gpus/--decode-gpus/"
                             "--colocated-gpus")
        if not self.placement_timeout_s > 0:
            raise ValueError(f"placement_timeout_s must be > 0, got {self.placement_timeout_s}")
        check_address(self.address)
        if self.num_cpus is not None and (self.address is not None or self.num_cpus < 1):
            raise ValueError(f"num_cpus ({self.num_cpus}) needs address None (a local head) and must be >= 1")
        for resource in (self.prefill_resource, self.decode_resource):
            if resource is not None and (not resource or resource in _RESERVED_RESOURCES):
                raise ValueError(f"a node resource must be a custom resource name, got {resource!r}")
        device = self.cluster.engine.device
        if device.startswith("cuda") and device not in ("cuda", "cuda:0"):
            raise ValueError(f"on Ray each node sees only the GPU Ray gives it: use device 'cuda', not {device!r}")

    @property
    def num_gpus_per_node(self) -> float:
        return self.gpus_per_node if self.cluster.engine.device.startswith("cuda") else 0

    def node_resources(self, role: Role) -> dict[str, float]:
        """What one node of this role reserves: its bundle, and what its actor asks of it."""
        resources = {"CPU": self.cpus_per_node}
        if self.num_gpus_per_node:
            resources["GPU"] = self.num_gpus_per_node
        label = self.prefill_resource if role == "prefill" else self.decode_resource
        if label is not None:
            resources[label] = LABEL_AMOUNT
        return resources

    def bundles(self) -> list[dict[str, float]]:
        """One per node, in ClusterConfig.nodes() order (the bundle index of a node is its place there)."""
        return [self.node_resources(role) for role, _ in self.cluster.nodes()]


def check_address(address: str | None) -> None:
    if address is None or address == "auto" or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"Ray address must be 'auto', 'ray://HOST:PORT' or 'HOST:PORT', got {address!r}")
