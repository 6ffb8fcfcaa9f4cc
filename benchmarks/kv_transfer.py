"""KV transfer on one host over NIXL: KVTransferAgent reading one request's blocks vs a raw one-region READ.

    python -m benchmarks.kv_transfer --out benchmarks/results/kv_transfer_cpu.json

Two spawned processes: a holder (prefill node) and a reader (decode node). Per case and UCX error-handling
mode: (a) raw NIXL DRAM->DRAM READ of one contiguous region of the request's size (best of 5 after a warm-up),
(b) KVTransferAgent.start_read + poll of the request's blocks, scattered over the holder's cache and landing in
other scattered blocks (median of 5 after a warm-up), with a completion notification like the cluster sends.
Each timed read includes creating and releasing its transfer handle, on both paths.
"""

from __future__ import annotations

import argparse
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
from transfer.agent import KVTransferAgent

NUM_TIMED_READS = 5
STEP_TIMEOUT_S = 120.0
FILL_BYTE = 7


@dataclass(frozen=True)
class KVShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    block_size: int = 16

    def cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        return (num_blocks, self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)


@dataclass(frozen=True)
class Case:
    name: str
    shape: KVShape
    num_tokens: int

    @property
    def num_request_blocks(self) -> int:
        return -(-self.num_tokens // self.shape.block_size)

    @property
    def num_cache_blocks(self) -> int:
        """The null block, the request's blocks and a quarter more, so the request's ids can be scattered."""
        return 1 + self.num_request_blocks + max(self.num_request_blocks // 4, 4)


QWEN3_8B = KVShape(num_layers=36, num_kv_heads=8, head_dim=128, dtype="bfloat16")
TINY = KVShape(num_layers=4, num_kv_heads=4, head_dim=32, dtype="float32")
CASES = (Case("qwen3-8b-1024-tokens", QWEN3_8B, 1024), Case("qwen3-8b-4096-tokens", QWEN3_8B, 4096),
         Case("tiny-100-tokens", TINY, 100))
UCX_MODES = ("none", "peer")
NOTES = (
    "ratio_to_raw = raw best seconds / agent median seconds (raw: one descriptor, no notification).",
    "Same host: UCX copies with cma (process_vm_readv) inside start_read, so agent_start_read ~= the whole read.",
    "The holder calls into NIXL about every 1 ms. With ucx_error_handling_mode=peer a read posted with a "
    "notification completes only at the holder's next NIXL call (tiny-100: ~1.1 ms); with none it does not wait.",
)


def new_kv(case: Case, fill: int) -> torch.Tensor:
    kv = torch.empty(case.shape.cache_shape(case.num_cache_blocks), dtype=getattr(torch, case.shape.dtype))
    kv.view(torch.uint8).fill_(fill)  # NOTE: touch every page, so no read measures first-touch page faults
    return kv


def scattered_block_ids(case: Case, seed: int) -> list[int]:
    order = np.random.default_rng(seed).permutation(np.arange(1, case.num_cache_blocks))
    return [int(b) for b in order[:case.num_request_blocks]]


def new_raw_agent(name: str, region: torch.Tensor, ucx_mode: str) -> nixl_agent:
    agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False, enable_listen_thread=False, backends=[]))
    agent.create_backend("UCX", {"ucx_error_handling_mode": ucx_mode})
    agent.register_memory(region)
    return agent


# --- holder (prefill) -------------------------------------------------------------------------------------------
def quiet_nixl_logs() -> None:
    # NOTE: nixl logs INFO lines (one per agent and backend) to *stdout*, which would interleave with the JSON
    logging.getLogger("nixl").setLevel(logging.WARNING)


def run_holder(conn) -> None:
    quiet_nixl_logs()
    for case in CASES:
        for ucx_mode in UCX_MODES:
            kv = new_kv(case, FILL_BYTE)
            agent = KVTransferAgent(f"prefill-{case.name}-{ucx_mode}", kv, ucx_mode)
            raw_region = torch.full((case.num_request_blocks * agent.block_nbytes,), FILL_BYTE, dtype=torch.uint8)
            raw_agent = new_raw_agent(f"raw-holder-{case.name}-{ucx_mode}", raw_region, ucx_mode)
            conn.send({"kv": peer_info(agent), "raw": (raw_agent.get_agent_metadata(), raw_region.data_ptr())})
            recv_within(conn, STEP_TIMEOUT_S, lambda: (agent.new_notifications(), raw_agent.get_new_notifs()))
            agent.close()


# --- reader (decode) --------------------------------------------------------------------------------------------
def run_reader(conn, result_conn) -> None:
    quiet_nixl_logs()
    results = []
    for case in CASES:
        for ucx_mode in UCX_MODES:
            info = recv_within(conn, STEP_TIMEOUT_S)
            raw = measure_raw(case, ucx_mode, info["raw"], info["kv"]["block_nbytes"])
            results.append({"case": case.name, "ucx_error_handling_mode": ucx_mode, **asdict(case.shape),
                            "num_tokens": case.num_tokens, "raw": raw, **measure_agent(case, ucx_mode, info["kv"])})
            results[-1]["ratio_to_raw"] = round(raw["best_seconds"] / results[-1]["agent"]["median_seconds"], 3)
            conn.send("next")
    result_conn.send(results)


def measure_raw(case: Case, ucx_mode: str, raw_info: tuple[bytes, int], block_nbytes: int) -> dict:
    metadata, remote_address = raw_info
    nbytes = case.num_request_blocks * block_nbytes
    region = torch.zeros(nbytes, dtype=torch.uint8)
    agent = new_raw_agent(f"raw-reader-{case.name}-{ucx_mode}", region, ucx_mode)
    peer = agent.add_remote_agent(metadata)
    local = agent.get_xfer_descs([(region.data_ptr(), nbytes, 0)], "DRAM")
    remote = agent.get_xfer_descs([(remote_address, nbytes, 0)], "DRAM")

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


def measure_agent(case: Case, ucx_mode: str, kv_info: dict) -> dict:
    kv = new_kv(case, 0)
    agent = KVTransferAgent(f"decode-{case.name}-{ucx_mode}", kv, ucx_mode)
    agent.add_peer(**kv_info)
    remote_ids, local_ids = scattered_block_ids(case, seed=1), scattered_block_ids(case, seed=2)

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
            "block_nbytes": agent.block_nbytes, "agent": timing, "counters": counters}


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
def run_both() -> list[dict]:
    context = multiprocessing.get_context("spawn")
    holder_conn, reader_conn = context.Pipe()
    result_recv, result_send = context.Pipe(duplex=False)
    processes = [context.Process(target=run_holder, args=(holder_conn,), daemon=True),
                 context.Process(target=run_reader, args=(reader_conn, result_send), daemon=True)]
    try:
        for process in processes:
            process.start()
        return recv_within(result_recv, STEP_TIMEOUT_S * len(CASES) * len(UCX_MODES))
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()


def summarize(results: list[dict]) -> list[dict]:
    """One line per case: bytes, seconds, GB/s (1e9 bytes/s), ratio to raw."""
    return [{"case": r["case"], "ucx_error_handling_mode": r["ucx_error_handling_mode"], "bytes": r["bytes"],
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
    args = parser.parse_args()
    results = run_both()
    report = {"host": {"machine": platform.machine(), "num_cpus": multiprocessing.cpu_count(),
                       "python": platform.python_version(), "torch": torch.__version__},
              "method": __doc__.strip().splitlines()[0], "notes": NOTES, "num_timed_reads": NUM_TIMED_READS,
              "summary": summarize(results), "cases": results}
    text = json.dumps(report, indent=2)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
