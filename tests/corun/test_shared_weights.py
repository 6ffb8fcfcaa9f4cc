"""One copy of the weights for the nodes on one GPU or host (corun/shared_weights.py), on CPU: an importing runner's
parameters are the exporter's memory (a write through one shows in the other; a runner with its own copy does not
see it), a manifest of another model or version is refused with a clear error, an importer waits for a live
exporter and gives up after its wait, and the watch sees an exporter end. The CUDA handles: the GPU test at the end.
"""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest
import torch

from corun.kv_sizing import GpuMemory, gpu_kv_budget
from corun.model_runner import ModelRunner
from corun.shared_weights import (
    MANIFEST_VERSION,
    SharedWeightsError,
    WeightsWatch,
    read_manifest,
    wait_for_manifest,
)
from wire.config import GIB, CacheConfig, EngineConfig, SchedulerConfig, SharedWeightsConfig
from wire.cuda_ipc import process_state


def engine(model_dir: str, device: str = "cpu") -> EngineConfig:
    return EngineConfig(model=model_dir, device=device, num_threads=1, use_cuda_graph=False,
                        scheduler=SchedulerConfig(max_num_seqs=4, max_model_len=128, prefill_chunk_size=32,
                                                  decode_step_sizes=(), prefill_pack_tokens=0),
                        cache=CacheConfig(num_blocks=64))


def sharing(tmp_path: Path, holding: str, wait_s: float = 30.0) -> SharedWeightsConfig:
    return SharedWeightsConfig(holding=holding, rendezvous=str(tmp_path / "weights.msgpack"), wait_s=wait_s)


def test_an_importer_s_parameters_are_the_exporter_s_memory(tiny_model_dir, tmp_path):
    exporter = ModelRunner(engine(tiny_model_dir), weights=sharing(tmp_path, "export"))
    importer = ModelRunner(engine(tiny_model_dir), weights=sharing(tmp_path, "import"))
    own = ModelRunner(engine(tiny_model_dir))
    exported, imported = dict(exporter.model.named_parameters()), dict(importer.model.named_parameters())
    assert exported.keys() == imported.keys()
    for name, param in exported.items():
        assert imported[name].device.type == "cpu" and imported[name].dtype == param.dtype
        assert torch.equal(imported[name], param), f"{name}: the importer does not hold the exporter's values"
        assert torch.equal(param, dict(own.model.named_parameters())[name]), f"{name}: export changed the weights"
    assert importer.weights_watch is None  # NOTE: on CPU the file's pages outlive the exporter
    name = "layers.0.mlp.down_proj.weight"
    before = imported[name][0, 0].item()
    exported[name].data[0, 0] = 7.0
    assert imported[name][0, 0].item() == 7.0 != before, "the importer holds a copy, not the exporter's memory"
    assert dict(own.model.named_parameters())[name][0, 0].item() == before, \
        "inverse: a runner with its own weights does not see the write, so the check above can fail"


def write_manifest(tmp_path: Path, **fields) -> Path:
    path = tmp_path / "weights.msgpack"
    manifest = {"version": MANIFEST_VERSION, "model": "m", "dtype": "float32", "device_type": "cpu",
                "exporter_pid": os.getpid(), "exporter_start_ticks": process_state(os.getpid()).start_ticks,
                "tensors": [], **fields}
    path.write_bytes(msgspec.msgpack.encode(manifest))
    return path


def test_a_manifest_of_another_version_or_shape_is_refused(tmp_path):
    with pytest.raises(SharedWeightsError, match="version 99, this node reads"):
        read_manifest(write_manifest(tmp_path, version=99))
    with pytest.raises(SharedWeightsError, match="not a shared-weights manifest"):
        read_manifest(write_manifest(tmp_path, exporter_pid="one"))
    (tmp_path / "weights.msgpack").write_bytes(b"\x00garbage")
    with pytest.raises(SharedWeightsError, match="not a shared-weights manifest"):
        read_manifest(tmp_path / "weights.msgpack")
    assert read_manifest(tmp_path / "absent.msgpack") is None


def test_an_importer_of_another_model_is_refused(tiny_model_dir, two_layer_tiny_model_dir, tmp_path):
    ModelRunner(engine(tiny_model_dir), weights=sharing(tmp_path, "export"))
    with pytest.raises(SharedWeightsError, match="holds .* this node runs"):
        ModelRunner(engine(two_layer_tiny_model_dir), weights=sharing(tmp_path, "import"))
    manifest = read_manifest(tmp_path / "weights.msgpack")
    renamed = msgspec.structs.replace(manifest, model=two_layer_tiny_model_dir)
    (tmp_path / "weights.msgpack").write_bytes(msgspec.msgpack.encode(renamed))
    with pytest.raises(SharedWeightsError, match="differ from this model's at"):
        ModelRunner(engine(two_layer_tiny_model_dir), weights=sharing(tmp_path, "import"))


def ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_an_importer_waits_for_a_live_exporter_and_gives_up_after_its_wait(tmp_path):
    with pytest.raises(SharedWeightsError, match="no node published the weights .* within"):
        wait_for_manifest(sharing(tmp_path, "import", wait_s=0.3))
    write_manifest(tmp_path, exporter_pid=ended_pid())
    with pytest.raises(SharedWeightsError, match="has ended and none published"):
        wait_for_manifest(sharing(tmp_path, "import", wait_s=0.3))
    # NOTE: a restarted exporter replaces the file while the importer waits
    threading.Timer(0.3, write_manifest, args=(tmp_path,)).start()
    started = time.monotonic()
    assert wait_for_manifest(sharing(tmp_path, "import")).exporter_pid == os.getpid()
    assert time.monotonic() - started >= 0.25


def test_the_watch_sees_its_exporter_end_and_a_reused_pid():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = WeightsWatch(child.pid, process_state(child.pid).start_ticks)
        watch.check()
        assert not WeightsWatch(child.pid, process_state(child.pid).start_ticks + 1).alive(), \
            "a process started at another time holds that pid now"
    finally:
        child.kill()
        child.wait()
    with pytest.raises(SharedWeightsError, match=f"pid {child.pid}"):
        watch.check()


def test_the_gpu_s_pool_counts_shared_weights_once():
    weights, reserve = 16 * GIB, 6 * GIB
    exporter = GpuMemory(total_bytes=80 * GIB, free_bytes=60 * GIB, reserved_bytes=weights + GIB)
    importer = GpuMemory(total_bytes=80 * GIB, free_bytes=60 * GIB, reserved_bytes=GIB)
    own = gpu_kv_budget(exporter, 1.0, reserve, gpu_nodes=2)
    assert own == 80 * GIB - 2 * (weights + GIB + reserve)
    for memory, holds in ((exporter, True), (importer, False)):
        shared = gpu_kv_budget(memory, 1.0, reserve, 2, 1.0, shared_weight_bytes=weights, holds_shared_weights=holds)
        assert shared == min(80 * GIB - weights - 2 * (GIB + reserve), 60 * GIB - reserve)
        assert shared - own == min(weights, shared - own)  # NOTE: one copy more of KV, never more than is free


@pytest.mark.gpu
def test_cuda_weights_published_by_one_process_are_read_by_another(tmp_path):
    """The CUDA path: a child exports a random model's weights; this process imports them, reads the same values,
    and its watch sees the child end."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    config = sharing(tmp_path, "export")
    script = (
        "import sys, time, torch; from corun.models.loader import load_model; "
        "from corun.shared_weights import export_weights; from wire.config import SharedWeightsConfig; "
        "model = load_model('random:qwen3-tiny', 'bfloat16', 'cuda', 64); "
        f"export_weights(model, SharedWeightsConfig('export', {config.rendezvous!r}), 'random:qwen3-tiny', "
        "'bfloat16'); "
        "print(float(model.norm.weight.float().sum()), flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        from corun.models.loader import empty_model, load_model
        from corun.shared_weights import import_weights

        total = float(child.stdout.readline())
        model = empty_model("random:qwen3-tiny", "bfloat16", "cuda", 64)
        watch = import_weights(model, sharing(tmp_path, "import"), "random:qwen3-tiny", "bfloat16", "cuda")
        assert float(model.norm.weight.float().sum()) == total
        own = load_model("random:qwen3-tiny", "bfloat16", "cuda", 64)
        for (name, mine), (_, theirs) in zip(own.named_parameters(), model.named_parameters(), strict=True):
            assert torch.equal(mine, theirs), name
        watch.check()
    finally:
        child.kill()
        child.wait()
    with pytest.raises(SharedWeightsError):
        watch.check()
