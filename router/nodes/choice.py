"""The instance choice: which node of a role takes a request, given the request.

NodePool asks its ChoicePolicy, handing it the nodes of the role and the request as a RoutedRequest (its id, its
prompt's token ids, its samples, its pins), so that a policy may route on the prompt (prefix-aware routing: the
node that holds its KV). A pinned request never reaches the policy: the pool takes the node it names.

Today's policy, the default (LeastOutstandingWork): least outstanding work (prefill: prompt tokens not yet answered;
decode and colocated: samples not yet finished), ties to the lowest index. Nodes that answered a recent ping are
preferred over silent ones; draining nodes get no new requests. A request goes to the least loaded colocated node
unless a decode node has less outstanding work.

Placement comes first (holders): a node whose Pong says it cannot hold the request at once (n samples beyond its
decode rows, their KV beyond its blocks) is never offered to the policy, and a request no node of a role can hold
is NotPlaceable (a 400 naming the limit), known before any prefill (NodePool.check_placeable).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from router.nodes.client import NodeClient
from wire.protocol import NodeCapacity


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
    max_tokens: int = 0
    """Tokens each sample may generate: its KV reservation on the decode node, beside the prompt's."""


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


def holders(nodes: list[NodeClient], request: RoutedRequest) -> list[NodeClient]:
    """The nodes that can hold the request's samples at once; NotPlaceable, naming the largest node's limit, when
    there are nodes and none can."""
    fitting = [node for node in nodes if can_hold(node, request)]
    if nodes and not fitting:
        largest = max(nodes, key=lambda n: (n.capacity.max_num_seqs, n.capacity.num_kv_blocks))
        raise NotPlaceable(placement_limit(largest.capacity, request, largest.role))
    return fitting


def can_hold(node: NodeClient, request: RoutedRequest) -> bool:
    """From the node's latest Pong; a node that has not told its capacity may (it judges the request itself)."""
    return node.capacity is None or not placement_limit(node.capacity, request, node.role)


def placement_limit(capacity: NodeCapacity, request: RoutedRequest, role: str) -> str:
    """Why a node of this capacity cannot hold the request's n samples at once ("" when it can)."""
    if request.n > capacity.max_num_seqs:
        return (f"n = {request.n} samples cannot be placed: the {role} nodes decode at most "
                f"{capacity.max_num_seqs} sequences at once (max_num_seqs), so n must be <= {capacity.max_num_seqs}")
    num_tokens = len(request.prompt_token_ids) + request.max_tokens
    # NOTE: a decode node reserves every sample's KV at admission; a colocated node prefills and admits each alone
    num_blocks = (request.n if role == "decode" else 1) * -(-num_tokens // capacity.block_size)
    if num_blocks > capacity.num_kv_blocks:
        return (f"n = {request.n} samples of up to {num_tokens} tokens cannot be placed: they need {num_blocks} KV "
                f"blocks, the {role} nodes hold at most {capacity.num_kv_blocks}")
    return ""


class NotPlaceable(ValueError):
    """No node of the pool can ever hold the request (its n samples, their KV): a 400, before any prefill."""


class NoNodeAvailable(ValueError):
    """No node of a role may take a new request (all draining): the request gets a 503."""


class UnknownNode(ValueError):
    pass


def pick(nodes: list[NodeClient], node_id: str) -> NodeClient:
    """The node whose id (from its Pong) or address is node_id."""
    for node in nodes:
        pong = node.latest_pong
        if node_id == node.address or (pong is not None and pong.node_id == node_id):
            return node
    raise UnknownNode(f"no {nodes[0].role if nodes else 'such'} node {node_id!r}")
