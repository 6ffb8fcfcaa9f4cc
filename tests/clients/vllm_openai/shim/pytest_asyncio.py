"""Shim for pytest-asyncio (not a CoRun dependency): @pytest_asyncio.fixture for async (generator) fixtures, run on
the one event loop that the conftest runs every `async def` test on (shim/tests_conftest.py)."""

from __future__ import annotations

import asyncio
import functools
import inspect

import pytest

LOOP = asyncio.new_event_loop()
"""Every async test and fixture of the session runs on it (the clients a fixture makes stay usable)."""


def fixture(fn=None, **kwargs):
    if fn is None:
        return lambda f: fixture(f, **kwargs)
    kwargs.pop("loop_scope", None)
    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        def sync_gen(*args, **kw):
            agen = fn(*args, **kw)
            yield LOOP.run_until_complete(agen.__anext__())
            try:
                LOOP.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                pass
        return pytest.fixture(sync_gen, **kwargs)
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        def sync(*args, **kw):
            return LOOP.run_until_complete(fn(*args, **kw))
        return pytest.fixture(sync, **kwargs)
    return pytest.fixture(fn, **kwargs)
