"""What a model runner sets up follows what its node runs: a decode node never prefills (its prompts' KV is read from
prefill nodes), a prefill node never decodes, and only a runner that does both (the engine, a colocated node)
joins a decode step to a prefill forward. The probes a runner would never use are not run: each is made to fail
here, so a runner that ran one would not start."""

import pytest

import corun.model_runner as model_runner
from corun.model_runner import ModelRunner
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

T = 96


@pytest.fixture(scope="module")
def config(tiny_model_dir) -> EngineConfig:
    return EngineConfig(model=tiny_model_dir, num_threads=1, scheduler=SchedulerConfig(
        max_num_seqs=8, max_model_len=256, prefill_chunk_size=32, prefill_pack_tokens=T, prefill_pack_seqs=4,
        prefill_pack_sizes=(32, 64), decode_step_sizes=(4,)), cache=CacheConfig(num_blocks=300))


def never(name: str):
    def fail(*_args, **_kwargs):
        raise AssertionError(f"{name} ran on a runner that never uses it")
    return fail


def test_a_decode_only_runner_runs_no_prefill_probe_and_still_decodes(config, monkeypatch):
    for probe in ("equivalent_pack_sizes", "several_chunks_match", "verified_joined_shapes"):
        monkeypatch.setattr(model_runner, probe, never(probe))
    runner = ModelRunner(config, runs_prefill=False)
    assert runner.pack_sizes == [T] and not runner.multi_chunk_prefill and runner.joined_shapes == set()
    assert runner.prefill_path == "none (decode only)" and not runner.decode_rides_prefill
    assert runner.decode_sizes[-1] == 8  # NOTE: its decode sizes are probed as before (4 kept where it matches)


def test_a_prefill_only_runner_runs_no_decode_probe(config, monkeypatch):
    for probe in ("equivalent_decode_sizes", "verified_joined_shapes"):
        monkeypatch.setattr(model_runner, probe, never(probe))
    runner = ModelRunner(config, runs_decode=False)
    assert runner.decode_sizes == [8] and runner.joined_shapes == set()
    assert runner.prefill_path.startswith(f"packed-T{T}")


def test_inverse_a_runner_that_does_both_runs_every_probe(config, monkeypatch):
    """Proves the two tests above can fail: the same probes made to fail stop a runner that both prefills and
    decodes (the engine's), which needs them all."""
    for probe in ("equivalent_pack_sizes", "equivalent_decode_sizes", "verified_joined_shapes"):
        monkeypatch.setattr(model_runner, probe, never(probe))
        with pytest.raises(AssertionError, match=probe):
            ModelRunner(config)
        monkeypatch.undo()
