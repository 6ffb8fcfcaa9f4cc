"""Benchmarks print their JSON report and, with --out, commit-ready files of it."""

from __future__ import annotations

import json


def emit(report: dict, out: str | None) -> None:
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
