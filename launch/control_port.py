"""`corun serve`'s control port as a server: one thread running one event loop for every connection, so a client
costs a coroutine, never a thread (http.server's ThreadingHTTPServer spent one per connection, before any check:
600 idle connections were 603 threads, never reaped).

Each connection carries one request (the answer says `Connection: close`) and is bounded: at most
max_connections open at once (one more gets a 503 and is closed), its request head and body within timeout_s of
its opening (else closed: idle and trickling clients are reaped), a head of MAX_HEAD_BYTES and a body of
MAX_BODY_BYTES, and the API key checked on the head, before any body is read or any command runs.

Imports neither torch nor ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
import threading
from collections.abc import Awaitable, Callable

from wire.auth import API_KEY_ENV, is_authorized

logger = logging.getLogger(__name__)

MAX_HEAD_BYTES = 8 * 2**10
"""A request line and headers; a control request needs a few hundred bytes."""
MAX_BODY_BYTES = 64 * 2**10
"""A role; far more is not a control request."""

Answer = tuple[int, dict]
"""(HTTP status, JSON body)."""
Handler = Callable[[str, str, bytes], Awaitable[Answer]]
"""(method, path, body) -> its answer; runs on the server's loop."""


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ControlServer:
    def __init__(self, host: str, port: int, api_key: str | None, handler: Handler, max_connections: int,
                 timeout_s: float):
        self.api_key, self.handler = api_key, handler
        self.max_connections, self.timeout_s = max_connections, timeout_s
        self.num_open = 0
        """Connections open now (read and written on the loop only)."""
        self.loop = asyncio.new_event_loop()
        # NOTE: bound here, so a taken port fails the caller at once
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, host, port,
                                                                        limit=MAX_HEAD_BYTES))
        self.thread = threading.Thread(target=self.loop.run_forever, name="control port", daemon=True)
        self.thread.start()

    def close(self) -> None:
        async def shut() -> None:
            self.server.close()
            await self.server.wait_closed()

        with contextlib.suppress(RuntimeError, TimeoutError):  # NOTE: the loop already ended
            asyncio.run_coroutine_threadsafe(shut(), self.loop).result(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.num_open >= self.max_connections:
            await self._answer(writer, 503, {"error": f"the control port serves {self.max_connections} "
                                                      "connections at once; retry"})
            return
        self.num_open += 1
        try:
            status, body = await self._request(reader)
            await self._answer(writer, status, body)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            writer.close()  # NOTE: idle, too slow or gone: closed without an answer
        except Exception as error:  # NOTE: a bug in a command: said, and the port serves on
            logger.exception("control port: a request failed")
            await self._answer(writer, 500, {"error": f"{type(error).__name__}: {error}"})
        finally:
            self.num_open -= 1

    async def _request(self, reader: asyncio.StreamReader) -> Answer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                method, path, headers = parse_head(await read_head(reader))
                if self.api_key is not None and not is_authorized(headers.get("authorization"), self.api_key):
                    return 401, {"error": "a valid API key is required: send `Authorization: Bearer <key>` "
                                          f"(corun scale: --api-key or ${API_KEY_ENV})"}
                body = await reader.readexactly(content_length(headers))
        except BadRequest as error:
            return error.status, {"error": str(error)}
        return await self.handler(method, path, body)

    async def _answer(self, writer: asyncio.StreamWriter, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n")
        writer.write(head.encode() + data)
        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(writer.drain(), self.timeout_s)
        writer.close()


async def read_head(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise BadRequest(431, f"a control request's head is at most {MAX_HEAD_BYTES} bytes") from None


def parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """-> (method, path, headers by lower-case name)."""
    request_line, *lines = head.decode("latin-1").split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise BadRequest(400, "not an HTTP request line")
    headers = {}
    for line in filter(None, lines):
        name, colon, value = line.partition(":")
        if not colon:
            raise BadRequest(400, f"not a header line: {line[:100]!r}")
        headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers


def content_length(headers: dict[str, str]) -> int:
    length = headers.get("content-length", "0")
    if not length.isdigit():
        raise BadRequest(400, f"Content-Length must be a number of bytes, got {length[:40]!r}")
    if int(length) > MAX_BODY_BYTES:
        raise BadRequest(413, f"a control request's body is at most {MAX_BODY_BYTES} bytes")
    return int(length)
