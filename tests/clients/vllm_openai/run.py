"""Runs vLLM's OpenAI-server tests (tests/clients/vllm_openai/vendored, see populate.py) against `corun serve` on
the tiny model, in a child pytest; prints each test's outcome (with the classification of each failure from
exclusions.py) and a summary, and writes them as JSON.

    .venv/bin/python -m tests.clients.vllm_openai.run [--json benchmarks/results/cpu_vllm_openai_tests.json] [-k EXPR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from tests.clients.vllm_openai import exclusions, populate

REPO_ROOT = Path(__file__).resolve().parents[3]
MODEL_NAMES = ("facebook/opt-125m", "HuggingFaceH4/zephyr-7b-beta", "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
               "HuggingFaceTB/SmolVLM-256M-Instruct", "hmellor/tiny-random-LlamaForCausalLM", "Qwen/Qwen3-0.6B")
"""The checkpoints the vendored tests name: each is served as (and its tokenizer resolves to) the tiny model."""
CHILD_TIMEOUT_S = 900
SERVED_CONTEXT = 8192
"""The tiny model's context here (its own is 2,048): the longest --max-model-len a vendored test gives
(test_tokenization's 8192, for zephyr-7b, whose context is 32k), which the engine, like vLLM, refuses beyond the
model's."""


def hf_cache_of_names(model_dir: Path, cache: Path) -> None:
    """An offline Hugging Face cache where every name of MODEL_NAMES is the tiny model's snapshot, so that the
    tests' AutoTokenizer.from_pretrained(name) gets the served model's tokenizer."""
    for name in MODEL_NAMES:
        repo = cache / ("models--" + name.replace("/", "--"))
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text("corun-tiny")
        snapshot = repo / "snapshots" / "corun-tiny"
        snapshot.parent.mkdir(exist_ok=True)
        if not snapshot.exists():
            snapshot.symlink_to(model_dir, target_is_directory=True)


def run_child(work: Path, pytest_args: list[str], server_repo: Path) -> tuple[Path, str, float]:
    from corun.models.tiny import make_tiny_model

    model_dir = Path(make_tiny_model(work / "tiny", max_position_embeddings=SERVED_CONTEXT))
    hf_cache_of_names(model_dir, work / "hf")
    env = {**os.environ, "CORUN_REPO_ROOT": str(REPO_ROOT), "CORUN_SERVER_REPO": str(server_repo),
           "CORUN_TINY_MODEL_DIR": str(model_dir),
           "CORUN_SERVER_LOG_DIR": str(work), "HF_HUB_CACHE": str(work / "hf"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1",
           # NOTE: the vendored root first: its `tests` package (vLLM's layout, with the shims) hides CoRun's
           "PYTHONPATH": os.pathsep.join([str(populate.VENDORED), str(REPO_ROOT)])}
    report = work / "junit.xml"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rN", f"--junitxml={report}",
            "-o", "junit_family=xunit2", "--rootdir", str(populate.VENDORED),
            "-c", str(populate.VENDORED / "pytest.ini"),
            "--timeout", "120", "tests/entrypoints", *pytest_args]
    start = time.monotonic()
    done = subprocess.run(argv, cwd=populate.VENDORED, env=env, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S)
    return report, done.stdout + done.stderr, time.monotonic() - start


def outcomes(report: Path) -> list[dict]:
    """One row per test: nodeid, outcome (passed / failed / excluded / skipped), message, and for a failure its
    classification (exclusions.FAILURES)."""
    rows = []
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        nodeid = f"{path}::{case.get('name')}"
        failure = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            message = (failure.get("message") or "").splitlines()[0][:200] if failure.get("message") else ""
            kind, reason = exclusions.classify(nodeid)
            rows.append({"nodeid": nodeid, "outcome": "failed", "message": message, "kind": kind, "reason": reason})
        elif skipped is not None:
            message = skipped.get("message") or ""
            outcome = "excluded" if "excluded: " in message else "skipped"
            rows.append({"nodeid": nodeid, "outcome": outcome, "message": message.split("excluded: ")[-1][:200]})
        else:
            rows.append({"nodeid": nodeid, "outcome": "passed"})
    return rows


def summary(rows: list[dict]) -> dict:
    counts = {outcome: sum(r["outcome"] == outcome for r in rows) for outcome in ("passed", "failed", "excluded",
                                                                                    "skipped")}
    kinds = {}
    for row in rows:
        if row["outcome"] == "failed":
            kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
    return {**counts, "failed_by_kind": kinds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the outcomes here")
    parser.add_argument("--server-repo", type=Path, default=REPO_ROOT,
                        help="the checkout whose `corun serve` is tested (default: this one)")
    parser.add_argument("--log", type=Path, help="write the child pytest's output here")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    if populate.missing():
        print(f"vLLM's files missing from upstream/ (python -m tests.clients.vllm_openai.populate --refetch): "
              f"{populate.missing()}")
        return 2
    populate.lay_out()
    with tempfile.TemporaryDirectory(prefix="corun-vllm-tests-") as work:
        report, output, seconds = run_child(Path(work), args.pytest_args, args.server_repo.resolve())
        if args.log:
            args.log.write_text(output)
        if not report.exists():
            print(output[-6000:])
            return 2
        rows = outcomes(report)
    for row in rows:
        detail = f"  [{row['kind']}] {row['reason'] or row['message']}" if row["outcome"] == "failed" else (
            f"  {row['message']}" if row["outcome"] in ("excluded", "skipped") else "")
        print(f"{row['outcome'].upper():8} {row['nodeid']}{detail}")
    totals = summary(rows)
    ran = totals["passed"] + totals["failed"]
    print(f"\n{totals['passed']} passed of {ran} run ({totals['excluded']} excluded, {totals['skipped']} skipped) "
          f"in {seconds:.0f} s; failures by kind: {totals['failed_by_kind']}")
    if args.json:
        command = "python -m tests.clients.vllm_openai.run " + " ".join(argv if argv is not None else sys.argv[1:])
        Path(args.json).write_text(json.dumps({"command": command, "summary": totals, "seconds": round(seconds, 1),
                                               "sources": populate.sources(), "tests": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
