"""`corun serve` itself: starts P + D + router, serves the official client (chat included), stops all on SIGTERM."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import openai
import pytest

from cli.main import main
from launch.cluster import check_model
from launch.local import free_port
from tests.launch.cluster_client import NODE_START_DEADLINE_S, child_pids, wait_for_line
from wire.config import EngineConfig, SchedulerConfig


def test_corun_serve_serves_chat_and_stops_everything_on_sigterm(tiny_model_dir):
    port = free_port("127.0.0.1")
    argv = [sys.executable, "-m", "cli.main", "serve", "--model", tiny_model_dir, "--prefill", "1", "--decode", "1",
            "--max-num-seqs", "8", "--max-model-len", "256", "--kv-cache-mib", "32", "--port", str(port)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        wait_for_line(process, "CoRun cluster ready", timeout_s=NODE_START_DEADLINE_S)
        children = child_pids(process.pid)
        assert len(children) == 3  # prefill, decode, router
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
        # NOTE: the model's name is --model as given (vLLM's default served name)
        chat = api.chat.completions.create(model=tiny_model_dir, messages=[{"role": "user", "content": "Hello there"}],
                                           max_tokens=8, temperature=0.6, seed=7, logprobs=True, top_logprobs=2)
        again = api.chat.completions.create(model=tiny_model_dir, messages=[{"role": "user", "content": "Hello there"}],
                                            max_tokens=8, temperature=0.6, seed=7, logprobs=True, top_logprobs=2)
        assert chat.choices[0].message.content == again.choices[0].message.content
        assert chat.choices[0].logprobs == again.choices[0].logprobs and chat.system_fingerprint
        assert [m.id for m in api.models.list().data] == [tiny_model_dir]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        time.sleep(0.5)
        assert [pid for pid in children if os.path.exists(f"/proc/{pid}")] == []
    finally:
        if process.poll() is None:
            process.kill()


def serve_errors(argv: list[str], timeout_s: float = 120) -> tuple[int, list[str], float]:
    """`corun serve ARGV` run to its exit: (exit code, stderr lines other than logging, seconds)."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "cli.main", "serve", *argv], capture_output=True, text=True,
                          timeout=timeout_s)
    lines = [line for line in done.stderr.splitlines() if " INFO " not in line]
    return done.returncode, lines, time.monotonic() - start


def test_a_wrong_model_or_a_busy_port_is_one_line_before_any_node_starts(tiny_model_dir, tmp_path):
    code, lines, _ = serve_errors(["--model", str(tmp_path / "missing")])
    assert code == 2 and lines == [f"corun serve: error: --model {tmp_path / 'missing'}: no such directory (the "
                                   f"built-in tiny model: `corun make-tiny-model {tmp_path / 'missing'}`)"]
    code, lines, _ = serve_errors(["--model", "random:qwen3-8b"])
    assert code == 2 and lines == ["corun serve: error: --model random:qwen3-8b: a preset without a tokenizer (for "
                                   "`corun bench` and LLM(...)); to serve its shape, write it as a model directory: "
                                   "`corun make-random-model qwen3-8b DIR`, then --model DIR"]
    code, lines, _ = serve_errors(["--model", str(tmp_path)])
    assert code == 2 and lines == [f"corun serve: error: --model {tmp_path}: no config.json, tokenizer.json, "
                                   "*.safetensors there (an HF-format checkpoint directory)"]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, lines, _ = serve_errors(["--model", tiny_model_dir, "--port", str(port)])
    assert code == 2 and len(lines) == 1 and f"cannot serve on 127.0.0.1:{port}" in lines[0]


def test_the_launcher_refuses_a_max_model_len_beyond_the_model_s_context(tiny_model_dir):
    """check_model, which `corun serve` runs before any process starts: the nodes' own check (corun/device_facts.py)
    came only once the router listened, which answered 503 meanwhile. Inverse: the context itself is served."""
    check_model(EngineConfig(model=tiny_model_dir, scheduler=SchedulerConfig(max_model_len=2048)))
    with pytest.raises(ValueError, match=r"^--max-model-len 999999 is longer than the model's context, 2048 "
                                         r"\(max_position_embeddings in config.json of .*\): give at most 2048$"):
        check_model(EngineConfig(model=tiny_model_dir, scheduler=SchedulerConfig(max_model_len=999999)))


@pytest.mark.parametrize("flags, message", [
    (["--max-num-seqs", "0"], "max_num_seqs must be >= 1, got 0"),
    (["--max-model-len", "0"], "max_model_len must be >= 1, got 0"),
    (["--max-model-len", "999999"], "--max-model-len 999999 is longer than the model's context, 2048"),
])
def test_settings_the_nodes_cannot_serve_are_one_line_before_any_process_starts(tiny_model_dir, monkeypatch, capsys,
                                                                                flags, message):
    started = []
    monkeypatch.setattr("launch.local.serve_forever", started.append)
    assert main(["serve", "--model", tiny_model_dir, "--port", str(free_port("127.0.0.1")), *flags]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"corun serve: error: {message}") and error.count("\n") == 1 and started == []


def test_a_node_that_fails_at_start_up_is_one_line_per_process(tiny_model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    code, lines, seconds = serve_errors(["--model", str(broken), "--port", str(free_port("127.0.0.1"))])
    assert code == 2 and not any("Traceback" in line for line in lines), lines
    # NOTE: whichever node fails first is named; the launcher then stops the other, which may not have printed yet
    failed = re.fullmatch(r"corun serve: error: ((prefill|decode)-0) exited with code 2 during start-up "
                          r"\(its message is above\)", lines[-1])
    assert failed, lines
    assert any(line.startswith(f"{failed[2]}_node {failed[1]}: error: ") for line in lines), lines
    assert seconds < 60  # NOTE: not the 180 s start-up timeout
