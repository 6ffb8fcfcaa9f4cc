"""What a node's fingerprint holds: the environment that picks CPU kernels, and each setting under one name."""

import os

import corun
from node_core.serving import engine_facts, engine_fingerprint
from wire.config import EngineConfig, SchedulerConfig


def test_the_fingerprint_holds_mkl_s_reproducibility_mode_as_the_environment_has_it(monkeypatch):
    """corun/__init__.py sets MKL_CBWR (strict mode) unless the user set one; either way the engine facts carry the
    value the process runs with, so nodes under another MKL mode get another fingerprint."""
    assert os.environ.get("MKL_CBWR") is not None, "importing corun sets MKL_CBWR when the user set none"
    config = EngineConfig(model="m")
    assert engine_facts(config, "d")["engine"]["mkl_cbwr"] == os.environ["MKL_CBWR"]
    strict = engine_fingerprint(config, "d")
    other = "AUTO" if os.environ["MKL_CBWR"] != "AUTO" else corun.CPU_BLAS_REPRODUCIBILITY
    monkeypatch.setenv("MKL_CBWR", other)
    assert engine_facts(config, "d")["engine"]["mkl_cbwr"] == other
    assert engine_fingerprint(config, "d") != strict


def test_old_names_give_the_fingerprint_of_the_new_ones():
    """A node started with `--mode corun --engine corun` and one with `--mode fixed_shape --engine native` run the
    same engine: the same fingerprint, which names the mode and backend by their new names."""
    old = EngineConfig(model="m", backend="corun", scheduler=SchedulerConfig(mode="corun"))
    new = EngineConfig(model="m", backend="native", scheduler=SchedulerConfig(mode="fixed_shape"))
    assert engine_fingerprint(old, "d") == engine_fingerprint(new, "d")
    facts = engine_facts(old, "d")["engine"]
    assert (facts["backend"], facts["scheduler"]["mode"]) == ("native", "fixed_shape")
    assert engine_fingerprint(EngineConfig(model="m", scheduler=SchedulerConfig(mode="standard")), "d") == \
        engine_fingerprint(EngineConfig(model="m", scheduler=SchedulerConfig(mode="mixed")), "d") != \
        engine_fingerprint(new, "d")
