"""Issue 23, finding 2: the router places n samples by what each decode node says it can hold (Pong.capacity, which
may differ between nodes), refuses an n no node can hold before any prefill, and gives a prefilled KV lease back
at once when the decode ends before reading it."""

import pytest

from tests.router.fake_nodes import FakeBehaviour
from tests.router.harness import RouterHarness, post, wait_for
from wire.protocol import Abort, DecodeRequest, NodeCapacity, PrefillRequest

pytestmark = pytest.mark.timeout(60)
BODY = {"prompt": "the green city", "max_tokens": 4, "seed": 5}


def slots(max_num_seqs: int, num_kv_blocks: int = 10_000) -> FakeBehaviour:
    return FakeBehaviour(capacity=NodeCapacity(max_num_seqs, num_kv_blocks, block_size=16))


def completions(router, request_id: str, **body):
    return post(router.base_url + "/v1/completions", {**BODY, **body}, headers={"X-Request-Id": request_id})


def received(nodes, message_type) -> list[str]:
    return [request_id for node in nodes for request_id in node.request_ids(message_type)]


def test_an_n_no_decode_node_can_hold_is_a_400_before_any_prefill(tiny_model_dir, word_token_ids):
    with RouterHarness(tiny_model_dir, word_token_ids, num_prefill=1, num_decode=1, decode=slots(4)) as router:
        router.wait_until_healthy()
        reply = completions(router, "too-many", n=5)
        assert reply.status == 400
        assert "max_num_seqs" in reply.body["error"]["message"] and "n must be <= 4" in reply.body["error"]["message"]
        assert "tcp://" not in reply.body["error"]["message"]
        assert received(router.prefill_nodes, PrefillRequest) == []
        # NOTE: the inverse: an n the node holds is served, through the prefill
        reply = completions(router, "fits", n=4)
        assert reply.status == 200 and len(reply.body["choices"]) == 4
        assert received(router.prefill_nodes, PrefillRequest) == ["fits-0"]


def test_samples_whose_kv_no_decode_node_holds_are_a_400_before_any_prefill(tiny_model_dir, word_token_ids):
    with RouterHarness(tiny_model_dir, word_token_ids, num_prefill=1, num_decode=1,
                       decode=slots(8, num_kv_blocks=3)) as router:
        router.wait_until_healthy()
        reply = completions(router, "too-long", n=4)
        assert reply.status == 400 and "KV blocks" in reply.body["error"]["message"]
        assert received(router.prefill_nodes, PrefillRequest) == []
        assert completions(router, "fits", n=3).status == 200


def test_decode_nodes_of_different_sizes_serve_together_and_n_goes_where_it_fits(tiny_model_dir, word_token_ids):
    """Capacity is a fact of each node, never one the pool must agree on (as it must on the fingerprint)."""
    harness = RouterHarness(tiny_model_dir, word_token_ids, num_prefill=1, num_decode=2, decode=slots(4))
    harness.decode_nodes[1].behaviour = slots(8)
    with harness as router:
        router.wait_until_healthy()
        for i in range(3):
            assert completions(router, f"six-{i}", n=6).status == 200
        assert received(router.decode_nodes[:1], DecodeRequest) == []
        assert len(received(router.decode_nodes[1:], DecodeRequest)) == 3
        assert completions(router, "nine", n=9).status == 400


def test_a_refusal_after_the_prefill_gives_the_kv_lease_back_at_once(tiny_model_dir, word_token_ids):
    """A decode node that refuses (here: one that does not say what it holds) ends the request before it read the KV:
    the router aborts the request on the prefill node, which ends the unclaimed lease now, not kv_lease_seconds on."""
    refusing = FakeBehaviour(error=(400, "n = 5 samples, this node runs at most 4 (its max_num_seqs)"))
    with RouterHarness(tiny_model_dir, word_token_ids, num_prefill=1, num_decode=1, decode=refusing) as router:
        router.wait_until_healthy()
        reply = completions(router, "refused", n=5)
        assert reply.status == 400 and received(router.prefill_nodes, PrefillRequest) == ["refused-0"]
        wait_for(lambda: received(router.prefill_nodes, Abort) == ["refused-0"], timeout_s=10)


def test_a_served_request_sends_the_prefill_node_no_abort(tiny_model_dir, word_token_ids):
    """The inverse: a decode that read the KV (it streamed) leaves the lease to the read's done notification."""
    with RouterHarness(tiny_model_dir, word_token_ids, num_prefill=1, num_decode=1) as router:
        router.wait_until_healthy()
        assert completions(router, "served", n=2).status == 200
        assert received(router.decode_nodes, DecodeRequest) == ["served-0"]
        assert received(router.prefill_nodes, Abort) == []
