"""Which path a request takes: the least loaded colocated node unless a decode node has less outstanding work;
never a lost colocated node while P/D nodes can serve; a 503 once every colocated node of a P/D-less pool drains."""

import asyncio

import pytest

from router.nodes.choice import NoNodeAvailable, Placement
from router.nodes.client import NodeStatus
from router.nodes.pool import NodePool
from wire.config import RouterConfig

ADDRESS = "tcp://127.0.0.1:9"


def pool_of(prefill: int, decode: int, colocated: int) -> NodePool:
    return NodePool(RouterConfig(model="unused", prefill_addresses=(ADDRESS,) * prefill,
                                 decode_addresses=(ADDRESS,) * decode, colocated_addresses=(ADDRESS,) * colocated))


def set_health(node, healthy: bool) -> None:
    """What the node's pings would have said (no node answers here)."""
    node.status = lambda now=None: NodeStatus(node.index, node.role, node.address, healthy, node.draining, None, None)


def mark_healthy(pool: NodePool) -> None:
    for node in pool.nodes:
        set_health(node, True)


def test_the_least_loaded_path_wins_and_a_lost_colocated_node_is_skipped():
    async def body():
        pool = pool_of(1, 1, 1)
        mark_healthy(pool)
        [colocated], [decode] = pool.colocated_nodes, pool.decode_nodes
        picks = [pool.choose_colocated(Placement())]
        with colocated.open_request("a", work=2):
            picks.append(pool.choose_colocated(Placement()))
            with decode.open_request("b", work=3):
                picks.append(pool.choose_colocated(Placement()))
        set_health(colocated, False)
        picks.append(pool.choose_colocated(Placement()))
        await pool.close()
        return [None if node is None else node.role for node in picks]

    # NOTE: ties go to the colocated node (no hand-off); a lost one is never chosen while P/D can serve
    assert asyncio.run(body()) == ["colocated", None, "colocated", None]


def test_a_colocated_only_pool_serves_silent_nodes_but_not_draining_ones():
    async def body():
        pool = pool_of(0, 0, 2)
        first, second = pool.colocated_nodes
        set_health(first, False)  # NOTE: silent, yet the only path there is
        second.draining = True
        chosen = pool.choose_colocated(Placement())
        first.draining = True
        with pytest.raises(NoNodeAvailable):
            pool.choose_colocated(Placement())
        await pool.close()
        return chosen

    assert asyncio.run(body()) is not None


def test_a_request_pinned_to_p_d_nodes_takes_the_p_d_path():
    async def body():
        pool = pool_of(1, 1, 1)
        mark_healthy(pool)
        pinned = pool.choose_colocated(Placement(prefill=ADDRESS))
        await pool.close()
        return pinned

    assert asyncio.run(body()) is None
