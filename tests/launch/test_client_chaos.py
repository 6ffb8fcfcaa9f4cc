"""Clients that misbehave, through a 1P1D cluster and a colocated node (CPU): a seeded mix of requests, 16 at once,
streamed or not, n 1 or 2, some given up at a random moment (the client closes its connection mid-prefill or
mid-stream), their X-Request-Ids drawn from a small pool, so that an id comes again while a request with it is in
flight or was just given up (a client retrying with its id). Every answer is a 200 (ids may repeat, as in vLLM);
every 200 carries the tokens and logprobs of the same request run alone; afterwards the nodes are back at their
idle counts (every KV block free, no lease) and the router still serves a request. Before the nodes refused an id
they still held, a second request of a leased id took the first's lease, whose blocks never came back
(tests/node_core/test_socket_fuzz.py run randomized found it)."""

import asyncio
import json
import random
import time
from collections import Counter

import aiohttp
import pytest

from tests.launch.cluster_client import node_stats, start_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NUM_REQUESTS = 160
CONCURRENCY = 16
ID_POOL = [f"client-id-{i}" for i in range(24)]
"""Half the requests name one of these ids, the others none (the router makes one)."""
LEASE_S = 3.0
PROMPTS = [list(range(5, 5 + length)) for length in (3, 40, 130, 300)]
"""Token ids: one chunk, and several (chunks of 64), so that give-ups land mid-prefill."""
SEEDS = (11, 12)
GIVE_UP = 0.35
"""The share of requests whose client closes its connection after a random 0 to 0.3 s."""


DEPLOYMENTS = {"1p1d": {"num_prefill": 1, "num_decode": 1},
               "colocated": {"num_prefill": 0, "num_decode": 0, "num_colocated": 1}}


@pytest.fixture(scope="module", params=list(DEPLOYMENTS))
def cluster(tiny_model_dir, request):
    cluster = start_cluster(tiny_model_dir, **DEPLOYMENTS[request.param], kv_lease_seconds=LEASE_S)
    yield cluster
    cluster.stop()


def body(prompt: int, seed: int, n: int, stream: bool) -> dict:
    return {"model": "corun-tiny", "prompt": PROMPTS[prompt], "max_tokens": 12, "temperature": 0.9, "seed": seed,
            "n": n, "logprobs": 1, "stream": stream, "ignore_eos": True, "return_token_ids": True}


def choices_of(payload: dict, into: dict) -> None:
    for choice in payload["choices"]:
        tokens, logprobs = into.setdefault(choice["index"], ([], []))
        tokens += choice.get("token_ids") or []
        logprobs += (choice.get("logprobs") or {}).get("token_logprobs") or []


async def send(session: aiohttp.ClientSession, url: str, request: dict, headers: dict) -> tuple[int, dict]:
    """-> (status, choice index -> (token ids, logprobs)); a stream's choices put together from its events."""
    async with session.post(url, json=request, headers=headers) as reply:
        if reply.status != 200 or not request["stream"]:
            payload = json.loads(await reply.text())
            choices = {}
            if reply.status == 200:
                choices_of(payload, choices)
            return reply.status, choices
        choices = {}
        async for line in reply.content:
            text = line.decode().strip()
            if text.startswith("data: ") and text != "data: [DONE]":
                event = json.loads(text.removeprefix("data: "))
                if "error" in event:  # NOTE: a node's refusal once the stream began: its status, in the event
                    return event["error"]["code"], {}
                choices_of(event, choices)
        return reply.status, choices


async def run_all(url: str, requests: list[tuple], rng: random.Random, in_flight: Counter | None = None) -> list:
    """requests: (prompt, seed, n, stream) each; -> (request, given up, status, choices) each. in_flight: counts,
    under "repeats", the requests sent while one with their X-Request-Id was in flight."""
    in_flight = Counter() if in_flight is None else in_flight
    gate = asyncio.Semaphore(CONCURRENCY)
    timeout = aiohttp.ClientTimeout(total=120)
    plans = [(rng.random() < GIVE_UP, rng.uniform(0, 0.3), rng.choice(ID_POOL) if rng.random() < 0.5 else None)
             for _ in requests]

    async def one(request: tuple, plan: tuple, session: aiohttp.ClientSession):
        give_up, after_s, request_id = plan
        headers = {} if request_id is None else {"X-Request-Id": request_id}
        async with gate:
            in_flight["repeats"] += request_id is not None and in_flight[request_id] > 0
            in_flight[request_id] += 1
            call = asyncio.ensure_future(send(session, url, body(*request), headers))
            if give_up:
                await asyncio.sleep(after_s)
                call.cancel()
            try:
                return request, give_up, *await call
            except asyncio.CancelledError:
                return request, True, None, {}
            finally:
                in_flight[request_id] -= 1

    # NOTE: a session (and connections) of its own per request: a given-up request closes its connection
    async def with_session(request, plan):
        async with aiohttp.ClientSession(timeout=timeout) as session:
            return await one(request, plan, session)

    return await asyncio.gather(*(with_session(r, p) for r, p in zip(requests, plans, strict=True)))


def test_misbehaving_clients_get_the_undisturbed_bits_and_leave_nothing_held(cluster):
    url = f"{cluster.url}/v1/completions"
    rng = random.Random(5)
    shapes = [(p, s, n) for p in range(len(PROMPTS)) for s in SEEDS for n in (1, 2)]
    alone = {}
    for shape in shapes:
        [(_, _, status, choices)] = asyncio.run(run_all(url, [(*shape, False)], random.Random(0)))
        assert status == 200
        alone[shape] = choices
    # NOTE: inverse: the comparison tells requests apart (another seed, other tokens)
    for prompt in range(len(PROMPTS)):
        assert alone[(prompt, SEEDS[0], 1)][0] != alone[(prompt, SEEDS[1], 1)][0]

    requests = [(*rng.choice(shapes), rng.random() < 0.5) for _ in range(NUM_REQUESTS)]
    in_flight = Counter()
    results = asyncio.run(run_all(url, requests, rng, in_flight))
    answered = [(request, status, choices) for request, given_up, status, choices in results if not given_up]
    statuses = [status for _, status, _ in answered]
    assert set(statuses) == {200} and len(answered) >= 40 and in_flight["repeats"] >= 5, (statuses, in_flight)
    for (prompt, seed, n, stream), _, choices in answered:
        assert choices == alone[(prompt, seed, n)], f"prompt {prompt}, seed {seed}, n {n}, stream {stream}"
    print(f"client chaos: {len(results) - len(answered)} given up, {len(answered)} answered 200, "
          f"{in_flight['repeats']} sent while a request with their id was in flight")

    deadline = time.monotonic() + 2 * LEASE_S + 10
    while True:
        stats = node_stats(cluster)
        held = {name: s for name, s in stats.items() if s.get("kv_cache_usage_perc") or s.get("num_leased")
                or s.get("num_running") or s.get("num_waiting")}
        if not held:
            break
        assert time.monotonic() < deadline, f"not idle: {held}"
        time.sleep(0.25)
    with_id = asyncio.run(run_all(url, [(1, SEEDS[0], 2, True)], random.Random(0)))
    assert with_id[0][2] == 200 and with_id[0][3] == alone[(1, SEEDS[0], 2)]
