"""Shim for vLLM's tests/conftest.py, and the harness's hooks: `async def` tests run on one event loop (no
pytest-asyncio), HF model names resolve to CoRun's tiny model offline, the exclusions are skipped with their
reasons, and the shared `corun serve` processes stop at the end."""

from __future__ import annotations

import importlib.util
import inspect
import os
from pathlib import Path

import pytest
import pytest_asyncio
from tests.utils import stop_shared_servers


def load_exclusions():
    path = Path(os.environ["CORUN_REPO_ROOT"]) / "tests" / "clients" / "vllm_openai" / "exclusions.py"
    spec = importlib.util.spec_from_file_location("corun_vllm_exclusions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytest_configure(config):
    config.addinivalue_line("markers", "asyncio: an async test (run on the shim's loop)")


def pytest_collection_modifyitems(config, items):
    exclusions = load_exclusions()
    for item in items:
        reason = exclusions.excluded(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"excluded: {reason}"))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    pytest_asyncio.LOOP.run_until_complete(pyfuncitem.obj(**arguments))
    return True


def pytest_sessionfinish(session, exitstatus):
    stop_shared_servers()


class LocalAssetServer:
    """vLLM serves test images from it (multimodal tests): CoRun serves text only, so asking for one skips."""

    def url_for(self, *parts: str) -> str:
        pytest.skip("no local asset server: CoRun serves text models only")


@pytest.fixture(scope="session")
def local_asset_server():
    return LocalAssetServer()
