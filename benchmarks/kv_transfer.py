"""KV transfer on one host over NIXL: KVTransferAgent reading one request's blocks vs a raw one-region READ.

    python -m benchmarks.kv_transfer --out benchmarks/results/kv_transfer_cpu.json
    python -m benchmarks.kv_transfer --device cuda --cases qwen3-8b-1024-tokens,qwen3-8b-4096-tokens \
        --zcopy auto,y --layouts scattered,adjacent --ucx-modes none --out benchmarks/results/h200_kv_transfer.json

Two spawned processes: a holder (prefill node) and a reader (decode node), on one device (cpu: DRAM, cuda: both
on GPU 0, VRAM). Per case, UCX error-handling mode, CUDA-IPC zcopy setting (TransferConfig.cuda_ipc_get_zcopy)
and block layout: (a) raw NIXL READ of one contiguous region of the request's size (best of 5 after a warm-up),
(b) KVTransferAgent.start_read + poll of the request's blocks (median of 5 after a warm-up), with a completion
notification like the cluster sends: "scattered" ids over the holder's cache into other scattered ids (one
descriptor per block), or "adjacent" ids on both sides (one descriptor). Each timed read includes creating and
releasing its transfer handle, on both paths. On cuda, a torch device copy of the same bytes is the reference.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import multiprocessing
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from nixl._api import nixl_agent, nixl_agent_config

from tests.transfer.nixl_peers import recv_within
from tests.transfer.scenario import peer_info
from transfer.agent import KVTransferAgent, apply_ucx_environment
from wire.config import CacheConfig, TransferConfig

NUM_TIMED_READS = 5
STEP_TIMEOUT_S = 120.0
FILL_BYTE = 7


@dataclass(frozen=True)
class KVShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    block_size: int = CacheConfig.block_size

    def cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        return (num_blocks, self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)


@dataclass(frozen=True)
class Case:
    name: str
    shape: KVShape
    num_tokens: int
    cache_gib: float = 0.0
    """The size of each side's KV cache (a node's is tens of GB); 0: just enough for the request."""

    @property
    def num_request_blocks(self) -> int:
        return -(-self.num_tokens // self.shape.block_size)

    @property
    def num_cache_blocks(self) -> int:
        """The null block, the request's blocks and a quarter more, so the request's ids can be scattered (or
        cache_gib's worth)."""
        needed = 1 + self.num_request_blocks + max(self.num_request_blocks // 4, 4)
        block = torch.empty(self.shape.cache_shape(1)[1:], dtype=getattr(torch, self.shape.dtype), device="meta")
        return max(needed, int(self.cache_gib * 2**30 // (block.numel() * block.element_size())))


QWEN3_8B = KVShape(num_layers=36, num_kv_heads=8, head_dim=128, dtype="bfloat16")
TINY = KVShape(num_layers=4, num_kv_heads=4, head_dim=32, dtype="float32")
ALL_CASES = {case.name: case for case in (
    Case("qwen3-8b-1024-tokens", QWEN3_8B, 1024), Case("qwen3-8b-4096-tokens", QWEN3_8B, 4096),
    Case("qwen3-8b-16384-tokens", QWEN3_8B, 16384), Case("tiny-100-tokens", TINY, 100))}
DEFAULT_CASES = ("qwen3-8b-1024-tokens", "qwen3-8b-4096-tokens", "tiny-100-tokens")


@dataclass(frozen=True)
class Setting:
    """One measured configuration; the holder and the reader walk the same list."""

    case: Case
    device: str
    ucx_mode: str
    zcopy: str
    layout: str
    holder_poll_ms: float = 0.0
    """How long the holder sleeps between its NIXL calls (0: it calls as fast as it can; a prefill node between
    forwards waits up to 5 ms for a message): shows whether a READ needs the holder's progress."""

    @property
    def label(self) -> str:
        parts = (self.case.name, self.ucx_mode, self.zcopy, self.layout, f"{self.holder_poll_ms:g}",
                 f"{self.case.cache_gib:g}")
        return "-".join(parts)

    def transfer_config(self) -> TransferConfig:
        return TransferConfig(cuda_ipc_get_zcopy=self.zcopy, ucx_error_handling=self.ucx_mode)
NOTES = (
    "ratio_to_raw = raw best seconds / agent median seconds (raw: one descriptor, no notification).",
    "Same host: UCX copies with cma (process_vm_readv) inside start_read, so agent_start_read ~= the whole read.",
    "The holder calls into NIXL about every 1 ms. With ucx_error_handling_mode=peer a read posted with a "
    "notification completes only at the holder's next NIXL call (tiny-100: ~1.1 ms); with none it does not wait.",
)


def new_kv(setting: Setting, fill: int) -> torch.Tensor:
    case = setting.case
    kv = torch.empty(case.shape.cache_shape(case.num_cache_blocks), dtype=getattr(torch, case.shape.dtype),
                     device=setting.device)
    kv.view(torch.uint8).fill_(fill)  # NOTE: touch every page, so no read measures first-touch page faults
    return kv


def request_block_ids(setting: Setting, seed: int) -> list[int]:
    case = setting.case
    if setting.layout == "adjacent":  # NOTE: the reader's and the holder's runs start at different blocks
        first = 1 + seed % (case.num_cache_blocks - case.num_request_blocks - 1)
        return list(range(first, first + case.num_request_blocks))
    order = np.random.default_rng(seed).permutation(np.arange(1, case.num_cache_blocks))
    return [int(b) for b in order[:case.num_request_blocks]]


def new_raw_agent(name: str, region: torch.Tensor, setting: Setting) -> nixl_agent:
    apply_ucx_environment(setting.transfer_config(), vram=region.is_cuda)
    progress = setting.transfer_config().uses_progress_thread(vram=region.is_cuda)
    agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=progress, enable_listen_thread=False, backends=[]))
    agent.create_backend("UCX", {"ucx_error_handling_mode": setting.ucx_mode})
    agent.register_memory(region)
    return agent


# --- holder (prefill) -------------------------------------------------------------------------------------------
def quiet_nixl_logs() -> None:
    # NOTE: nixl logs INFO lines (one per agent and backend) to *stdout*, which would interleave with the JSON
    logging.getLogger("nixl").setLevel(logging.WARNING)


def run_holder(conn, settings: list[Setting]) -> None:
    quiet_nixl_logs()
    for setting in settings:
        kv = new_kv(setting, FILL_BYTE)
        agent = KVTransferAgent(f"prefill-{setting.label}", kv, setting.transfer_config())
        raw_region = torch.full((setting.case.num_request_blocks * agent.block_nbytes,), FILL_BYTE,
                                dtype=torch.uint8, device=setting.device)
        raw_agent = new_raw_agent(f"raw-holder-{setting.label}", raw_region, setting)
        conn.send({"kv": peer_info(agent) | {"device_id": agent.device_id},
                   "raw": (raw_agent.get_agent_metadata(), raw_region.data_ptr())})
        # NOTE: no progress thread: a VRAM READ advances only while the holder calls into NIXL
        recv_within(conn, STEP_TIMEOUT_S, lambda: (agent.new_notifications(), raw_agent.get_new_notifs(),
                                                   time.sleep(setting.holder_poll_ms / 1e3)))
        agent.close()


# --- reader (decode) --------------------------------------------------------------------------------------------
def run_reader(conn, result_conn, settings: list[Setting]) -> None:
    quiet_nixl_logs()
    results = []
    for setting in settings:
        case = setting.case
        info = recv_within(conn, STEP_TIMEOUT_S)
        raw = measure_raw(setting, info["raw"], info["kv"]["block_nbytes"])
        results.append({"case": case.name, "device": setting.device, "ucx_error_handling_mode": setting.ucx_mode,
                        "cuda_ipc_get_zcopy": setting.zcopy, "layout": setting.layout,
                        "holder_poll_ms": setting.holder_poll_ms, "cache_gib": case.cache_gib,
                        **asdict(case.shape),
                        "num_tokens": case.num_tokens, "raw": raw, **measure_agent(setting, info["kv"])})
        results[-1]["ratio_to_raw"] = round(raw["best_seconds"] / results[-1]["agent"]["median_seconds"], 3)
        if setting.device == "cuda":
            results[-1]["device_copy"] = measure_device_copy(results[-1]["bytes"])
        conn.send("next")
    result_conn.send(results)


def measure_device_copy(nbytes: int) -> dict:
    """torch copy of the same bytes on the GPU: what a READ between processes of one GPU could approach."""
    src, dst = torch.ones(nbytes, dtype=torch.uint8, device="cuda"), torch.zeros(nbytes, dtype=torch.uint8,
                                                                                  device="cuda")

    def copy_once() -> None:
        dst.copy_(src)
        torch.cuda.synchronize()

    return time_reads(copy_once)


def measure_raw(setting: Setting, raw_info: tuple[bytes, int], block_nbytes: int) -> dict:
    metadata, remote_address = raw_info
    nbytes = setting.case.num_request_blocks * block_nbytes
    region = torch.zeros(nbytes, dtype=torch.uint8, device=setting.device)
    agent = new_raw_agent(f"raw-reader-{setting.label}", region, setting)
    peer = agent.add_remote_agent(metadata)
    memory = "VRAM" if region.is_cuda else "DRAM"
    local = agent.get_xfer_descs([(region.data_ptr(), nbytes, 0)], memory)
    remote = agent.get_xfer_descs([(remote_address, nbytes, 0)], memory)

    def read_once() -> None:
        handle = agent.initialize_xfer("READ", local, remote, peer)
        state = agent.transfer(handle)
        while state == "PROC":
            state = agent.check_xfer_state(handle)
        agent.release_xfer_handle(handle)
        assert state == "DONE", state

    timing = time_reads(read_once)
    assert bool((region == FILL_BYTE).all()), "raw read did not land"
    return {"bytes": nbytes, **timing}


def measure_agent(setting: Setting, kv_info: dict) -> dict:
    kv = new_kv(setting, 0)
    agent = KVTransferAgent(f"decode-{setting.label}", kv, setting.transfer_config())
    agent.add_peer(**kv_info)
    probe = list(range(1, 1 + min(28, setting.case.num_request_blocks)))  # NOTE: ~64 MB of 8B blocks, as a node
    probe_gbps = agent.probe_read(kv_info["node_id"], probe, probe)
    remote_ids, local_ids = request_block_ids(setting, seed=1), request_block_ids(setting, seed=2)

    post_seconds = []

    def read_once() -> None:
        start = time.perf_counter()
        handle = agent.start_read(kv_info["node_id"], remote_ids, local_ids, b"request-done")
        post_seconds.append(time.perf_counter() - start)
        while agent.poll(handle) == "PROC":
            pass
        assert handle.state == "DONE", handle.state

    timing = time_reads(read_once)
    # NOTE: on one host UCX copies (cma) inside start_read; this shows how much of a read blocks the caller
    timing["start_read_median_seconds"] = round(statistics.median(post_seconds[1:]), 6)
    assert bool((kv[local_ids].view(torch.uint8) == FILL_BYTE).all()), "agent read did not land"
    counters = agent.counters.as_dict()
    agent.close()
    return {"bytes": len(local_ids) * agent.block_nbytes, "num_blocks": len(local_ids),
            "block_nbytes": agent.block_nbytes, "agent": timing, "counters": counters,
            "probe_read_gbps": round(probe_gbps, 3)}


def time_reads(read_once: Callable[[], None]) -> dict:
    """The first read (connection set-up) apart, then NUM_TIMED_READS timed reads."""
    first = _seconds(read_once)
    seconds = [_seconds(read_once) for _ in range(NUM_TIMED_READS)]
    return {"first_read_seconds": round(first, 6), "median_seconds": round(statistics.median(seconds), 6),
            "best_seconds": round(min(seconds), 6), "all_seconds": [round(s, 6) for s in seconds]}


def _seconds(call: Callable[[], None]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


# --- main ---------------------------------------------------------------------------------------------------------
def run_both(settings: list[Setting]) -> list[dict]:
    context = multiprocessing.get_context("spawn")
    holder_conn, reader_conn = context.Pipe()
    result_recv, result_send = context.Pipe(duplex=False)
    processes = [context.Process(target=run_holder, args=(holder_conn, settings), daemon=True),
                 context.Process(target=run_reader, args=(reader_conn, result_send, settings), daemon=True)]
    try:
        for process in processes:
            process.start()
        return recv_within(result_recv, STEP_TIMEOUT_S * len(settings))
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()


def summarize(results: list[dict]) -> list[dict]:
    """One line per case: bytes, seconds, GB/s (1e9 bytes/s), ratio to raw."""
    return [{"case": r["case"], "device": r["device"], "ucx_error_handling_mode": r["ucx_error_handling_mode"],
             "cuda_ipc_get_zcopy": r["cuda_ipc_get_zcopy"], "layout": r["layout"],
             "holder_poll_ms": r["holder_poll_ms"], "cache_gib": r["cache_gib"], "bytes": r["bytes"],
             "descriptors": r["counters"]["descriptors_posted"] // (NUM_TIMED_READS + 1),
             "probe_read_gbps": r["probe_read_gbps"],
             "device_copy_gb_per_s": round(r["bytes"] / r["device_copy"]["best_seconds"] / 1e9, 3)
             if "device_copy" in r else None,
             "agent_median_seconds": r["agent"]["median_seconds"],
             "agent_gb_per_s": round(r["bytes"] / r["agent"]["median_seconds"] / 1e9, 3),
             "raw_best_seconds": r["raw"]["best_seconds"],
             "raw_gb_per_s": round(r["bytes"] / r["raw"]["best_seconds"] / 1e9, 3),
             "ratio_to_raw": r["ratio_to_raw"], "agent_first_read_seconds": r["agent"]["first_read_seconds"],
             "agent_start_read_median_seconds": r["agent"]["start_read_median_seconds"]}
            for r in results]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results/kv_transfer_cpu.json")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"of {', '.join(ALL_CASES)}")
    parser.add_argument("--ucx-modes", default="none,peer")
    parser.add_argument("--zcopy", default="y", help="TransferConfig.cuda_ipc_get_zcopy values (cuda only)")
    parser.add_argument("--layouts", default="scattered", help="scattered (a descriptor per block), adjacent")
    parser.add_argument("--holder-poll-ms", default="0", help="comma-separated: the holder's sleep between NIXL calls")
    parser.add_argument("--cache-gib", default="0", help="comma-separated: each side's KV cache GiB (0: the request's)")
    args = parser.parse_args()
    settings = [Setting(dataclasses.replace(ALL_CASES[name], cache_gib=float(gib)), args.device, mode, zcopy, layout,
                        float(poll)) for gib in args.cache_gib.split(",")
                for name in args.cases.split(",") for mode in args.ucx_modes.split(",")
                for zcopy in args.zcopy.split(",") for layout in args.layouts.split(",")
                for poll in args.holder_poll_ms.split(",")]
    results = run_both(settings)
    report = {"host": {"machine": platform.machine(), "num_cpus": multiprocessing.cpu_count(),
                       "python": platform.python_version(), "torch": torch.__version__,
                       "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None},
              "command": vars(args),
              "method": __doc__.strip().splitlines()[0], "notes": NOTES, "num_timed_reads": NUM_TIMED_READS,
              "summary": summarize(results), "cases": results}
    text = json.dumps(report, indent=2)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
