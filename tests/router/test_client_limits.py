"""Issue 23, finding 7: per-client limits keyed by API key, so that one client cannot starve the others.

A client that holds all the decode slots it may (and queues more) never makes another client wait; past its limits
it gets vLLM-style 429s (OpenAI error body, Retry-After); a request that could never fit its limit is a 400."""

import asyncio

import aiohttp
import pytest

from router.api.auth import client_name, load_api_keys
from router.api.clients import DEFAULT_CLIENT
from tests.router.fake_nodes import FakeBehaviour, without_tag
from tests.router.harness import NO_CLIENT_TIMEOUT, RouterHarness, http_request, wait_for
from tests.router.test_errors import assert_error
from wire.config import RouterConfig
from wire.protocol import DecodeRequest, PrefillRequest

pytestmark = pytest.mark.timeout(60)
FIRST, SECOND, OPERATOR_KEY = "sk-first-client", "sk-second-client", "sk-operator"
SHORT = {"prompt": "the river", "max_tokens": 4, "seed": 1}
LONG = {"prompt": "the long river", "max_tokens": 600, "seed": 2, "stream": True}
"""~300 token events of 50 ms: far longer than anything else a test here waits for."""
SLOW_DECODE = FakeBehaviour(event_delay_s=0.05, num_slots=4)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("keys") / "client_keys"
    path.write_text(f"# two clients\n{FIRST}\n\n  {SECOND}  \n")
    return str(path)


def limited_router(tiny_model_dir, word_token_ids, keys_file: str | None, **limits) -> RouterHarness:
    keys = {} if keys_file is None else {"client_api_keys_file": keys_file, "api_key": OPERATOR_KEY}
    return RouterHarness(tiny_model_dir, word_token_ids, num_decode=1, decode=SLOW_DECODE, **keys, **limits)


async def open_stream(session: aiohttp.ClientSession, url: str, key: str | None) -> aiohttp.ClientResponse:
    """A streamed request whose events are left unread (its answer's head has come: it is admitted or refused)."""
    return await session.post(url + "/v1/completions", json=LONG, headers=bearer(key) if key else {})


async def second_client_while_first_saturates(router: RouterHarness, num_first: int) -> tuple[int, list[str]]:
    """The first client opens num_first long streams (more than its slots) and reads none; then the second sends
    one short request. -> (the second's status, the requests the node had finished when it was answered)."""
    async with aiohttp.ClientSession(timeout=NO_CLIENT_TIMEOUT) as session:
        first = [asyncio.ensure_future(open_stream(session, router.base_url, FIRST)) for _ in range(num_first)]
        await asyncio.to_thread(wait_for, lambda: router.decode_nodes[0].num_running >= 2)
        second = await http_request("POST", router.base_url + "/v1/completions", SHORT,
                                    headers={**bearer(SECOND), "X-Request-Id": "second"})
        finished = list(router.decode_nodes[0].finished_request_ids)
        for task in first:
            task.cancel()
        return second.status, finished


def test_a_client_holding_all_its_slots_never_delays_another(tiny_model_dir, word_token_ids, keys_file):
    """The decode node has 4 slots; the first client may hold 2. Without per-client limits its 4 long streams take
    all 4, and the second client's request waits at the node until one of them ends (~15 s)."""
    with limited_router(tiny_model_dir, word_token_ids, keys_file, max_client_decode_slots=2) as router:
        router.wait_until_healthy()
        status, finished = router.call(lambda: second_client_while_first_saturates(router, num_first=4))
        assert status == 200
        assert finished == ["second-0"]  # NOTE: none of the first client's streams had to end for it


async def hold_then_more(router: RouterHarness, key: str | None, num_held: int) -> tuple[list, object]:
    """num_held long streams (admitted or waiting), then one more request: -> (the held responses, its reply)."""
    session = aiohttp.ClientSession(timeout=NO_CLIENT_TIMEOUT)
    held = [asyncio.ensure_future(open_stream(session, router.base_url, key)) for _ in range(num_held)]
    client = DEFAULT_CLIENT if key is None else client_name(key)
    await asyncio.to_thread(wait_for, lambda: router.state.clients.clients.get(client) is not None
                            and router.state.clients.clients[client].num_requests == num_held)
    reply = await http_request("POST", router.base_url + "/v1/completions", SHORT, headers=bearer(key) if key else {})
    for task in held:
        task.cancel()
    await session.close()
    return held, reply


def test_requests_beyond_max_client_requests_get_429_at_once(tiny_model_dir, word_token_ids, keys_file):
    with limited_router(tiny_model_dir, word_token_ids, keys_file, max_client_requests=2) as router:
        router.wait_until_healthy()
        _, refused = router.call(lambda: hold_then_more(router, FIRST, num_held=2))
        assert_error(refused, 429, "--max-client-requests")
        assert refused.body["error"]["type"] == "TooManyRequestsError" and refused.headers["Retry-After"] == "1"
        served = asyncio.run(http_request("POST", router.base_url + "/v1/completions", SHORT, headers=bearer(SECOND)))
        assert served.status == 200  # NOTE: the other client, while the first is at its limit


def test_requests_beyond_max_client_queued_requests_get_429(tiny_model_dir, word_token_ids, keys_file):
    with limited_router(tiny_model_dir, word_token_ids, keys_file, max_client_decode_slots=1,
                        max_client_queued_requests=1) as router:
        router.wait_until_healthy()
        _, refused = router.call(lambda: hold_then_more(router, FIRST, num_held=2))  # NOTE: one runs, one waits
        assert_error(refused, 429, "waiting for its decode slots", "--max-client-queued-requests")


def test_without_keys_every_request_is_the_default_client(tiny_model_dir, word_token_ids):
    with limited_router(tiny_model_dir, word_token_ids, None, max_client_requests=1) as router:
        router.wait_until_healthy()
        _, refused = router.call(lambda: hold_then_more(router, None, num_held=1))
        assert_error(refused, 429, "--max-client-requests")


def test_n_counts_as_decode_slots(tiny_model_dir, word_token_ids, keys_file):
    with limited_router(tiny_model_dir, word_token_ids, keys_file, max_client_decode_slots=2) as router:
        router.wait_until_healthy()
        reply = asyncio.run(http_request("POST", router.base_url + "/v1/completions", {**SHORT, "n": 3},
                                         headers=bearer(FIRST)))
        assert_error(reply, 400, "needs 3 decode slots", "--max-client-decode-slots")
        assert reply.body["error"]["param"] == "n"
        reply = asyncio.run(http_request("POST", router.base_url + "/v1/completions", {**SHORT, "n": 2},
                                         headers=bearer(FIRST)))
        assert reply.status == 200 and len(reply.body["choices"]) == 2


def test_a_waiting_request_gets_its_slots_when_an_earlier_one_of_its_client_ends(tiny_model_dir, word_token_ids,
                                                                                  keys_file):
    async def scenario(router: RouterHarness) -> None:
        async with aiohttp.ClientSession(timeout=NO_CLIENT_TIMEOUT) as session:
            running = await open_stream(session, router.base_url, FIRST)
            waiting = asyncio.ensure_future(open_stream(session, router.base_url, FIRST))
            client = router.state.clients.clients
            await asyncio.to_thread(wait_for, lambda: any(len(c.waiting) == 1 for c in client.values()))
            assert router.decode_nodes[0].num_running == 1
            running.close()  # NOTE: the client hangs up: its decode is aborted, its slot freed
            admitted = await waiting
            assert admitted.status == 200
            admitted.close()

    with limited_router(tiny_model_dir, word_token_ids, keys_file, max_client_decode_slots=1) as router:
        router.wait_until_healthy()
        router.call(lambda: scenario(router))
        wait_for(lambda: not router.state.clients.clients)  # NOTE: nothing held once every request has ended


def test_each_clients_prompts_reach_the_prefill_node_as_its_tenant(tiny_model_dir, word_token_ids, keys_file):
    """The prefill node takes tenants in turn (tests/prefill_node), and nodes compile their constraints in turn
    (corun/fair_workers.py): the prefill and decode nodes must be told each prompt's client, by the name the limits
    use (a hash of the key: the key itself never leaves the router); without keys, one tenant."""
    with limited_router(tiny_model_dir, word_token_ids, keys_file) as router:
        router.wait_until_healthy()
        for key, request_id in ((FIRST, "first"), (SECOND, "second")):
            router.call(lambda: http_request("POST", router.base_url + "/v1/completions", SHORT,
                                             headers={**bearer(key), "X-Request-Id": request_id}))
        expected = {"first-0": client_name(FIRST), "second-0": client_name(SECOND)}
        for node, kind in ((router.prefill_nodes[0], PrefillRequest), (router.decode_nodes[0], DecodeRequest)):
            assert {without_tag(m.request_id): m.tenant for m in node.received if isinstance(m, kind)} == expected
            assert FIRST not in str(node.received)
    with limited_router(tiny_model_dir, word_token_ids, None) as router:
        router.wait_until_healthy()
        router.call(lambda: http_request("POST", router.base_url + "/v1/completions", SHORT))
        assert {m.tenant for m in router.prefill_nodes[0].received if isinstance(m, PrefillRequest)} == {
            DEFAULT_CLIENT}


def test_client_keys_are_each_accepted_and_others_refused(tiny_model_dir, word_token_ids, keys_file):
    with limited_router(tiny_model_dir, word_token_ids, keys_file) as router:
        router.wait_until_healthy()
        for key, status in ((FIRST, 200), (SECOND, 200), (OPERATOR_KEY, 200), ("sk-other", 401), ("# two", 401)):
            reply = asyncio.run(http_request("POST", router.base_url + "/v1/completions", SHORT, headers=bearer(key)))
            assert reply.status == status, (key, reply.body)
        for key, status in ((FIRST, 403), (OPERATOR_KEY, 200)):  # NOTE: a client key cannot change the pool
            reply = asyncio.run(http_request("GET", router.base_url + "/admin/nodes", headers=bearer(key)))
            assert reply.status == status, (key, reply.body)


@pytest.mark.parametrize("text, message", [("\n# none\n", "holds no API key"), ("a\na\n", "given twice"),
                                           ("has space\n", "printable ASCII")])
def test_a_bad_keys_file_is_refused_at_start(tmp_path, text, message):
    path = tmp_path / "keys"
    path.write_text(text)
    config = RouterConfig(model="m", prefill_addresses=("tcp://p:1",), decode_addresses=("tcp://d:1",),
                          client_api_keys_file=str(path), api_key=OPERATOR_KEY)
    with pytest.raises(ValueError, match=message):
        load_api_keys(config)


def test_client_keys_need_the_operator_s_key(tmp_path):
    with pytest.raises(ValueError, match="operator's key"):
        RouterConfig(model="m", prefill_addresses=("tcp://p:1",), decode_addresses=("tcp://d:1",),
                     client_api_keys_file=str(tmp_path / "keys"))


@pytest.mark.parametrize("field, value", [("max_client_requests", 0), ("max_client_decode_slots", 0),
                                          ("max_client_queued_requests", -1)])
def test_limits_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        RouterConfig(model="m", prefill_addresses=("tcp://p:1",), decode_addresses=("tcp://d:1",), **{field: value})
