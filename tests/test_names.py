"""One name per concept: the modes (fixed_shape, mixed, batch_invariant) and the engine backends (native, vllm).

The names before issue 22 ("corun" for a mode and a backend, "standard" for a mode) are accepted where a user names
one: the flags, `corun bench`'s mode specs, LLM(...), the config dataclasses. Each becomes the new name there, once
(wire.config.OLD_NAMES), so that nothing past that point compares against an old name: the last test reads every
comparison in the code to keep it so.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from tests.test_layering import ROOT, project_files
from wire.config import (
    OLD_NAMES,
    EngineConfig,
    SchedulerConfig,
    canonical_backend,
    canonical_mode,
    canonical_mode_spec,
)
from wire.engine_args import add_engine_args, engine_args_to_argv, engine_config_from_args

OLD_TO_NEW_MODES = {"corun": "fixed_shape", "standard": "mixed"}
VALID_MODES = "fixed_shape, mixed, batch_invariant"


def test_the_alias_table_maps_each_old_name_to_its_new_one():
    assert OLD_NAMES == {"mode": OLD_TO_NEW_MODES, "backend": {"corun": "native"}}
    for name in ("fixed_shape", "mixed", "batch_invariant"):
        assert canonical_mode(name) == name
    for old, new in OLD_TO_NEW_MODES.items():
        assert canonical_mode(old) == new
    assert canonical_backend("corun") == canonical_backend("native") == "native"
    assert canonical_backend("vllm") == "vllm"


def test_the_configs_keep_only_the_new_names():
    for old, new in OLD_TO_NEW_MODES.items():
        assert SchedulerConfig(mode=old) == SchedulerConfig(mode=new)
        assert SchedulerConfig(mode=old).mode == new
    assert EngineConfig(model="m", backend="corun").backend == "native"
    assert EngineConfig(model="m", backend="corun") == EngineConfig(model="m")


def parse_engine_flags(argv: list[str]) -> EngineConfig:
    parser = argparse.ArgumentParser(prog="corun generate")
    add_engine_args(parser)
    return engine_config_from_args(parser.parse_args(["--model", "m", *argv]))


@pytest.mark.parametrize("old, new", OLD_TO_NEW_MODES.items())
def test_the_flags_take_the_old_names_and_hand_on_the_new_ones(old, new):
    config = parse_engine_flags(["--mode", old, "--engine", "corun"])
    assert (config.scheduler.mode, config.backend) == (new, "native")
    argv = engine_args_to_argv(config)  # NOTE: what the launchers give node processes
    assert argv[argv.index("--mode") + 1] == new and argv[argv.index("--engine") + 1] == "native"
    assert parse_engine_flags(["--mode", new]) == config


def test_an_unknown_mode_is_refused_naming_the_valid_ones(capsys):
    with pytest.raises(ValueError, match=f"mode must be one of {VALID_MODES} \\(old names: corun = fixed_shape, "
                                         "standard = mixed\\), got 'fast'"):
        SchedulerConfig(mode="fast")
    with pytest.raises(ValueError, match="engine backend must be one of native, vllm .*, got 'torch'"):
        EngineConfig(model="m", backend="torch")
    with pytest.raises(SystemExit):
        parser = argparse.ArgumentParser(prog="corun generate")
        add_engine_args(parser)
        parser.parse_args(["--model", "m", "--mode", "fast"])
    error = capsys.readouterr().err
    assert f"argument --mode: mode must be one of {VALID_MODES}" in error and "got 'fast'" in error
    with pytest.raises(ValueError, match=f"mode must be one of {VALID_MODES}"):
        canonical_mode_spec("fast:prefill_token_budget=0")


def test_mode_specs_name_the_new_mode_and_keep_their_settings():
    from benchmarks.harness import scheduler_for

    assert canonical_mode_spec("corun:prefill_buckets=default") == "fixed_shape:prefill_buckets=default"
    assert canonical_mode_spec("standard") == "mixed"
    assert canonical_mode_spec("batch_invariant:piecewise_graphs=off") == "batch_invariant:piecewise_graphs=off"
    old = scheduler_for(SchedulerConfig(), "standard:piecewise_graphs=off")
    assert old == scheduler_for(SchedulerConfig(), "mixed:piecewise_graphs=off") and old.mode == "mixed"


def test_llm_takes_the_old_names(tiny_model_dir):
    from corun import LLM

    llm = LLM(tiny_model_dir, mode="standard", backend="corun", max_num_seqs=2, max_model_len=64)
    assert (llm.config.scheduler.mode, llm.config.backend) == ("mixed", "native")
    assert llm.engine.scheduler.__class__.__name__ == "MixedScheduler"
    with pytest.raises(ValueError, match=f"mode must be one of {VALID_MODES}"):
        LLM(tiny_model_dir, mode="fast")


OLD = frozenset(old for names in OLD_NAMES.values() for old in names)
"""Every old name (a name that must not be compared against past the boundary)."""


def old_name_uses(path: Path) -> list[str]:
    """Where path compares a value against an old name (==, !=, in: `mode != "corun"`, `mode in ("corun", ...)`),
    or passes one as a mode or backend (`SchedulerConfig(mode="corun")`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            constants = [c for operand in (node.left, *node.comparators) for c in ast.walk(operand)]
        elif isinstance(node, ast.keyword) and node.arg in ("mode", "backend"):
            constants = [node.value]
        else:
            continue
        if any(isinstance(c, ast.Constant) and c.value in OLD for c in constants):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_code_compares_against_an_old_name(tmp_path, monkeypatch):
    """Only the alias table (a dict, no comparison) holds the old names. Inverse: the reading finds each kind."""
    assert [use for path in project_files() for use in old_name_uses(path)] == []
    bad = tmp_path / "bad.py"
    bad.write_text('if config.mode == "corun":\n    pass\nok = backend in ("corun", "vllm")\n'
                   'SchedulerConfig(mode="standard")\nSchedulerConfig(mode="mixed")\n')
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert old_name_uses(bad) == ["bad.py:1", "bad.py:3", "bad.py:4"]
