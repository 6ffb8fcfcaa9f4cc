"""What the router logs of errors it cannot answer: the event loop's (a failed accept()) and aiohttp's (a request
it could not parse), each kind once with its traceback, then at most once per REPEAT_LOG_S with a count.

Out of file descriptors, asyncio (3.11) retries a listener's accept() up to its backlog (RouterSettings.listen_backlog)
times per loop tick, calling the exception handler each time and scheduling a retry 1 s later each time: its default
handler logged 59-76 MB of tracebacks in ~40 s (issue 23, at a backlog of 128). aiohttp logs a traceback for each
malformed request (`Content-Length: abc`), which any client can send.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiohttp.http_exceptions import HttpProcessingError

logger = logging.getLogger(__name__)

REPEAT_LOG_S = 10.0
"""A kind of error logged again no sooner than this (with how many came meanwhile)."""
MAX_KINDS = 100
"""Kinds remembered; past it the memory starts afresh (a message may hold a changing detail)."""


class RepeatLimit:
    """Which occurrences of a kind of error to log: the first, then one per REPEAT_LOG_S carrying how many were
    dropped since."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._kinds: dict[str, tuple[float, int]] = {}

    def admit(self, kind: str) -> int | None:
        """None: drop this one; else log it, with that many dropped before it."""
        now = self._clock()
        logged_at, num_dropped = self._kinds.get(kind, (None, 0))
        if logged_at is not None and now - logged_at < REPEAT_LOG_S:
            self._kinds[kind] = (logged_at, num_dropped + 1)
            return None
        if len(self._kinds) >= MAX_KINDS:
            self._kinds.clear()
        self._kinds[kind] = (now, 0)
        return num_dropped


def install_loop_error_log(loop: asyncio.AbstractEventLoop) -> None:
    """The loop's exception handler: asyncio's default one, once per kind of error per REPEAT_LOG_S."""
    limit = RepeatLimit()

    def handle(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        kind = f"{context.get('message')}: {type(context.get('exception')).__name__}"
        num_dropped = limit.admit(kind)
        if num_dropped is None:
            return
        if num_dropped:
            logger.error("%s (%d more like it in the last %g s)", kind, num_dropped, REPEAT_LOG_S)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)


class RequestErrorFilter(logging.Filter):
    """On aiohttp's server logger: a request it could not parse (a client's fault) becomes one warning line, without
    a traceback, once per kind per REPEAT_LOG_S; every other record passes unchanged."""

    def __init__(self):
        super().__init__()
        self._limit = RepeatLimit()

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not is_client_error(error):
            return True
        num_dropped = self._limit.admit(type(error).__name__)
        if num_dropped is None:
            return False
        record.msg = f"{record.msg}: %s" + (f" ({num_dropped} more like it in the last {REPEAT_LOG_S:g} s)"
                                             if num_dropped else "")
        record.args = (*(record.args or ()), first_line(error.message))
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def is_client_error(error: BaseException | None) -> bool:
    return isinstance(error, HttpProcessingError) and 400 <= (error.code or 0) < 500


def first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else ""


HTTP_LOGGER = logging.getLogger("router.http")
"""aiohttp's server logger for the router's sites (router.app.start_site)."""
HTTP_LOGGER.addFilter(RequestErrorFilter())
