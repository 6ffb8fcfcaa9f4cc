"""prefix_aware routing (RouterSettings.routing_policy): a prompt goes to the prefill (or colocated) node its
longest full-chunk prefix was last sent to, which likely holds that prefix's KV in its prefix cache
(corun/prefix_cache.py), unless that node is busier than the least loaded one by more than the prefill the hit
would save.

The router holds no KV and asks no node what it caches: it remembers, in a bounded LRU map, the hash chain of each
prompt's full chunks (wire/prefix_hash.py, at the nodes' chunk size from their Pongs) -> the node it sent the
prompt to. A guess that is wrong (evicted, reset, node restarted) costs a cold prefill, never an output: every
node computes a prompt's bits alike, cached or not.
"""

from __future__ import annotations

from collections import OrderedDict

from router.nodes.choice import LeastOutstandingWork, RoutedRequest, least_loaded
from router.nodes.client import NodeClient
from wire.prefix_hash import chunk_hash_chain

MAX_REMEMBERED_CHUNKS = 1 << 16
"""Chunk hashes remembered (32 bytes and a node address each: a few MB at most)."""


class PrefixAffinity(LeastOutstandingWork):
    """LeastOutstandingWork, but a prefill node chosen by where the prompt's prefix went."""

    def __init__(self, max_chunks: int = MAX_REMEMBERED_CHUNKS):
        self.max_chunks = max_chunks
        self.chunk_to_address: OrderedDict[bytes, str] = OrderedDict()

    def choose_prefill(self, nodes: list[NodeClient], request: RoutedRequest) -> NodeClient:
        return self.follow_prefix(nodes, least_loaded(nodes), request)

    def choose_colocated(self, prefill: list[NodeClient], decode: list[NodeClient], colocated: list[NodeClient],
                         request: RoutedRequest) -> NodeClient | None:
        """The colocated node the prompt's prefix went to, by the same rule, where the default policy would take
        the colocated path at all."""
        chosen = super().choose_colocated(prefill, decode, colocated, request)
        return None if chosen is None else self.follow_prefix(colocated, chosen, request)

    def follow_prefix(self, nodes: list[NodeClient], fallback: NodeClient, request: RoutedRequest) -> NodeClient:
        """The node the prompt's longest known prefix went to, unless it has more outstanding work than fallback by
        more than that prefix's tokens; remembers the choice for the prompt's chunks."""
        chunk_size = next((n.capacity.prefix_chunk_tokens for n in nodes
                           if n.capacity is not None and n.capacity.prefix_chunk_tokens), 0)
        if not chunk_size:
            return fallback
        prompt = request.prompt_token_ids
        keys = chunk_hash_chain(list(prompt), chunk_size, b"")
        holder, num_saved = self.holder(nodes, keys[:(len(prompt) - 1) // chunk_size], chunk_size)
        chosen = fallback
        if holder is not None and holder.outstanding_work - fallback.outstanding_work <= num_saved:
            chosen = holder
        self.remember(keys, chosen.address)
        return chosen

    def holder(self, nodes: list[NodeClient], keys: list[bytes], chunk_size: int) -> tuple[NodeClient | None, int]:
        """The open, healthy node the longest prefix went to, and that prefix's tokens."""
        by_address = {node.address: node for node in nodes if not node.draining and node.healthy}
        for num_chunks in range(len(keys), 0, -1):
            node = by_address.get(self.chunk_to_address.get(keys[num_chunks - 1], ""))
            if node is not None:
                return node, num_chunks * chunk_size
        return None, 0

    def remember(self, keys: list[bytes], address: str) -> None:
        for key in keys:
            self.chunk_to_address[key] = address
            self.chunk_to_address.move_to_end(key)
        while len(self.chunk_to_address) > self.max_chunks:
            self.chunk_to_address.popitem(last=False)


def make_policy(name: str):
    """The ChoicePolicy a RouterSettings.routing_policy names."""
    return PrefixAffinity() if name == "prefix_aware" else LeastOutstandingWork()
