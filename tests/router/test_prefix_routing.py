"""prefix_aware routing: a prompt goes to the prefill node its longest full-chunk prefix went to, unless that node
is busier than the least loaded one by more than the prefix's tokens; no chunk size known (no prefix cache on the
nodes): least loaded, as today's policy."""

import asyncio

from router.nodes.choice import LeastOutstandingWork, RoutedRequest
from router.nodes.pool import NodePool
from router.nodes.prefix_routing import PrefixAffinity
from wire.config import RouterConfig
from wire.protocol import ModelFacts, NodeCapacity, Pong

CHUNK = 16


def pool_of(num_prefill: int, chunk_tokens: int = CHUNK) -> NodePool:
    addresses = tuple(f"tcp://127.0.0.1:{9000 + i}" for i in range(num_prefill))
    pool = NodePool(RouterConfig(model="unused", prefill_addresses=addresses, decode_addresses=(addresses[0],),
                                 routing_policy="prefix_aware"))
    return healthy_with_capacity(pool, pool.prefill_nodes, chunk_tokens)


def healthy_with_capacity(pool: NodePool, nodes, chunk_tokens: int) -> NodePool:
    """The nodes healthy, their Pongs what a node with a prefix cache of chunk_tokens would have said."""
    for node in nodes:
        node._healthy_at = lambda now: True
        node._latest_pong = Pong(0, f"{node.role}-{node.index}", node.role, "f", ModelFacts(256, 2048, 20),
                                 capacity=NodeCapacity(8, 100, 16, chunk_tokens))
    return pool


def request(prompt) -> RoutedRequest:
    return RoutedRequest("r", prompt, 1, max_tokens=4)


def test_a_prompt_follows_its_prefix_unless_that_node_is_too_busy():
    async def body():
        pool = pool_of(2)
        assert isinstance(pool.policy, PrefixAffinity)
        first, second = pool.prefill_nodes
        shared = list(range(100, 150))  # NOTE: 3 whole chunks
        with first.open_request("busy", work=10):
            assert pool.choose_prefill(request(shared + [1, 2])) is second  # NOTE: nothing known: least loaded
            # NOTE: the prefix went to the second node: 48 tokens saved outweigh its 30 tokens of extra work
            with second.open_request("a", work=40):
                assert pool.choose_prefill(request(shared + [3])) is second
            with second.open_request("b", work=100):  # NOTE: 90 tokens more than the first node: not worth it
                assert pool.choose_prefill(request(shared + [4])) is first
        # NOTE: both now hold the chain; the latest (the first node) is remembered for it
        assert pool.choose_prefill(request(shared + [5])) is first
        other = list(range(500, 540))
        assert pool.choose_prefill(request(other)) is first  # NOTE: unknown prefix: least loaded, lowest index
        await pool.close()

    asyncio.run(body())


def test_without_a_prefix_cache_on_the_nodes_it_is_least_loaded():
    async def body():
        pool = pool_of(2, chunk_tokens=0)
        first, second = pool.prefill_nodes
        with first.open_request("busy", work=1):
            assert pool.choose_prefill(request(list(range(100, 200)))) is second
            assert pool.choose_prefill(request(list(range(100, 200)))) is second
        assert not pool.policy.chunk_to_address
        await pool.close()

    asyncio.run(body())


def colocated_pool_of(num_nodes: int) -> NodePool:
    addresses = tuple(f"tcp://127.0.0.1:{9100 + i}" for i in range(num_nodes))
    pool = NodePool(RouterConfig(model="unused", prefill_addresses=(), decode_addresses=(),
                                 colocated_addresses=addresses, routing_policy="prefix_aware"))
    return healthy_with_capacity(pool, pool.colocated_nodes, CHUNK)


def test_among_colocated_nodes_a_prompt_follows_its_prefix_too():
    async def body():
        pool = colocated_pool_of(2)
        first, second = pool.colocated_nodes
        shared = list(range(100, 150))  # NOTE: 3 whole chunks
        with first.open_request("busy", work=10):
            assert pool.choose_colocated(request(shared + [1])) is second  # NOTE: nothing known: least loaded
            with second.open_request("a", work=40):
                assert pool.choose_colocated(request(shared + [2])) is second
            with second.open_request("b", work=100):
                assert pool.choose_colocated(request(shared + [3])) is first
        # NOTE: the inverse: the default policy, at the same loads, goes by load alone
        plain = colocated_pool_of(2)
        plain.policy = LeastOutstandingWork()
        plain_first, plain_second = plain.colocated_nodes
        with plain_first.open_request("busy", work=10):
            plain.choose_colocated(request(shared + [1]))
            with plain_second.open_request("a", work=40):
                assert plain.choose_colocated(request(shared + [2])) is plain_first
        await pool.close()
        await plain.close()

    asyncio.run(body())
