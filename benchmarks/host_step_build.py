"""`python benchmarks/host_step_build.py --out FILE`: host time to build a step's inputs, no model, no GPU.

Medians over --repeats of: build_prefill_pack for a lone 64-token and 4,096-token prompt (the rows and sequences of
the CUDA defaults' pack at those lengths: 64 and 4,096 rows, 64 sequences, block tables 384 blocks wide), and the
decode block table of 256 rows (200 of them requests). Where the tree has them, also a 64-row pack's load into its
graph's static inputs (DeviceBlock) and read_back of a token and its logprob, both on the CPU.

Run as a file, not `-m`, so that PYTHONPATH picks the tree measured (e.g. PYTHONPATH=.gl/before for an older one).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from corun.request import Request
from corun.scheduler import PrefillChunk
from corun.step_inputs import BlockTableRows, build_prefill_pack
from wire.sampling_params import SamplingParams

WINDOW_BLOCKS, BLOCK_SIZE, PACK_SEQS = 384, 16, 64


def median_us(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(1e6 * statistics.median(times), 1)


def request(name: str, length: int) -> Request:
    r = Request.create(name, list(range(length)), SamplingParams(max_tokens=4), 1, frozenset())
    r.block_ids = list(range(1, length // BLOCK_SIZE + 2))
    r.output_token_ids = [5]
    return r


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=500)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = BlockTableRows(WINDOW_BLOCKS)
    result = {"host": platform.processor() or platform.machine(), "repeats": args.repeats, "us": {}}
    for length in (64, 4096):
        chunks = [PrefillChunk(request(f"p{length}", length), 0, length)]
        result["us"][f"build_prefill_pack_{length}"] = median_us(
            lambda chunks=chunks, length=length: build_prefill_pack(chunks, length, PACK_SEQS, BLOCK_SIZE, rows),
            args.repeats)
    decoding = [request(f"d{i}", 100) for i in range(200)]
    result["us"]["decode_block_table_256"] = median_us(lambda: rows.table(decoding, 256), args.repeats)
    pack = build_prefill_pack([PrefillChunk(request("l", 64), 0, 64)], 64, PACK_SEQS, BLOCK_SIZE, rows)
    empty = build_prefill_pack([], 64, PACK_SEQS, BLOCK_SIZE, rows)
    if hasattr(empty, "to_static"):
        static = empty.to_static("cpu")
        result["us"]["pack_64_load_into_static"] = median_us(lambda: pack.copy_to(static), args.repeats)
    try:
        from corun.device_copies import read_back
    except ImportError:
        read_back = None
    if read_back is not None:
        sampled = [torch.tensor([7]), torch.tensor([-1.5])]
        result["us"]["read_back_token_and_logprob"] = median_us(
            lambda: [t.tolist() for t in read_back(sampled)], args.repeats)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
