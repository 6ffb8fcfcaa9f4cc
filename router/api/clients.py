"""Per-client limits, so that one client cannot starve the others (issue 23, finding 7).

A client is an API key (RouterConfig.api_key, or one of client_api_keys_file's), or DEFAULT_CLIENT when the router
has no key. Each client has, at most:
- max_client_requests requests in the router at once (parsing, waiting for its decode slots, generating): one
  more is a 429 at once, before its body is read;
- max_client_decode_slots samples (a prompt's n each) generating at once: a request that would go over waits,
  in the client's own queue (first come, first served), for the client's earlier requests to end;
- max_client_queued_requests such waiting requests: one more is a 429.
None: no such limit (the router's max_pending_requests still holds). The waits are per client: a client at its
limits never delays another one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from router.api.errors import RequestError
from wire.config import RouterConfig

DEFAULT_CLIENT = "default"
"""Every request's client when the router has no API key."""
RETRY_AFTER_S = 1


@dataclass
class Client:
    name: str
    num_requests: int = 0
    num_slots: int = 0
    waiting: deque[tuple[int, asyncio.Future]] = field(default_factory=deque)
    """Requests waiting for slots, oldest first: (slots wanted, resolved once they are taken for it)."""


class ClientLimits:
    def __init__(self, config: RouterConfig):
        self.max_requests = config.max_client_requests
        self.max_slots = config.max_client_decode_slots
        self.max_queued = config.max_client_queued_requests
        self.wait_s = config.request_timeout_s
        self.clients: dict[str, Client] = {}

    @contextlib.contextmanager
    def request(self, name: str) -> Iterator[Client]:
        """One request of client name in the router, from before its body is read until its answer ends."""
        client = self.clients.setdefault(name, Client(name))
        if self.max_requests is not None and client.num_requests >= self.max_requests:
            raise too_many(f"this client has {client.num_requests} requests in the router (at most "
                           f"{self.max_requests}, the router's --max-client-requests)")
        client.num_requests += 1
        try:
            yield client
        finally:
            client.num_requests -= 1
            if client.num_requests == 0:
                del self.clients[name]

    @contextlib.asynccontextmanager
    async def decode_slots(self, client: Client, num_slots: int) -> AsyncIterator[None]:
        """Holds num_slots of the client's decode slots, waiting for them behind its earlier requests."""
        if self.max_slots is not None and num_slots > self.max_slots:
            raise RequestError(400, f"this request needs {num_slots} decode slots (prompts x n); a client has at "
                               f"most {self.max_slots} (the router's --max-client-decode-slots)", param="n")
        if not client.waiting and self._fits(client, num_slots):
            client.num_slots += num_slots
        else:
            await self._wait(client, num_slots)
        try:
            yield
        finally:
            client.num_slots -= num_slots
            self._wake(client)

    def _fits(self, client: Client, num_slots: int) -> bool:
        return self.max_slots is None or client.num_slots + num_slots <= self.max_slots

    async def _wait(self, client: Client, num_slots: int) -> None:
        if self.max_queued is not None and len(client.waiting) >= self.max_queued:
            raise too_many(f"this client has {len(client.waiting)} requests waiting for its decode slots (at most "
                           f"{self.max_queued}, the router's --max-client-queued-requests)")
        entry = (num_slots, asyncio.get_running_loop().create_future())
        client.waiting.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(entry[1]), self.wait_s)
        except BaseException as error:
            self._leave(client, entry)
            if isinstance(error, TimeoutError):
                raise too_many(f"this request waited {self.wait_s:g} s for this client's decode slots (the "
                               "router's --request-timeout-s)") from None
            raise

    def _leave(self, client: Client, entry: tuple[int, asyncio.Future]) -> None:
        """A waiting request that goes (its client left, its wait timed out)."""
        num_slots, granted = entry
        if granted.done():  # NOTE: the slots were taken for it just as it left: give them back
            client.num_slots -= num_slots
        else:
            granted.cancel()
            client.waiting.remove(entry)
        self._wake(client)

    def _wake(self, client: Client) -> None:
        while client.waiting and self._fits(client, client.waiting[0][0]):
            num_slots, granted = client.waiting.popleft()
            client.num_slots += num_slots
            granted.set_result(None)


def too_many(message: str) -> RequestError:
    return RequestError(429, f"{message}; retry later", headers={"Retry-After": str(RETRY_AFTER_S)})
