"""One copy of the model's weights for the nodes on one GPU (or one CPU host), where each would load its own.

1P1D on one GPU runs a prefill and a decode process. Each loaded the weights: on an H100 (8B shape, bf16) the second
copy's 16.4 GB came out of the decode node's KV cache, which then held 22.9 GB where the engine alone holds 49.5 GB
(benchmarks/results/h100_front_door_1p1d_swap_stop52.json). Here one node (the exporter, the launcher's pick:
launch/cluster.py weights_sharing) loads them and publishes them; the others on its GPU (importers) map the same
memory and load nothing. The bytes are the same, so outputs are too.

- CUDA: every parameter's storage goes out as torch's CUDA IPC description (UntypedStorage._share_cuda_, what
  torch.multiprocessing sends) and comes back through torch.multiprocessing.reductions.rebuild_cuda_tensor. The
  memory stays the exporter's: once it ends, the driver frees it and may give it to another allocation. So an
  importer watches it (WeightsWatch): after each step has run on the GPU and before the node sends anything the step
  made, it checks the exporter has not begun to exit; if it has, the node stops. An exporter that has not begun to
  exit after the step ended was alive, its memory its weights, for the whole step.
- CPU: the exporter moves its parameters into one file it maps shared (beside the manifest, in the launcher's
  private directory) and the importers map the same file. Its pages outlive either process: nothing is watched.

The manifest (SharedWeightsManifest: versioned, validated on reading) is written whole, by rename, once every
parameter is published; an importer waits for one whose exporter is alive (a restarted exporter writes a new one).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Literal

import msgspec
import torch

from wire.config import SharedWeightsConfig
from wire.cuda_ipc import ProcessWatch, SharedCudaTensor, dtype_name, own_start_ticks

logger = logging.getLogger(__name__)

MANIFEST_VERSION = 1
FILE_ALIGNMENT = 64
"""Bytes: where each parameter starts in the CPU file (a multiple of every element size; cache-line aligned)."""
MANIFEST_POLL_S = 0.2
"""How often an importer looks for a live exporter's manifest."""


class SharedWeightsError(RuntimeError):
    """A node cannot use the weights it was told to import (no manifest in time, another model, an ended exporter)."""


class SharedTensor(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    dtype: str
    shape: list[int]
    cuda: SharedCudaTensor | None = None
    """CUDA: its storage's IPC handle and where it lies in it."""
    file_offset: int | None = None
    """CPU: where the tensor's bytes (contiguous) start in the data file."""


class SharedWeightsManifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    version: int
    model: str
    dtype: str
    device_type: Literal["cuda", "cpu"]
    exporter_pid: int
    exporter_start_ticks: int
    """/proc/PID/stat's start time of the exporter: a pid the kernel gave to another process since does not match."""
    tensors: list[SharedTensor]
    data_file: str | None = None
    data_bytes: int = 0


class WeightsWatch(ProcessWatch):
    """An importer's check that the exporter whose CUDA memory holds its weights has not begun to exit."""

    def check(self) -> None:
        """Raise SharedWeightsError once the exporter has begun to exit: call it after a step's outputs are read from
        the GPU and before they leave the node."""
        if not self.alive():
            raise SharedWeightsError(
                f"the node whose GPU memory holds this node's weights (pid {self.pid}) has ended: this node stops "
                f"before sending anything its last step computed (the launcher starts it again once that node has "
                f"published its weights anew)")


def export_weights(model: torch.nn.Module, config: SharedWeightsConfig, model_name: str, dtype: str) -> None:
    """Publish model's parameters at config.rendezvous (on CPU, after moving them into the shared file)."""
    params = dict(model.named_parameters())
    device_type = next(iter(params.values())).device.type
    if device_type == "cuda":
        torch.cuda.synchronize()  # NOTE: the loading's writes are done before anyone may read
        tensors, data_file, data_bytes = [cuda_entry(name, t) for name, t in params.items()], None, 0
    else:
        data_file = f"{config.rendezvous}.data"
        tensors, data_bytes = move_into_file(params, data_file)
    manifest = SharedWeightsManifest(MANIFEST_VERSION, model_name, dtype, device_type, os.getpid(),
                                     own_start_ticks(), tensors, data_file, data_bytes)
    path = Path(config.rendezvous)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_bytes(msgspec.msgpack.encode(manifest))
    os.replace(partial, path)
    logger.info("published %d weight tensors (%.2f GiB) at %s for the nodes on this %s", len(tensors),
                sum(t.numel() * t.element_size() for t in params.values()) / 2**30, path, device_type.upper())


def cuda_entry(name: str, tensor: torch.Tensor) -> SharedTensor:
    shape, dtype = list(tensor.shape), dtype_name(tensor.dtype)
    return SharedTensor(name, dtype, shape, cuda=SharedCudaTensor.of(
        dtype, shape, list(tensor.stride()), tensor.storage_offset(), tensor.untyped_storage()._share_cuda_()))


def move_into_file(params: dict[str, torch.nn.Parameter], data_file: str) -> tuple[list[SharedTensor], int]:
    """Copy every parameter into one shared file mapping and make the parameter a view of its slot."""
    offsets, total = {}, 0
    for name, param in params.items():
        offsets[name] = total
        total += -(-param.numel() * param.element_size() // FILE_ALIGNMENT) * FILE_ALIGNMENT
    with contextlib.suppress(FileNotFoundError):  # NOTE: an ended exporter's file: its importers keep their mapping
        os.unlink(data_file)
    data = torch.from_file(data_file, shared=True, size=max(total, 1), dtype=torch.uint8)
    entries = []
    for name, param in params.items():
        slot = file_view(data, offsets[name], param.dtype, list(param.shape))
        slot.copy_(param.data)
        param.data = slot
        entries.append(SharedTensor(name, dtype_name(param.dtype), list(param.shape), file_offset=offsets[name]))
    return entries, total


def file_view(data: torch.Tensor, offset: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    return data[offset:offset + nbytes].view(dtype).view(shape)


def read_manifest(path: Path) -> SharedWeightsManifest | None:
    """The manifest at path, None while there is none; SharedWeightsError for one this code cannot read."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        manifest = msgspec.msgpack.decode(raw, type=SharedWeightsManifest)
    except msgspec.ValidationError as error:
        raise SharedWeightsError(f"{path}: not a shared-weights manifest this node reads ({error})") from None
    if manifest.version != MANIFEST_VERSION:
        raise SharedWeightsError(f"{path}: manifest version {manifest.version}, this node reads {MANIFEST_VERSION}")
    return manifest


def wait_for_manifest(config: SharedWeightsConfig) -> SharedWeightsManifest:
    """The manifest of a live exporter, waiting up to config.wait_s (the exporter loads its weights first; one that
    ended leaves a manifest a restarted one replaces)."""
    path, deadline = Path(config.rendezvous), time.monotonic() + config.wait_s
    while True:
        manifest = read_manifest(path)
        if manifest is not None and ProcessWatch(manifest.exporter_pid, manifest.exporter_start_ticks).alive():
            return manifest
        if time.monotonic() > deadline:
            what = "no node published" if manifest is None else \
                f"the node that published (pid {manifest.exporter_pid}) has ended and none published"
            raise SharedWeightsError(f"{what} the weights at {path} within {config.wait_s:.0f} s (--weights-wait-s)")
        time.sleep(MANIFEST_POLL_S)


def import_weights(model: torch.nn.Module, config: SharedWeightsConfig, model_name: str, dtype: str,
                   device: str) -> WeightsWatch | None:
    """Give model (built on the meta device) the exporter's parameters; -> the watch its steps must pass (CUDA), or
    None (CPU: the file's pages outlive the exporter)."""
    manifest = wait_for_manifest(config)
    device_type = torch.device(device).type
    if (manifest.model, manifest.dtype, manifest.device_type) != (model_name, dtype, device_type):
        raise SharedWeightsError(
            f"{config.rendezvous} holds {manifest.model} in {manifest.dtype} on {manifest.device_type}; this node "
            f"runs {model_name} in {dtype} on {device_type}")
    expected = {name: (dtype_name(p.dtype), list(p.shape)) for name, p in model.named_parameters()}
    published = {t.name: (t.dtype, t.shape) for t in manifest.tensors}
    if expected != published:
        differ = sorted(name for name in expected.keys() | published.keys()
                        if expected.get(name) != published.get(name))
        raise SharedWeightsError(f"{config.rendezvous}: the published weights differ from this model's at "
                                 f"{differ[:5]}")
    if device_type == "cuda":
        state = {t.name: open_cuda_tensor(t) for t in manifest.tensors}
    else:
        data = torch.from_file(manifest.data_file, shared=True, size=max(manifest.data_bytes, 1), dtype=torch.uint8)
        state = {t.name: file_view(data, t.file_offset, getattr(torch, t.dtype), t.shape) for t in manifest.tensors}
    model.load_state_dict(state, assign=True, strict=False)
    logger.info("mapped %d weight tensors published by pid %d at %s", len(state), manifest.exporter_pid,
                config.rendezvous)
    watch = WeightsWatch(manifest.exporter_pid, manifest.exporter_start_ticks)
    return watch if device_type == "cuda" else None


def open_cuda_tensor(entry: SharedTensor) -> torch.Tensor:
    if entry.cuda is None:
        raise SharedWeightsError(f"{entry.name}: published without a CUDA handle")
    return open_shared_cuda_tensor(entry.cuda)


def open_shared_cuda_tensor(shared: SharedCudaTensor) -> torch.Tensor:
    """The tensor another process on this GPU described (wire/cuda_ipc.py): the same memory, mapped here."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    return rebuild_cuda_tensor(*shared.rebuild_args(torch.Tensor, torch.storage.TypedStorage,
                                                    getattr(torch, shared.dtype), torch.Size(shared.shape)))
