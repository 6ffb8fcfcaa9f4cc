"""Which path a request takes: the least loaded colocated node unless a decode node has less outstanding work;
never a lost colocated node while P/D nodes can serve; a 503 once every colocated node of a P/D-less pool drains.
The pool's policy is given the request; a pinned request never reaches it."""

import asyncio

import pytest

from router.nodes.choice import LeastOutstandingWork, NoNodeAvailable, Placement, RoutedRequest
from router.nodes.pool import NodePool
from wire.config import RouterConfig

ADDRESS = "tcp://127.0.0.1:9"


def pool_of(prefill: int, decode: int, colocated: int) -> NodePool:
    return NodePool(RouterConfig(model="unused", prefill_addresses=(ADDRESS,) * prefill,
                                 decode_addresses=(ADDRESS,) * decode, colocated_addresses=(ADDRESS,) * colocated))


def routed(placement: Placement = Placement()) -> RoutedRequest:
    """A request as the choice sees it (today's policy looks at none of it but its pins)."""
    return RoutedRequest("r", [1, 2, 3], 1, placement)


def set_health(node, healthy: bool) -> None:
    """What the node's pings would have said (no node answers here)."""
    node._healthy_at = lambda now: healthy


def mark_healthy(pool: NodePool) -> None:
    for node in pool.nodes:
        set_health(node, True)


def test_the_least_loaded_path_wins_and_a_lost_colocated_node_is_skipped():
    async def body():
        pool = pool_of(1, 1, 1)
        mark_healthy(pool)
        [colocated], [decode] = pool.colocated_nodes, pool.decode_nodes
        picks = [pool.choose_colocated(routed())]
        with colocated.open_request("a", work=2):
            picks.append(pool.choose_colocated(routed()))
            with decode.open_request("b", work=3):
                picks.append(pool.choose_colocated(routed()))
        set_health(colocated, False)
        picks.append(pool.choose_colocated(routed()))
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
        chosen = pool.choose_colocated(routed())
        first.draining = True
        with pytest.raises(NoNodeAvailable):
            pool.choose_colocated(routed())
        await pool.close()
        return chosen

    assert asyncio.run(body()) is not None


def test_a_request_pinned_to_p_d_nodes_takes_the_p_d_path():
    async def body():
        pool = pool_of(1, 1, 1)
        mark_healthy(pool)
        pinned = pool.choose_colocated(routed(Placement(prefill=ADDRESS)))
        await pool.close()
        return pinned

    assert asyncio.run(body()) is None


class RecordingPolicy(LeastOutstandingWork):
    """Today's policy, noting each choice it is asked for and the request it is given."""

    def __init__(self):
        self.asked: list[tuple[str, RoutedRequest]] = []

    def choose_prefill(self, nodes, request):
        self.asked.append(("prefill", request))
        return super().choose_prefill(nodes, request)

    def choose_decode(self, nodes, request):
        self.asked.append(("decode", request))
        return super().choose_decode(nodes, request)

    def choose_colocated(self, prefill, decode, colocated, request):
        self.asked.append(("colocated", request))
        return super().choose_colocated(prefill, decode, colocated, request)


def test_the_policy_is_given_the_request_and_a_pinned_one_never_reaches_it():
    async def body():
        policy = RecordingPolicy()
        pool = NodePool(RouterConfig(model="unused", prefill_addresses=(ADDRESS,), decode_addresses=(ADDRESS,),
                                     colocated_addresses=(ADDRESS,)), policy)
        mark_healthy(pool)
        request = RoutedRequest("seen", [7, 8, 9], 3)
        chosen = [pool.choose_colocated(request), pool.choose_prefill(request), pool.choose_decode(request)]
        pinned = routed(Placement(prefill=ADDRESS, decode=ADDRESS))
        pinned_chosen = [pool.choose_colocated(pinned), pool.choose_prefill(pinned), pool.choose_decode(pinned)]
        await pool.close()
        return policy.asked, chosen, pinned_chosen

    asked, chosen, pinned_chosen = asyncio.run(body())
    assert asked == [(role, RoutedRequest("seen", [7, 8, 9], 3)) for role in ("colocated", "prefill", "decode")]
    assert [None if node is None else node.role for node in chosen] == ["colocated", "prefill", "decode"]
    # NOTE: inverse: pinned, the pool takes the named nodes itself (here the decode pin names the decode node)
    assert [None if node is None else node.role for node in pinned_chosen] == [None, "prefill", "decode"]
