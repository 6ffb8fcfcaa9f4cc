"""The router process: never imports torch; `python -m router` serves and exits cleanly on SIGTERM."""

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from launch.cluster import free_port

pytestmark = pytest.mark.timeout(30)

NO_TORCH_SCRIPT = """
import sys
import router.__main__
from wire.config import RouterConfig
from router.app import create_app
create_app(RouterConfig(model=sys.argv[1], served_model_name="corun-tiny", prefill_addresses=("tcp://127.0.0.1:1",),
                        decode_addresses=("tcp://127.0.0.1:2",)))
assert "torch" not in sys.modules, "the router imported torch"
print("ok")
"""


def test_the_router_never_imports_torch(tiny_model_dir):
    result = subprocess.run([sys.executable, "-c", NO_TORCH_SCRIPT, tiny_model_dir], capture_output=True,
                            text=True, timeout=20)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_python_m_router_serves_and_stops_on_sigterm(tiny_model_dir):
    port = free_port("127.0.0.1")
    command = [sys.executable, "-m", "router", "--model", tiny_model_dir, "--prefill-address", "tcp://127.0.0.1:1",
               "--decode-address", "tcp://127.0.0.1:2", "--port", str(port), "--served-model-name", "m"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        models = wait_for_json(f"http://127.0.0.1:{port}/v1/models", timeout_s=15)
        assert [m["id"] for m in models["data"]] == ["m"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert "router listening" in process.stderr.read()
    finally:
        process.kill()
        process.wait(timeout=5)


def wait_for_json(url: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return json.loads(reply.read())
        except OSError:
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.1)
