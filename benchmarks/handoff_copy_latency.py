"""Why the KV hand-off between two processes on one GPU waits (issue 21, item 4): how long a ShareGPT-like prompt's KV
copy (scattered blocks, 8B shape) takes from issue to done while this process runs decode-like GEMMs and, optionally,
another process runs prefill-like GEMMs on the same GPU, by how the copy is issued.

    python -m benchmarks.handoff_copy_latency --out FILE

The NIXL READ (UCX cuda_ipc) measured 9-23 ms mean under load against ~0.03 ms of bytes (stop 52-53). Its time agrees
with NIXL's own telemetry, so it is the copy waiting on the GPU. This separates the suspects: the other context's time
slices (load "both" against "self"), and the copy's kernels queued behind this context's (stream priority; a DMA
copy of one contiguous range against a gather kernel over blocks).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time

import torch

BLOCK_TOKENS, KV_BYTES_PER_TOKEN = 16, 147_456
"""The 8B shape's KV (36 layers x 8 kv heads x 128 x 2 x bf16) per token."""
PROMPT_TOKENS = 256
OTHER_PROCESS = """
import sys, time, torch
a = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn(4096, 12288, device="cuda", dtype=torch.bfloat16)
end = time.monotonic() + float(sys.argv[1])
print("ready", flush=True)
while time.monotonic() < end:
    for _ in range(8):
        a @ b
    torch.cuda.synchronize()
"""


def decode_like_load(stop: threading.Event) -> None:
    """This process's own work: back-to-back GEMMs of a 256-row decode step's shape on the default stream."""
    x = torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 14336, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(50):
            x @ w
        torch.cuda.current_stream().synchronize()


def measure(method: str, stream: torch.cuda.Stream, repeats: int) -> list[float]:
    num_blocks = PROMPT_TOKENS // BLOCK_TOKENS
    block_elems = BLOCK_TOKENS * KV_BYTES_PER_TOKEN // 2
    pool_blocks = 4096
    src = torch.zeros(pool_blocks, block_elems, device="cuda", dtype=torch.bfloat16)
    dst = torch.zeros(pool_blocks, block_elems, device="cuda", dtype=torch.bfloat16)
    src_ids = torch.randperm(pool_blocks, device="cuda")[:num_blocks]
    dst_ids = torch.randperm(pool_blocks, device="cuda")[:num_blocks]
    latencies = []
    for _ in range(repeats):
        time.sleep(0.01)
        done = torch.cuda.Event()
        start = time.perf_counter()
        with torch.cuda.stream(stream):
            if method == "dma":  # NOTE: one contiguous range: cudaMemcpyAsync device to device
                dst[:num_blocks].copy_(src[:num_blocks])
            else:  # NOTE: a gather kernel over scattered blocks
                dst.index_copy_(0, dst_ids, src.index_select(0, src_ids))
            done.record(stream)
        while not done.query():
            time.sleep(0.0001)
        latencies.append(1e3 * (time.perf_counter() - start))
    return latencies


def summary(latencies: list[float]) -> dict:
    ordered = sorted(latencies)
    return {"p50_ms": round(statistics.median(ordered), 3), "p90_ms": round(ordered[int(0.9 * len(ordered))], 3),
            "max_ms": round(ordered[-1], 3), "mean_ms": round(statistics.fmean(ordered), 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    low, high = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=torch.cuda.Stream.priority_range()[1])
    report = {"gpu": torch.cuda.get_device_name(), "prompt_tokens": PROMPT_TOKENS, "runs": []}
    for load in ("none", "self", "both"):
        other = None
        if load == "both":
            other = subprocess.Popen([sys.executable, "-c", OTHER_PROCESS, "60"], stdout=subprocess.PIPE, text=True)
            assert other.stdout.readline().strip() == "ready"
        stop = threading.Event()
        worker = threading.Thread(target=decode_like_load, args=(stop,), daemon=True)
        if load != "none":
            worker.start()
            time.sleep(0.5)
        for method in ("dma", "gather"):
            for name, stream in (("normal", low), ("high", high)):
                run = {"load": load, "method": method, "priority": name,
                       **summary(measure(method, stream, args.repeats))}
                report["runs"].append(run)
                print(json.dumps(run), flush=True)
        stop.set()
        if worker.is_alive():
            worker.join()
        if other is not None:
            other.kill()
            other.wait()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
