"""`corun serve` itself: starts P + D + router, serves the official client (chat included), stops all on SIGTERM."""

import os
import signal
import subprocess
import sys
import time

import openai

from launch.local import free_port
from tests.launch.cluster_client import child_pids, wait_for_line


def test_corun_serve_serves_chat_and_stops_everything_on_sigterm(tiny_model_dir):
    port = free_port("127.0.0.1")
    argv = [sys.executable, "-m", "cli.main", "serve", "--model", tiny_model_dir, "--prefill", "1", "--decode", "1",
            "--max-num-seqs", "8", "--max-model-len", "256", "--kv-cache-mib", "32", "--port", str(port)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        wait_for_line(process, "CoRun cluster ready", timeout_s=120)
        children = child_pids(process.pid)
        assert len(children) == 3  # prefill, decode, router
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
        chat = api.chat.completions.create(model="corun-tiny", messages=[{"role": "user", "content": "Hello there"}],
                                           max_tokens=8, temperature=0.6, seed=7, logprobs=True, top_logprobs=2)
        again = api.chat.completions.create(model="corun-tiny", messages=[{"role": "user", "content": "Hello there"}],
                                            max_tokens=8, temperature=0.6, seed=7, logprobs=True, top_logprobs=2)
        assert chat.choices[0].message.content == again.choices[0].message.content
        assert chat.choices[0].logprobs == again.choices[0].logprobs and chat.system_fingerprint
        assert [m.id for m in api.models.list().data] == ["corun-tiny"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        time.sleep(0.5)
        assert [pid for pid in children if os.path.exists(f"/proc/{pid}")] == []
    finally:
        if process.poll() is None:
            process.kill()
