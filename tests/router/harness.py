"""Fake nodes plus the router app on a free port, in one background event loop; HTTP helpers for tests."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import zmq.asyncio
from multidict import CIMultiDict

from router.api.handlers import STATE_KEY
from router.api.state import RouterState
from router.app import create_app, start_site
from tests.router.fake_nodes import FakeBehaviour, FakeDecode, FakePrefill
from wire.config import EngineConfig, RouterConfig, SchedulerConfig
from wire.protocol import ModelFacts

CALL_TIMEOUT_S = 120.0
"""A bound on one call into the harness loop (start, stop, a node action): far above what any takes on a loaded host;
the real hang guard is pytest-timeout."""
NO_CLIENT_TIMEOUT = aiohttp.ClientTimeout()
"""The tests assert the router's answer, not how fast a loaded host gives it: pytest-timeout is the hang guard."""
HEALTHY_WAIT_S = 60.0
"""Generous: the wait ends as soon as the nodes answer."""


@dataclass(frozen=True)
class HttpReply:
    status: int
    headers: Mapping[str, str]
    """Case-insensitive."""
    body: object
    """Parsed JSON, or the text when the body is not JSON."""


def model_facts(model_dir: str) -> ModelFacts:
    """What real nodes on this checkpoint with default settings report."""
    vocab_size = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    return ModelFacts(SchedulerConfig.max_model_len, vocab_size, EngineConfig.max_logprobs)


class RouterHarness:
    """`with RouterHarness(model_dir, candidate_ids) as router:` serves at router.base_url until the block ends."""

    def __init__(self, model_dir: str, candidate_ids: list[int], *, num_prefill: int = 2, num_decode: int = 2,
                 prefill: FakeBehaviour = FakeBehaviour(), decode: FakeBehaviour = FakeBehaviour(), **config):
        facts = model_facts(model_dir)
        self.prefill_nodes = [FakePrefill("prefill", f"fake-prefill-{i}", candidate_ids, prefill, facts)
                              for i in range(num_prefill)]
        self.decode_nodes = [FakeDecode("decode", f"fake-decode-{i}", candidate_ids, decode, facts)
                             for i in range(num_decode)]
        self._model_dir, self._config_overrides = model_dir, config
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="router-harness", daemon=True)
        self.base_url = ""
        self.state: RouterState | None = None
        self._stopped = False

    def __enter__(self) -> RouterHarness:
        self._thread.start()
        self.call(self._start)
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            self.call(self.stop)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def block_loop(self, seconds: float) -> None:
        """Hold the harness loop (the router and its fake nodes) for seconds from now, as a router busy with other
        work holds its own: returns once the hold has begun."""
        began = threading.Event()

        def hold() -> None:
            began.set()
            time.sleep(seconds)
        self._loop.call_soon_threadsafe(hold)
        began.wait(CALL_TIMEOUT_S)

    def call(self, async_fn: Callable[[], Awaitable], timeout_s: float = CALL_TIMEOUT_S):
        """Run async_fn() on the harness's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(async_fn(), self._loop).result(timeout_s)

    def wait_until_healthy(self) -> None:
        self.call(lambda: self.state.pool.wait_until_healthy(timeout_s=HEALTHY_WAIT_S))

    @property
    def nodes(self):
        return [*self.prefill_nodes, *self.decode_nodes]

    async def _start(self) -> None:
        self._context = zmq.asyncio.Context()
        prefill_addresses = [await node.start(self._context) for node in self.prefill_nodes]
        decode_addresses = [await node.start(self._context) for node in self.decode_nodes]
        config = RouterConfig(model=self._model_dir, served_model_name="corun-tiny",
                              prefill_addresses=tuple(prefill_addresses),
                              decode_addresses=tuple(decode_addresses), port=0, **self._config_overrides)
        app = create_app(config)
        self.state = app[STATE_KEY]
        self._runner = await start_site(app, "127.0.0.1", 0)
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}"

    async def stop(self) -> None:
        """The router's stop (what SIGTERM runs: aiohttp's cleanup), then the fake nodes'; once (the block's end
        after a test's own call does nothing)."""
        if self._stopped:
            return
        self._stopped = True
        await self._runner.cleanup()
        await asyncio.gather(*(node.close() for node in self.nodes))
        self._context.term()


async def http_request(method: str, url: str, body=None, *, raw: bytes | None = None,
                       headers: dict[str, str] | None = None) -> HttpReply:
    """One request with a fresh session; body is sent as JSON, raw as given."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    async with aiohttp.ClientSession(timeout=NO_CLIENT_TIMEOUT) as session:
        async with session.request(method, url, data=data, headers={"Content-Type": "application/json",
                                                                       **(headers or {})}) as response:
            text = await response.text()
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = text
            return HttpReply(response.status, CIMultiDict(response.headers), parsed)


def post(url: str, body=None, **kwargs) -> HttpReply:
    return asyncio.run(http_request("POST", url, body, **kwargs))


def get(url: str, **kwargs) -> HttpReply:
    return asyncio.run(http_request("GET", url, **kwargs))


def sse_events(text: str) -> list:
    """The JSON events of a server-sent-event body, then "[DONE]" as a string."""
    events = []
    for block in text.strip().split("\n\n"):
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Polls until condition() holds; the generous default costs nothing when it does."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
