"""`python -m benchmarks.trace_host_ops TRACE.json.gz`: what the host did during one prefill of a prefill_gaps trace.

For the --window-th CPU range named prefill_window (benchmarks/prefill_gaps.py --trace) it prints, in µs from the
range's start, the first GPU operation, the first kernel and the end of the last GPU operation, then each top-level
CPU operation longer than --min-us (torch ops and CUDA runtime calls, nested ones folded into the op that holds them).
"""

from __future__ import annotations

import argparse
import gzip
import json

from benchmarks.prefill_gaps import WINDOW


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trace", help="a Chrome trace from benchmarks.prefill_gaps --trace (gzipped)")
    parser.add_argument("--window", type=int, default=1, help="which prefill (0: the first traced)")
    parser.add_argument("--min-us", type=float, default=4.0)
    args = parser.parse_args()
    with gzip.open(args.trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    windows = sorted((e for e in events if e.get("name") == WINDOW and e.get("cat") == "user_annotation"),
                     key=lambda e: e["ts"])
    window = windows[args.window]
    start, end = window["ts"], window["ts"] + window["dur"]
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy") and start <= e["ts"] <= end),
                 key=lambda e: e["ts"])
    first_kernel = next(e for e in gpu if e["cat"] == "kernel")
    print(f"window {window['dur']:.1f} us; first GPU op {gpu[0]['ts'] - start:.1f} ({gpu[0]['name'][:40]}); "
          f"first kernel {first_kernel['ts'] - start:.1f}; last GPU op ends "
          f"{max(e['ts'] + e['dur'] for e in gpu) - start:.1f}")
    host = sorted((e for e in events if e.get("cat") in ("cpu_op", "cuda_runtime") and start <= e["ts"] <= end),
                  key=lambda e: e["ts"])
    covered_until = float("-inf")
    for event in host:
        if event["ts"] < covered_until:
            continue  # NOTE: nested in the op printed before it
        covered_until = event["ts"] + event["dur"]
        if event["dur"] > args.min_us:
            print(f"  {event['ts'] - start:9.1f}  {event['name'][:60]:60s} {event['dur']:8.1f}")


if __name__ == "__main__":
    main()
