"""The instance choice: which node of a role takes a request.

Least outstanding work (prefill: prompt tokens not yet answered; decode and colocated: samples not yet
finished), ties to the lowest index. Nodes that answered a recent ping are preferred over silent ones; draining
nodes get no new requests. A request goes to the least loaded colocated node unless a decode node has less
outstanding work (NodePool.choose_colocated).
"""

from __future__ import annotations

from dataclasses import dataclass

from router.nodes.client import NodeClient


def least_loaded(nodes: list[NodeClient]) -> NodeClient:
    """Least outstanding work among healthy nodes (all nodes when none is), ties to the lowest index; never a
    draining node."""
    open_nodes = [node for node in nodes if not node.draining]
    if not open_nodes:
        raise NoNodeAvailable(f"every {nodes[0].role} node is draining" if nodes else "no node of that role")
    candidates = [node for node in open_nodes if node.healthy] or open_nodes
    return min(candidates, key=lambda node: (node.outstanding_work, node.index))


class NoNodeAvailable(ValueError):
    """No node of a role may take a new request (all draining): the request gets a 503."""


@dataclass(frozen=True)
class Placement:
    """Node ids a request is pinned to (X-CoRun-Prefill-Node / X-CoRun-Decode-Node), for tests and debugging."""

    prefill: str | None = None
    decode: str | None = None


class UnknownNode(ValueError):
    pass


def pick(nodes: list[NodeClient], node_id: str) -> NodeClient:
    """The node whose id (from its Pong) or address is node_id."""
    for node in nodes:
        pong = node.status().pong
        if node_id == node.address or (pong is not None and pong.node_id == node_id):
            return node
    raise UnknownNode(f"no {nodes[0].role if nodes else 'such'} node {node_id!r}")
