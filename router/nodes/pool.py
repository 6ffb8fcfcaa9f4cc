"""Every node of the cluster: one NodeClient per node (router/nodes/client.py), their ping loop, what they agree
on of the model, and the instance choice (router/nodes/choice.py).

Membership changes at run time (router/api/admin.py): a node is added, drained (no new requests; what it holds
finishes), and removed once drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass

import zmq.asyncio

from router.nodes.choice import ChoicePolicy, RoutedRequest, UnknownNode, can_hold, holders, pick
from router.nodes.client import NodeClient, NodeStatus
from router.nodes.prefix_routing import make_policy
from wire.config import Role, RouterConfig
from wire.node_auth import ClusterKey
from wire.protocol import InstanceGone, ModelFacts, Ping, Pong, PrefixCacheReset

logger = logging.getLogger(__name__)

PING_INTERVAL_S = 1.0
FIRST_PING_INTERVAL_S = 0.1
"""Until every node has answered once (connections come up asynchronously), ping faster: /health turns 200
within a fraction of a second of the nodes being up."""


class NodePool:
    """Every node of the cluster, their ping loop and the instance choice (policy: a ChoicePolicy)."""

    def __init__(self, config: RouterConfig, policy: ChoicePolicy | None = None):
        """policy: None, the one config.routing_policy names."""
        self.request_timeout_s = config.request_timeout_s
        self.policy = policy if policy is not None else make_policy(config.routing_policy)
        self._context = zmq.asyncio.Context()
        self.key = None if config.cluster_key_file is None else ClusterKey.load(config.cluster_key_file)
        self.by_role: dict[Role, list[NodeClient]] = {
            role: [self._client(role, index, address) for index, address in enumerate(addresses)]
            for role, addresses in (("prefill", config.prefill_addresses), ("decode", config.decode_addresses),
                                    ("colocated", config.colocated_addresses))}
        self._ping_task: asyncio.Task | None = None
        self._nonces = itertools.count()
        self._identity: PoolIdentity | None = None
        self._identity_key: tuple | None = None
        self.closing = False
        """The router is stopping (begin_closing): a failed request is not tried again."""

    @property
    def prefill_nodes(self) -> list[NodeClient]:
        return self.by_role["prefill"]

    @property
    def decode_nodes(self) -> list[NodeClient]:
        return self.by_role["decode"]

    @property
    def colocated_nodes(self) -> list[NodeClient]:
        return self.by_role["colocated"]

    @property
    def nodes(self) -> list[NodeClient]:
        return [*self.prefill_nodes, *self.decode_nodes, *self.colocated_nodes]

    async def start(self) -> None:
        for node in self.nodes:
            node.start()
        self._ping_task = asyncio.create_task(self._ping_loop(), name="ping nodes")

    def begin_closing(self) -> None:
        """The router stops: its open requests run on, but one that fails ends with its error at once. NOTE: a
        launcher stops the nodes before their routers (launch/local.py, LocalCluster.stop), so the requests open then
        fail; a retry would wait UNREACHABLE_AFTER_S for each of two more attempts on nodes that are not coming
        back, holding the router's stop (and its SIGTERM grace) ~7 s."""
        self.closing = True
        for node in self.nodes:
            node.router_closing = True

    async def close(self) -> None:
        if self._ping_task is not None:
            self._ping_task.cancel()
            await asyncio.gather(self._ping_task, return_exceptions=True)
        await asyncio.gather(*(node.close() for node in self.nodes))
        self._context.term()

    def add(self, role: Role, address: str) -> NodeClient:
        """A new node of the pool (call from the event loop); it takes requests once it answers a ping."""
        nodes = self.by_role[role]
        if any(node.address == address for node in self.nodes):
            raise ValueError(f"{address} is already a node of this pool")
        node = self._client(role, max((n.index for n in nodes), default=-1) + 1, address)
        node.start()
        nodes.append(node)
        return node

    def _client(self, role: Role, index: int, address: str) -> NodeClient:
        return NodeClient(self._context, role, index, address, self.key, instance_gone=self._instance_gone)

    def _instance_gone(self, node: NodeClient, gone: Pong) -> None:
        """A decode node's process is gone (NodeClient._take_pong): every prefill node ends the leases it claimed
        now, not at their deadline (kv_lease_seconds after the claim). NOTE: a prefill node unreachable now misses
        the notice; its leases of that process then end by their deadline, as before."""
        if node.role != "decode":
            return  # NOTE: only decode nodes claim leases
        logger.info("%s node %s: instance %s is gone (another answered on %s): its claimed KV leases are released",
                    node.role, gone.node_id, gone.instance_id[:8], node.address)
        for prefill in self.prefill_nodes:
            prefill.post(InstanceGone(gone.node_id, gone.instance_id))

    def find(self, address: str) -> NodeClient:
        for node in self.nodes:
            if node.address == address:
                return node
        raise UnknownNode(f"no node at {address!r}")

    async def remove(self, address: str) -> None:
        """Drop a drained node; ValueError if it still holds work or is the last of its role."""
        node = self.find(address)
        nodes = self.by_role[node.role]
        if not node.is_drained():
            raise ValueError(f"{address} is not drained yet: drain it and wait until it holds nothing")
        nodes.remove(node)
        await node.close()

    def choose_prefill(self, request: RoutedRequest) -> NodeClient:
        pinned = request.placement.prefill
        return self.pinned_prefill(pinned) if pinned else self.policy.choose_prefill(self.prefill_nodes, request)

    def check_placeable(self, request: RoutedRequest) -> None:
        """NotPlaceable (naming the limit) when no decode or colocated node can hold the request's samples at once:
        known from the nodes' Pongs, before any prefill."""
        pinned = request.placement.decode
        holders([self.pinned_decode(pinned)] if pinned else [*self.decode_nodes, *self.colocated_nodes], request)

    def choose_decode(self, request: RoutedRequest) -> NodeClient:
        """A decode node that can hold the request, or (pinned only) a colocated one; NotPlaceable if none can."""
        pinned = request.placement.decode
        if pinned:
            return holders([self.pinned_decode(pinned)], request)[0]
        return self.policy.choose_decode(holders(self.decode_nodes, request), request)

    def choose_colocated(self, request: RoutedRequest) -> NodeClient | None:
        """The colocated node a request goes to, or None for the prefill -> decode path: the policy's choice,
        unless the request is pinned (to a colocated node, or to P/D nodes)."""
        placement = request.placement
        if placement.prefill or placement.decode:
            pinned = self.pinned_decode(placement.decode) if placement.decode else None
            return pinned if pinned is not None and pinned.role == "colocated" else None
        decode, colocated = ([node for node in nodes if can_hold(node, request)]
                             for nodes in (self.decode_nodes, self.colocated_nodes))
        return self.policy.choose_colocated(self.prefill_nodes, decode, colocated, request)

    def pinned_prefill(self, node_id: str) -> NodeClient:
        """The prefill node whose id (from its Pong) or address is node_id; UnknownNode if none."""
        return pick(self.prefill_nodes, node_id)

    def pinned_decode(self, node_id: str) -> NodeClient:
        """The decode node, or colocated one, whose id or address is node_id; UnknownNode if none."""
        return pick(self.decode_nodes + self.colocated_nodes, node_id)

    def statuses(self) -> list[NodeStatus]:
        now = time.monotonic()
        return [node.status(now) for node in self.nodes]

    def identity(self) -> PoolIdentity:
        """What the nodes' latest Pongs say of the model and their fingerprints. Every request asks (its limits, its
        system_fingerprint): read again from the Pongs only when a node was added or removed or one reported other
        facts or another fingerprint (NodeClient.identity_version)."""
        key = tuple((node, node.identity_version) for node in self.nodes)
        if key != self._identity_key:
            self._identity, self._identity_key = read_identity(self.nodes), key
        return self._identity

    def model_facts(self) -> ModelFacts | None:
        """What the nodes report of the model (None before any answered); PoolMismatch if they disagree."""
        identity = self.identity()
        if identity.mismatch is not None:
            raise PoolMismatch(identity.mismatch)
        return identity.facts

    async def learned_model_facts(self, timeout_s: float) -> ModelFacts | None:
        """model_facts() once a node has answered (None if none did within timeout_s).

        NOTE: not once every node has: a node that never comes up must not delay every request."""
        facts = self.model_facts()
        if facts is not None:  # NOTE: every request asks; once a node answered, no task, no timer
            return facts
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._until_one_answered(), timeout_s)
        return self.model_facts()

    async def _until_one_answered(self) -> None:
        while all(node.latest_pong is None for node in self.nodes):
            await asyncio.sleep(0.02)

    async def wait_until_healthy(self, timeout_s: float) -> None:
        """For direct (non-HTTP) users: wait for every node's first Pong."""
        await asyncio.wait_for(self._until_all_healthy(), timeout_s)

    async def _until_all_healthy(self) -> None:
        while not all(node.healthy for node in self.nodes):
            await asyncio.sleep(0.05)

    async def refresh_stats(self, timeout_s: float) -> None:
        """Ping every healthy node now and wait (at most timeout_s) for their Pongs: /metrics then reports the
        nodes' stats as of this request, as vLLM's engine gauges and counters are (not up to a ping interval old)."""
        asked = time.monotonic()
        nonce = next(self._nonces)
        nodes = [node for node in self.nodes if node.healthy]
        for node in nodes:
            node.post(Ping(nonce))
        deadline = asked + timeout_s
        while any((node.latest_pong_time or 0.0) < asked for node in nodes) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    async def reset_prefix_caches(self, timeout_s: float) -> dict[NodeClient, PrefixCacheReset | None]:
        """Every prefill and colocated node forgets its cached prompt chunks (vLLM's /reset_prefix_cache): each
        node's answer, None for one that gave none within timeout_s."""
        nonce = next(self._nonces)
        nodes = self.prefill_nodes + self.colocated_nodes
        answers = await asyncio.gather(*(node.reset_prefix_cache(nonce, timeout_s) for node in nodes))
        return dict(zip(nodes, answers, strict=True))

    async def _ping_loop(self) -> None:
        while True:
            nonce = next(self._nonces)
            for node in self.nodes:
                node.post(Ping(nonce))
            all_answered = all(node.latest_pong is not None for node in self.nodes)
            await asyncio.sleep(PING_INTERVAL_S if all_answered else FIRST_PING_INTERVAL_S)


@dataclass(frozen=True)
class PoolIdentity:
    """What the nodes that answered agree on (NodePool.identity)."""

    facts: ModelFacts | None
    """The model as every node reports it; None before any answered, or when they disagree."""
    mismatch: str | None
    """What two nodes disagree on (PoolMismatch's message); None if nothing."""
    fingerprints: frozenset[str]


def read_identity(nodes: list[NodeClient]) -> PoolIdentity:
    pongs = [pong for pong in (node.latest_pong for node in nodes) if pong is not None]
    fingerprints = frozenset(pong.fingerprint for pong in pongs)
    if not pongs:
        return PoolIdentity(None, None, fingerprints)
    try:
        return PoolIdentity(agreed_model_facts(pongs), None, fingerprints)
    except PoolMismatch as mismatch:
        return PoolIdentity(None, str(mismatch), fingerprints)


class PoolMismatch(ValueError):
    """The pool's nodes disagree on a model fact or their fingerprint: no request can be served consistently."""


def agreed_model_facts(pongs: list[Pong]) -> ModelFacts:
    """The facts (and fingerprint) every node reports; PoolMismatch names the first field two disagree on."""
    first = pongs[0]
    for pong in pongs[1:]:
        for name in ModelFacts.__struct_fields__:
            ours, theirs = getattr(first.model_facts, name), getattr(pong.model_facts, name)
            if ours != theirs:
                raise PoolMismatch(f"the nodes disagree on {name}: {first.node_id} has {ours}, "
                                   f"{pong.node_id} has {theirs}")
        if pong.fingerprint != first.fingerprint:
            raise PoolMismatch(f"the nodes disagree on fingerprint: {first.node_id} has {first.fingerprint}, "
                               f"{pong.node_id} has {pong.fingerprint}")
    return first.model_facts
