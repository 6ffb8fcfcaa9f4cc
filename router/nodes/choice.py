"""The instance choice: which node of a role takes a request, given the request.

NodePool asks its ChoicePolicy, handing it the nodes of the role and the request as a RoutedRequest (its id, its
prompt's token ids, its samples, its pins), so that a policy may route on the prompt (prefix-aware routing: the
node that holds its KV). A pinned request never reaches the policy: the pool takes the node it names.

Today's policy, the default (LeastOutstandingWork): least outstanding work (prefill: prompt tokens not yet answered;
decode and colocated: samples not yet finished), ties to the lowest index. Nodes that answered a recent ping are
preferred over silent ones; draining nodes get no new requests. A request goes to the least loaded colocated node
unless a decode node has less outstanding work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from router.nodes.client import NodeClient


@dataclass(frozen=True)
class Placement:
    """Node ids a request is pinned to (X-CoRun-Prefill-Node / X-CoRun-Decode-Node), for tests and debugging."""

    prefill: str | None = None
    decode: str | None = None


@dataclass(frozen=True)
class RoutedRequest:
    """What the instance choice sees of a request."""

    request_id: str
    """The id the nodes know this attempt by (a retry's carries its attempt: router/generation/pipeline.py)."""
    prompt_token_ids: Sequence[int]
    """NOTE: the caller's list, never a copy: a prompt may be long, and a choice only reads it."""
    n: int = 1
    """Samples of the prompt: the decode (or colocated) node decodes them all."""
    placement: Placement = Placement()


class ChoicePolicy(Protocol):
    """How NodePool chooses among the nodes that may take a request; NoNodeAvailable when none may."""

    def choose_prefill(self, nodes: list[NodeClient], request: RoutedRequest) -> NodeClient:
        """The prefill node, of nodes (the pool's prefill nodes)."""

    def choose_decode(self, nodes: list[NodeClient], request: RoutedRequest) -> NodeClient:
        """The decode node, of nodes (the pool's decode nodes), once the prompt is prefilled."""

    def choose_colocated(self, prefill: list[NodeClient], decode: list[NodeClient], colocated: list[NodeClient],
                         request: RoutedRequest) -> NodeClient | None:
        """The colocated node the request goes to, or None for the prefill -> decode path (the pool's nodes of each
        role)."""


class LeastOutstandingWork:
    """The default policy: the least loaded node (least_loaded); the colocated path unless a decode node has less
    outstanding work than the least loaded colocated node. The request itself changes nothing."""

    def choose_prefill(self, nodes: list[NodeClient], request: RoutedRequest) -> NodeClient:
        return least_loaded(nodes)

    def choose_decode(self, nodes: list[NodeClient], request: RoutedRequest) -> NodeClient:
        return least_loaded(nodes)

    def choose_colocated(self, prefill: list[NodeClient], decode: list[NodeClient], colocated: list[NodeClient],
                         request: RoutedRequest) -> NodeClient | None:
        candidates = [node for node in colocated if not node.draining]
        open_decode = [node for node in decode if not node.draining]
        disaggregated = bool(open_decode) and any(not node.draining for node in prefill)
        if disaggregated:
            # NOTE: a lost colocated node's retry goes to the P/D path rather than back to it
            candidates = [node for node in candidates if node.healthy]
        if not candidates:
            if disaggregated or not colocated:
                return None
            least_loaded(colocated)  # NOTE: raises NoNodeAvailable: every colocated node is draining
        best = least_loaded(candidates)
        if disaggregated and least_loaded(open_decode).outstanding_work < best.outstanding_work:
            return None
        return best


DEFAULT_POLICY = LeastOutstandingWork()
"""What a NodePool chooses by unless given another policy."""


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


class UnknownNode(ValueError):
    pass


def pick(nodes: list[NodeClient], node_id: str) -> NodeClient:
    """The node whose id (from its Pong) or address is node_id."""
    for node in nodes:
        pong = node.status().pong
        if node_id == node.address or (pong is not None and pong.node_id == node_id):
            return node
    raise UnknownNode(f"no {nodes[0].role if nodes else 'such'} node {node_id!r}")
