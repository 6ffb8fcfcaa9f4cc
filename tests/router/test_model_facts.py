"""The router validates requests against what the nodes report of their model (Pong.model_facts), not against
copies in its own flags, and refuses a pool whose nodes disagree, naming the field."""

import msgspec
import pytest

from tests.router.fake_nodes import FakeBehaviour
from tests.router.harness import RouterHarness, get, model_facts, post, wait_for

pytestmark = pytest.mark.timeout(30)


def completions(router, **body):
    return post(router.base_url + "/v1/completions", {"model": "corun-tiny", "prompt": "the cat", "seed": 1, **body})


def test_limits_come_from_the_nodes(tiny_model_dir, word_token_ids):
    facts = msgspec.structs.replace(model_facts(tiny_model_dir), max_model_len=40, max_logprobs=3)
    behaviour = FakeBehaviour(model_facts=facts)
    with RouterHarness(tiny_model_dir, word_token_ids, prefill=behaviour, decode=behaviour) as router:
        router.wait_until_healthy()
        too_long = completions(router, max_tokens=39)
        assert too_long.status == 400 and "maximum context length is 40" in too_long.body["error"]["message"]
        too_many = completions(router, max_tokens=2, logprobs=4)
        assert too_many.status == 400 and "logprobs" in too_many.body["error"]["message"]
        assert completions(router, max_tokens=2, logprobs=3).status == 200
        models = get(router.base_url + "/v1/models").body["data"]
        assert models[0]["max_model_len"] == 40


def test_a_pool_whose_nodes_disagree_is_refused_naming_the_field(tiny_model_dir, word_token_ids):
    other = msgspec.structs.replace(model_facts(tiny_model_dir), max_model_len=512)
    with RouterHarness(tiny_model_dir, word_token_ids, decode=FakeBehaviour(model_facts=other)) as router:
        router.wait_until_healthy()
        refused = completions(router, max_tokens=2)
        assert refused.status == 503 and "disagree on max_model_len" in refused.body["error"]["message"]
        health = get(router.base_url + "/health")
        assert health.status == 503 and "max_model_len" in health.body["error"]


def test_what_the_nodes_report_is_read_again_once_a_pong_changes_it(tiny_model_dir, word_token_ids):
    """The router reads the pool's facts from the Pongs again only when one reports other facts or another
    fingerprint (every request asks): a restarted pool with a longer context and another fingerprint is taken at
    its next Pong, and a node that then disagrees is refused."""
    facts = msgspec.structs.replace(model_facts(tiny_model_dir), max_model_len=40)
    behaviour = FakeBehaviour(model_facts=facts)
    with RouterHarness(tiny_model_dir, word_token_ids, prefill=behaviour, decode=behaviour) as router:
        router.wait_until_healthy()
        before = completions(router, max_tokens=2)
        assert before.status == 200 and completions(router, max_tokens=45).status == 400
        for node in router.nodes:
            node.model_facts = msgspec.structs.replace(facts, max_model_len=60)
            node.fingerprint = "fake-node-fingerprint-v2"
        wait_for(lambda: completions(router, max_tokens=45).status == 200, timeout_s=10)
        after = completions(router, max_tokens=2)
        assert after.body["system_fingerprint"] != before.body["system_fingerprint"]
        router.nodes[0].model_facts = msgspec.structs.replace(facts, max_model_len=50)
        wait_for(lambda: completions(router, max_tokens=2).status == 503, timeout_s=10)
        refused = completions(router, max_tokens=2)
        assert "disagree on max_model_len" in refused.body["error"]["message"]
