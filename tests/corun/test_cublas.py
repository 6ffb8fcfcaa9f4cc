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
