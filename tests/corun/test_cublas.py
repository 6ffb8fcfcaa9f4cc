"""The cuBLAS split-K setting: applied to the process before CUDA starts, reported as it is in effect after."""

import logging

import pytest

from corun import cublas
from corun.cublas import NO_WORKSPACE, apply_cublas_split_k, split_k_in_effect


@pytest.fixture
def clean_env(monkeypatch):
    for name in NO_WORKSPACE:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cublas.torch.cuda, "is_initialized", lambda: False)
    return monkeypatch


def test_off_sets_no_workspace_before_cuda_starts(clean_env):
    assert split_k_in_effect()
    assert apply_cublas_split_k(False) is False
    assert not split_k_in_effect()
    assert all(cublas.os.environ[name] == value for name, value in NO_WORKSPACE.items())


def test_on_takes_the_workspace_setting_back(clean_env):
    apply_cublas_split_k(False)
    assert apply_cublas_split_k(True) is True
    assert split_k_in_effect()
    assert not any(name in cublas.os.environ for name in NO_WORKSPACE)


def test_after_cuda_started_reports_what_is_in_effect(clean_env, caplog):
    clean_env.setattr(cublas.torch.cuda, "is_initialized", lambda: True)
    with caplog.at_level(logging.WARNING):
        assert apply_cublas_split_k(False) is True  # NOTE: torch already chose its workspace; nothing changes
    assert split_k_in_effect()
    assert "after CUDA started" in caplog.text


def test_the_fingerprint_follows_the_setting_in_effect(clean_env):
    from node_core.serving import engine_fingerprint
    from wire.config import EngineConfig

    config = EngineConfig(model="m", device="cuda")
    clean_env.setattr("node_core.serving.torch.cuda.get_device_name", lambda: "gpu")
    with_split_k = engine_fingerprint(config, "digest")
    apply_cublas_split_k(False)
    assert engine_fingerprint(config, "digest") != with_split_k


def test_an_engine_on_cuda_applies_it_before_its_device_questions_start_cuda(clean_env):
    """resolved_on_device asks the GPU its capability and memory, which starts CUDA (torch's lazy init); every
    engine and node resolves through it first. Inverse: the vLLM backend leaves the process's setting alone."""
    from types import SimpleNamespace

    from corun.device_facts import resolved_on_device
    from wire.config import EngineConfig

    started = []

    def start_cuda(*_):
        started.append(split_k_in_effect())  # NOTE: what torch would fix for the process now
        clean_env.setattr(cublas.torch.cuda, "is_initialized", lambda: True)
        return SimpleNamespace(name="NVIDIA H200", total_memory=140 * 2**30, major=9, minor=0)

    clean_env.setattr(cublas.torch.cuda, "is_available", lambda: True)
    clean_env.setattr(cublas.torch.cuda, "get_device_properties", start_cuda)
    clean_env.setattr(cublas.torch.cuda, "get_device_capability", lambda *_: (start_cuda(), (9, 0))[1])
    resolved_on_device(EngineConfig(model="random:qwen3-8b", device="cuda"))
    assert started and started[0] is False and not split_k_in_effect()

    for name in NO_WORKSPACE:
        clean_env.delenv(name, raising=False)
    clean_env.setattr(cublas.torch.cuda, "is_initialized", lambda: False)
    started.clear()
    resolved_on_device(EngineConfig(model="random:qwen3-8b", device="cuda", backend="vllm"))
    assert started[0] is True


@pytest.mark.gpu
def test_an_engine_built_in_a_fresh_process_runs_without_split_k():
    """As a user builds one (LLM(...) in a process that has not touched CUDA): the default is in effect, and the 8B
    shape's decode sizes below 128 rows, which verify only without split-K, are kept."""
    import subprocess
    import sys

    script = ("from corun.llm import LLM; from corun.cublas import split_k_in_effect; "
              "llm = LLM(model='random:qwen3-8b', device='cuda', max_num_seqs=64, max_model_len=512, "
              "kv_cache_memory_bytes=2 << 30); "
              "print(split_k_in_effect(), min(llm.engine.runner.decode_graph.sizes))")
    env = {name: value for name, value in cublas.os.environ.items() if name not in NO_WORKSPACE}
    answer = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=400)
    assert answer.returncode == 0, answer.stderr[-3000:]
    split_k, smallest = answer.stdout.split()[-2:]
    assert split_k == "False" and int(smallest) < 128, answer.stdout
