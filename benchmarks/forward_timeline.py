"""`python -m benchmarks.forward_timeline LOG REPORT`: a node's prefill forwards in a served run, on the run's clock.

LOG holds the node's lines of a run with --log-prefill-batches (NodeSettings.log_prefill_batches; `python -m
benchmarks.prefix_cache --paths http --log-prefill-batches` writes them to its output); REPORT is that run's JSON,
whose rows carry started_at_monotonic (the instant its clients started, on the same host's monotonic clock). For each
workload row, prints the client's TTFT p50, then each forward that ran in its window: start and end in seconds from
the run's start, its prompts (new, finishing, and finished so far), tokens, cached tokens, decode rows and queue:
the forward after which half the requests had their first token is where the p50 falls.
"""

from __future__ import annotations

import argparse
import json
import re

LINE = re.compile(r"prefill forward at ([\d.]+) \(monotonic\) took ([\d.]+) ms: #seq (\d+) \((\d+) new, (\d+) "
                  r"finishing\), #token (\d+), #cached-token (\d+), #decode-row (\d+), #queue-req (\d+)")


def forwards(log_path: str) -> list[dict]:
    with open(log_path, errors="replace") as f:
        return forwards_in(f)


def forwards_in(lines) -> list[dict]:
    """The prefill forward lines among lines (a node's log), each as a dict: at (monotonic s), ms and the counts."""
    keys = ("seq", "new", "finishing", "tokens", "cached_tokens", "decode_rows", "queue")
    found = (LINE.search(line) for line in lines)
    return [{"at": float(m[1]), "ms": float(m[2]), **dict(zip(keys, map(int, m.groups()[2:]), strict=True))}
            for m in found if m]


def rows(report: dict):
    """(mode, workload, row) of every row of the report's HTTP runs (or of a `corun bench --url` report)."""
    modes = report.get("http", report).get("modes", {})
    for mode, workloads in modes.items():
        for workload, row in workloads.items():
            if "started_at_monotonic" in row:
                yield mode, workload, row


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.forward_timeline", description=__doc__.split("\n")[0])
    parser.add_argument("log")
    parser.add_argument("report")
    args = parser.parse_args()
    with open(args.report) as f:
        report = json.load(f)
    every = forwards(args.log)
    for mode, workload, row in rows(report):
        start = row["started_at_monotonic"]
        end = start + row["seconds"]
        print(f"{mode} {workload}: TTFT p50 {row['ttft_s']['p50']} s, {row['num_requests']} requests, "
              f"run {row['seconds']} s")
        finished = 0
        # NOTE: from the last forward still running at the start (the warm-up's, before it)
        for forward in (f for f in every if f["at"] + f["ms"] / 1e3 > start and f["at"] <= end):
            finished += forward["finishing"]
            print(f"  {forward['at'] - start:7.3f} -> {forward['at'] - start + forward['ms'] / 1e3:7.3f} s: "
                  f"#seq {forward['seq']} ({forward['new']} new, {forward['finishing']} finishing, {finished} so far), "
                  f"#token {forward['tokens']}, #cached {forward['cached_tokens']}, #decode-row "
                  f"{forward['decode_rows']}, #queue {forward['queue']}")


if __name__ == "__main__":
    main()
