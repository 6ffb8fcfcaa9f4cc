"""Shim for vLLM's tests/utils.py: RemoteOpenAIServer starts `corun serve` on CoRun's tiny model instead of
`vllm serve` on the named checkpoint.

The cluster serves the model under the name the test asked for (--served-model-name), so request bodies and
assertions stay vLLM's. vLLM's flags are mapped where CoRun has the same setting (--max-model-len,
--max-logprobs, --enable-tokenizer-info-endpoint); the others are recorded in `ignored_args` (the exclusions name
the tests that need them).
A server is shared by every test module asking for the same model name and settings (a cluster starts in
seconds, but CI has 2 cores); a module that reads counters from a fresh server (test_metrics) gets its own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import requests

SERVER_REPO = Path(os.environ.get("CORUN_SERVER_REPO") or os.environ["CORUN_REPO_ROOT"])
"""The checkout whose `corun serve` runs (run.py --server-repo: main's, to record where main stands)."""
STARTUP_S = 120.0
MAPPED_FLAGS = {"--max-model-len": "--max-model-len", "--max-logprobs": "--max-logprobs"}
"""vLLM's flags that take a value -> corun serve's."""
MAPPED_SWITCHES = {"--enable-tokenizer-info-endpoint": "--enable-tokenizer-info-endpoint"}
"""vLLM's flags without a value -> corun serve's."""
FRESH_SERVER_MODULES = ("test_metrics",)
"""Modules whose assertions count what one server did since it started (vLLM starts one per parameter)."""
ROCM_EXTRA_ARGS: list[str] = []
ROCM_ENV_OVERRIDES: dict[str, str] = {}
"""vLLM's extra flags and environment on ROCm: none here."""
_shared: dict[tuple, RemoteOpenAIServer] = {}


def tiny_model_dir() -> str:
    return os.environ["CORUN_TINY_MODEL_DIR"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def corun_flags(vllm_args: list[str]) -> tuple[list[str], list[str]]:
    """(corun serve flags mapped from vLLM's, vLLM's flags with no CoRun counterpart)."""
    mapped, ignored, i = [], [], 0
    while i < len(vllm_args):
        arg = vllm_args[i]
        value = vllm_args[i + 1] if i + 1 < len(vllm_args) and not vllm_args[i + 1].startswith("--") else None
        name = arg.split("=", 1)[0]
        if name in MAPPED_FLAGS:
            mapped += [MAPPED_FLAGS[name], arg.split("=", 1)[1] if "=" in arg else value]
        elif arg in MAPPED_SWITCHES:
            mapped.append(MAPPED_SWITCHES[arg])
        elif arg.startswith("--"):
            ignored.append(arg)
        i += 1 if value is None or "=" in arg else 2
    return mapped, ignored


class CorunServer:
    """One `corun serve` process: 1 prefill node, 1 decode node and the router, on the tiny model."""

    def __init__(self, served_model_name: str, flags: list[str]):
        self.port = free_port()
        argv = [sys.executable, "-m", "cli.main", "serve", "--model", tiny_model_dir(), "--prefill", "1",
                "--decode", "1", "--max-num-seqs", "16", "--num-threads", "1", "--port", str(self.port),
                "--served-model-name", served_model_name, *flags]
        self.log = open(Path(os.environ.get("CORUN_SERVER_LOG_DIR", "/tmp")) / f"corun-serve-{self.port}.log", "w")
        env = {**os.environ, "PYTHONPATH": str(SERVER_REPO)}
        self.process = subprocess.Popen(argv, cwd=SERVER_REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self.wait_until_ready()

    def wait_until_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"corun serve exited with {self.process.returncode}; see {self.log.name}")
            try:
                reply = requests.get(f"http://127.0.0.1:{self.port}/health", timeout=2)
                if reply.status_code == 200 and reply.json().get("status") == "ok":
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"corun serve not ready in {STARTUP_S} s; see {self.log.name}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class RemoteOpenAIServer:
    """vLLM's fixture's interface (url_for, get_client, get_async_client, host, port, url_root)."""

    DUMMY_API_KEY = "token-abc123"

    def __init__(self, model: str, vllm_serve_args: list[str], *, env_dict=None, seed=0, auto_port=True,
                 max_wait_seconds=None, override_hf_configs=None, **kwargs):
        self.model_name = model
        self.vllm_args = list(vllm_serve_args)
        flags, self.ignored_args = corun_flags(self.vllm_args)
        self.show_hidden_metrics = any(a.startswith("--show-hidden-metrics-for-version") for a in self.vllm_args)
        key = (model, tuple(flags))
        fresh = any(name in caller_module() for name in FRESH_SERVER_MODULES)
        if fresh or key not in _shared:
            server = CorunServer(model, flags)
            if fresh:
                self._own = server
            else:
                _shared[key] = server
        self._server = self.__dict__.get("_own") or _shared[key]
        self.host, self.port = "127.0.0.1", self._server.port

    def __enter__(self) -> RemoteOpenAIServer:
        return self

    def __exit__(self, *exc_info) -> None:
        if "_own" in self.__dict__:
            self._own.stop()

    @property
    def url_root(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, *parts: str) -> str:
        return self.url_root + "/" + "/".join(parts)

    def get_client(self, **kwargs) -> openai.OpenAI:
        kwargs.setdefault("timeout", 600)
        return openai.OpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs)

    def get_async_client(self, **kwargs) -> openai.AsyncOpenAI:
        kwargs.setdefault("timeout", 600)
        return openai.AsyncOpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0,
                                  **kwargs)


def caller_module() -> str:
    """The vendored test file that made the server (its fixture's module)."""
    frame = sys._getframe(1)
    while frame is not None and "/tests/entrypoints/" not in frame.f_code.co_filename:
        frame = frame.f_back
    return frame.f_code.co_filename if frame is not None else ""


def stop_shared_servers() -> None:
    for server in _shared.values():
        server.stop()
    _shared.clear()
